"""``lead migrate {plan,calibrate,apply,verify}``: the command line of :mod:`lead.migrate`.

Each command prints one JSON object on stdout (``apply``'s is its final line, with the rows
written); progress and messages go to stderr. Exit status: 0 done (``verify`` and
``calibrate``: passed / go), 1 ``verify`` failed or ``calibrate`` said no-go, 2 a LEAD error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lead.errors import InvalidInputError

__all__ = ["add_migrate_commands"]


def _print(value: dict[str, Any]) -> None:
    print(json.dumps(value, indent=None, default=str))


def _stitch_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--stitch",
        required=required,
        metavar="ID_OR_FOLDER_OR_HUB_REPO",
        help="a bundled stitch id (minilm-to-mpnet), a stitch folder, a Hub repo id "
        "(org/name[@revision]), or with --server a stitch id the server serves",
    )
    parser.add_argument("--inverse", action="store_true", help="run an invertible stitch backwards")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise the output rows")
    parser.add_argument("--device", default=None, help="cpu (default) or cuda, in-process")
    parser.add_argument(
        "--server",
        metavar="URL",
        help="translate through this running LEAD server instead of in-process "
        "(API key from LEAD_API_KEY)",
    )
    parser.add_argument(
        "--skip-null",
        action="store_true",
        help="leave rows whose vector is NULL out of the target (by default they are refused)",
    )


def _translator(args: argparse.Namespace) -> Any:
    from lead.migrate.translator import make_translator

    return make_translator(
        args.stitch,
        server=args.server,
        inverse=args.inverse,
        normalize=args.normalize,
        device=args.device,
    )


def _plan(args: argparse.Namespace) -> int:
    from lead.migrate.plan import run_plan
    from lead.migrate.registry import open_source

    translator = _translator(args)
    try:
        with open_source(args.source) as source:
            result = run_plan(
                source,
                translator,
                skip_null=args.skip_null,
                output_type=args.output_type,
                check=not args.no_check,
            )
    finally:
        translator.close()
    _print(result.as_dict())
    return 0 if result.ok else 1


def _apply(args: argparse.Namespace) -> int:
    from lead import migrate

    if args.batch_size < 1:
        raise InvalidInputError("--batch-size must be at least 1", param="batch_size")
    if args.engine == "ray":
        from lead.migrate.ray_engine import run_apply_ray

        if args.server:
            raise InvalidInputError("--engine ray translates in its workers; drop --server")
        result = run_apply_ray(
            args.source,
            args.target,
            args.stitch,
            batch_size=args.batch_size,
            partitions=args.partitions,
            address=args.ray_address,
            inverse=args.inverse,
            normalize=args.normalize,
            skip_null=args.skip_null,
            progress=not args.quiet,
        )
    else:
        result = migrate.apply(
            args.source,
            args.target,
            args.stitch,
            server=args.server,
            batch_size=args.batch_size,
            inverse=args.inverse,
            normalize=args.normalize,
            skip_null=args.skip_null,
            device=args.device,
            progress=not args.quiet,
        )
    _print(result.as_dict())
    return 0


def add_migrate_commands(commands: Any) -> None:
    """Add ``migrate {plan,calibrate,apply,verify}`` to the ``lead`` subcommand parsers."""
    migrate = commands.add_parser(
        "migrate",
        help="migrate a vector store to a new embedding model (plan, calibrate, apply, verify)",
        description="Translate a vector store (PostgreSQL + pgvector, Qdrant, Parquet, .npy, "
        ".safetensors) into a new model's space: plan, calibrate a stitch, apply it into a "
        "new column / table / collection / folder, verify. Store URIs: "
        "postgresql://user@host:port/db?table=T&column=C&id=ID, "
        "qdrant://host:port/collection?vector=NAME (qdrant:///path/collection locally), "
        "or a file path.",
    )
    steps = migrate.add_subparsers(dest="step", metavar="STEP", required=True)

    plan = steps.add_parser("plan", help="what the source holds and what the migration costs")
    plan.add_argument("source", metavar="SOURCE_URI")
    _stitch_arguments(plan)
    plan.add_argument(
        "--output-type",
        choices=("vector", "halfvec", "float32", "float16"),
        default="vector",
        help="how the target will store values (for the size estimate)",
    )
    plan.add_argument(
        "--no-check",
        action="store_true",
        help="skip the full check of the source (NULL / NaN / duplicate ids)",
    )
    plan.set_defaults(handler=_plan)

    apply = steps.add_parser(
        "apply",
        help="translate every vector into a new target (resumable; re-running is a no-op)",
    )
    apply.add_argument("source", metavar="SOURCE_URI")
    apply.add_argument("target", metavar="TARGET_URI")
    _stitch_arguments(apply)
    apply.add_argument("--batch-size", type=int, default=8192, help="rows per batch (8192)")
    apply.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local (default): this process; ray: a Ray Data pipeline on a Ray cluster",
    )
    apply.add_argument("--ray-address", help="Ray cluster address (default: start Ray locally)")
    apply.add_argument("--partitions", type=int, help="--engine ray: number of partitions")
    apply.add_argument("--quiet", action="store_true", help="no progress bar")
    apply.set_defaults(handler=_apply)
