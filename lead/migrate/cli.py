"""``lead migrate {plan,calibrate,apply,verify}``: the command line of :mod:`lead.migrate`.

Each command prints one JSON object on stdout (``apply``'s is its final line, with the rows
written); progress and messages go to stderr. Exit status: 0 done (``verify`` and
``calibrate``: passed / go), 1 ``verify`` failed or ``calibrate`` said no-go, 2 a LEAD error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lead._options import FIT_METHODS_HELP, seed_argument
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
        help="translate through this running LEAD server instead of in-process",
    )
    parser.add_argument(
        "--api-key",
        help="with --server: its API key (default LEAD_API_KEY)",
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
        api_key=args.api_key,
    )


def _plan(args: argparse.Namespace) -> int:
    from lead import migrate

    translator = _translator(args)
    try:
        result = migrate.plan(
            args.source,
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
        if args.confidence_column is not None:
            raise InvalidInputError(
                "--confidence-column is not available with --engine ray yet; drop one of them",
                param="confidence_column",
            )
        result = run_apply_ray(
            args.source,
            args.target,
            args.stitch,
            batch_size=args.batch_size,
            partitions=args.partitions,
            address=args.ray_address,
            num_gpus=args.num_gpus,
            workers=args.workers,
            inverse=args.inverse,
            normalize=args.normalize,
            skip_null=args.skip_null,
            allow_no_go=args.allow_no_go,
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
            allow_no_go=args.allow_no_go,
            device=args.device,
            progress=not args.quiet,
            confidence_column=args.confidence_column,
            api_key=args.api_key,
        )
    _print(result.as_dict())
    return 0


def _queries(args: argparse.Namespace) -> Any:
    """:class:`~lead.migrate.quality.RetrievalQueries` from ``--queries`` / ``--qrels``."""
    if args.queries is None and args.qrels is None:
        if args.source_queries is not None:
            raise InvalidInputError("--source-queries needs --queries and --qrels")
        return None
    if args.queries is None or args.qrels is None:
        raise InvalidInputError("--queries and --qrels go together", param="queries")
    import numpy as np

    from lead.migrate.quality import RetrievalQueries
    from lead.migrate.registry import open_source

    with open_source(args.queries) as store:
        parts = list(store.batches(65536))
    ids = [str(i) for p in parts for i in p.ids.tolist()]
    target = np.concatenate([p.vectors for p in parts]) if parts else np.empty((0, 0))
    source = None
    if args.source_queries is not None:
        with open_source(args.source_queries) as store:
            keys = parts[0].ids if len(parts) == 1 else np.concatenate([p.ids for p in parts])
            source = store.fetch(keys)
    return RetrievalQueries(target, ids, read_qrels(args.qrels), source)


def read_qrels(path: str) -> dict[str, dict[str, int]]:
    """Relevance judgments from a BEIR ``qrels/*.tsv`` (``query-id corpus-id score``, with a
    header) or a JSON file ``{query_id: {doc_id: grade}}``.

    Raises
    ------
    InvalidInputError
        A missing file, or a line that is not three tab-separated fields with an integer
        score.
    """
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"no such qrels file: {path}", param="qrels")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"{path} is not text: give a BEIR qrels .tsv or a JSON file", param="qrels"
        ) from None
    if file.suffix.lower() == ".json":
        try:
            loaded = json.loads(text)
            return {str(q): {str(d): int(g) for d, g in docs.items()} for q, docs in loaded.items()}
        except (ValueError, AttributeError, TypeError, RecursionError) as error:
            raise InvalidInputError(f"{path}: not a JSON qrels object ({error!r})") from None
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("\t")
        if not line.strip() or (number == 1 and fields[-1].strip() == "score"):
            continue
        try:
            query, doc, grade = fields
            qrels.setdefault(query.strip(), {})[doc.strip()] = int(grade)
        except ValueError:
            raise InvalidInputError(
                f"{path} line {number}: expected query-id<TAB>corpus-id<TAB>integer score",
                param="qrels",
            ) from None
    return qrels


def _thresholds(args: argparse.Namespace) -> dict[str, float]:
    names = ("min_r2", "min_mean_cosine", "min_top1", "min_retention")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _gate_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "gates",
        "defaults: R² > 0, mean cosine above the mean estimator's, top-1 >= 0.5, and with "
        "--queries nDCG@10 retention >= 0.8 of the bound",
    )
    group.add_argument("--min-r2", dest="min_r2", type=float, metavar="X")
    group.add_argument("--min-mean-cosine", dest="min_mean_cosine", type=float, metavar="X")
    group.add_argument("--min-top1", dest="min_top1", type=float, metavar="X")
    group.add_argument(
        "--min-retention",
        dest="min_retention",
        type=float,
        metavar="X",
        help="translated nDCG@10 / min(source-native, target-native) (needs --queries)",
    )
    group.add_argument(
        "--queries",
        metavar="URI",
        help="the queries embedded by the new model: a store whose ids are the query ids",
    )
    group.add_argument(
        "--source-queries",
        metavar="URI",
        help="the same queries embedded by the old model (source-native half of the bound)",
    )
    group.add_argument(
        "--qrels", metavar="FILE", help="relevance judgments: BEIR qrels .tsv, or JSON"
    )
    parser.add_argument(
        "--sample",
        type=int,
        help="ids drawn at random from those in both stores (calibrate --embed: from the source)",
    )
    parser.add_argument("--seed", type=seed_argument, default=0)


def _calibrate(args: argparse.Namespace) -> int:
    from lead._options import parse_option_items
    from lead.confidence import NO_CONFIDENCE_KEY
    from lead.migrate.calibrate import run_calibrate

    if (args.native is None) == (args.embed is None):
        raise InvalidInputError(
            "give NATIVE_URI (the new model's vectors) or --embed MODEL (embed the source's "
            "texts with the new model), not both"
            if args.native is not None
            else "give NATIVE_URI (the new model's vectors for some ids), or --embed MODEL to "
            "embed a sample of the source's texts with the new model",
            param="native",
        )
    if args.embed is None and (args.text_column is not None or args.save_native is not None):
        raise InvalidInputError("--text-column and --save-native go with --embed", param="embed")
    result = run_calibrate(
        args.source,
        args.native,
        args.stitch,
        method=args.method,
        options=parse_option_items(args.option),
        sample=args.sample if args.sample is not None else 2000,
        holdout=args.holdout,
        seed=args.seed,
        source_model=args.source_model,
        target_model=args.target_model,
        queries=_queries(args),
        thresholds=_thresholds(args),
        force=args.force,
        embed_model=args.embed,
        text_column=args.text_column or "text",
        save_native=args.save_native,
    )
    _print(_without_id_lists(result.as_dict()))
    reason = result.fit.get(NO_CONFIDENCE_KEY)
    if isinstance(reason, str):  # as lead fit says it: apply --confidence-column needs one
        sys.stderr.write(
            f"note: no confidence head ({reason}); give more native rows or raise "
            "--holdout to get one\n"
        )
    return 0 if result.passed else 1


#: Keys of calibrate's record whose lists are printed as their length (and what they hold).
_LONG_LISTS = {"ids": "ids", "fitted_ids": "ids", "target_train_mean": "values"}


def _without_id_lists(value: Any) -> Any:
    """``value`` with long lists (held-out and fitted ids, the training mean) replaced by
    their length: they are in the stitch's config.json; one JSON line on stdout stays
    readable."""
    if isinstance(value, dict):
        return {
            k: f"{len(v)} {_LONG_LISTS[k]} (in config.json)"
            if k in _LONG_LISTS and isinstance(v, list)
            else _without_id_lists(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_without_id_lists(v) for v in value]
    return value


def _verify(args: argparse.Namespace) -> int:
    from lead.artifacts import stitch_folder
    from lead.migrate import verify
    from lead.migrate.calibrate import fitted_ids

    # a folder, a bundled id or a Hub repo, as apply takes it (only calibrate's stitches
    # record fitted ids: for the others nothing is left out of the sample)
    folder = stitch_folder(args.stitch) if args.stitch else None
    if folder and not fitted_ids(folder):
        print(
            f"note: {args.stitch} records no ids of a store it was fitted on (only stitches "
            "made by `lead migrate calibrate` do), so nothing is left out of the sample: "
            "native vectors of texts it was fitted on would flatter the figures",
            file=sys.stderr,
        )
    result = verify(
        args.source,
        args.target,
        args.native,
        stitch=folder,
        sample=args.sample if args.sample is not None else 1000,
        seed=args.seed,
        queries=_queries(args),
        thresholds=_thresholds(args),
        report_dir=args.report,
        junit=args.junit,
    )
    _print(result.as_dict())
    return int(result.exit_code)


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

    calibrate = steps.add_parser(
        "calibrate",
        help="fit a stitch on the ids that have the new model's vectors too; go / no-go",
    )
    calibrate.add_argument("source", metavar="SOURCE_URI")
    calibrate.add_argument(
        "native",
        metavar="NATIVE_URI",
        nargs="?",
        help="the new model's vectors for some of the ids (or use --embed)",
    )
    calibrate.add_argument(
        "--embed",
        metavar="MODEL",
        help="instead of NATIVE_URI: embed the texts of --sample random ids of the source "
        "with this sentence-transformers model (a folder, or a Hub id in the local cache; "
        "never downloaded); needs pip install 'lead-stitch[embed]'",
    )
    calibrate.add_argument(
        "--text-column",
        metavar="NAME",
        help="--embed: the column (Parquet, PostgreSQL) or payload field (Qdrant) holding "
        "each row's text (default: text)",
    )
    calibrate.add_argument(
        "--save-native",
        metavar="FILE",
        help="--embed: keep the embedded sample as a Parquet file (id, embedding), a "
        "--native store for verify",
    )
    calibrate.add_argument(
        "--stitch", required=True, metavar="FOLDER", help="where the fitted stitch is saved"
    )
    calibrate.add_argument(
        "--method",
        default="ridge",
        help=f"{FIT_METHODS_HELP} (as lead fit)",
    )
    calibrate.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method option (JSON value)",
    )
    calibrate.add_argument("--holdout", type=float, default=0.2, help="held-out fraction")
    calibrate.add_argument("--source-model", help="recorded in the stitch (the old model's id)")
    calibrate.add_argument("--target-model", help="recorded in the stitch (the new model's id)")
    calibrate.add_argument(
        "--force", action="store_true", help="replace an existing --stitch folder"
    )
    _gate_arguments(calibrate)
    calibrate.set_defaults(handler=_calibrate)

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
    apply.add_argument("--workers", type=int, help="--engine ray: actors translating at once")
    apply.add_argument(
        "--num-gpus",
        type=float,
        help="--engine ray: GPUs per actor (the stitch then runs on CUDA in each actor)",
    )
    apply.add_argument(
        "--confidence-column",
        metavar="NAME",
        help="also write each row's confidence (float32 in [0, 1]; the stitch needs a "
        "confidence head): a real column of the pgvector table, a payload field of the "
        "Qdrant points, a column of the Parquet parts",
    )
    apply.add_argument("--quiet", action="store_true", help="no progress bar")
    apply.add_argument(
        "--allow-no-go",
        action="store_true",
        help="use a stitch that calibrate judged no-go (refused by default)",
    )
    apply.set_defaults(handler=_apply)

    verify = steps.add_parser(
        "verify",
        help="compare translated with native vectors; JSON + Markdown report, JUnit; exit 1 "
        "under a gate",
    )
    verify.add_argument("source", metavar="SOURCE_URI", help="the migrated store (for the bound)")
    verify.add_argument("target", metavar="TARGET_URI", help="the translated store")
    verify.add_argument(
        "--native", required=True, metavar="URI", help="the new model's vectors for some ids"
    )
    verify.add_argument(
        "--stitch",
        metavar="ID_OR_FOLDER",
        help="the stitch applied (a folder, a bundled id, a Hub repo id): a sample of source "
        "rows is translated again and compared with the target (rows replaced or edited "
        "since fail); one made by calibrate has the ids it was fitted on left out of the "
        "sample, so the figures are held-out ones",
    )
    verify.add_argument(
        "--report",
        default="lead-verify",
        metavar="DIR",
        help="report folder (default ./lead-verify): report.json, report.md, a histogram",
    )
    verify.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    _gate_arguments(verify)
    verify.set_defaults(handler=_verify)
