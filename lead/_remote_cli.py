"""``lead`` subcommands that talk to a LEAD server: ``datasets``, ``jobs``, ``stitches``,
``align``.

::

    lead datasets upload pairs.safetensors --name scifact
    lead jobs submit --dataset ds_... --source-model minilm --target-model e5 --wait
    lead jobs submit --source minilm.safetensors:corpus --target e5.safetensors:corpus \\
        --source-model minilm --target-model e5 --method mlp --option max_epochs=30
    lead jobs wait job_...            # progress bar on stderr; exit 0 only if it succeeded
    lead jobs list | lead jobs get job_... | lead jobs cancel job_...
    lead stitches list | lead stitches get ID
    lead stitches download ID --out DIR   # config.json, model.safetensors, README.md
    lead stitches delete ID               # a stitch trained by a job (an admin key)
    lead align --source a.npy --target b.npy                # local
    lead align --server http://host:8000 --dataset ds_...   # on the server

The server comes from ``--server`` or ``LEAD_SERVER_URL``, the key from ``--api-key`` or
``LEAD_API_KEY``. Results are JSON on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

import httpx

from lead._options import (
    FIT_METHODS_HELP,
    open_fraction_argument,
    parse_option_items,
    seconds_argument,
    seed_argument,
    text_argument,
)
from lead.client import DEFAULT_SERVER_URL, LeadClient
from lead.errors import AuthenticationError, StoreError

__all__ = ["add_remote_commands", "connect"]


#: Longest dataset name the server keeps (``?name=``).
_NAME_LIMIT = 200


def connect(args: argparse.Namespace) -> LeadClient:
    """The client for ``--server`` / ``--api-key`` (tests replace this function)."""
    return LeadClient(args.server, api_key=args.api_key)


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2


def _remote(handler: Any) -> Any:
    """Run ``handler(client, args)``; an unreachable server is an error (exit status 2)."""

    def run(args: argparse.Namespace) -> int:
        try:
            with connect(args) as client:
                return int(handler(client, args))
        except (httpx.TransportError, StoreError) as error:
            cause = error if isinstance(error, httpx.TransportError) else error.__cause__
            if not isinstance(cause, httpx.TransportError):  # a vector store's, not ours
                raise
            if args.server:
                where = f"{args.server} (--server)"
            elif os.environ.get("LEAD_SERVER_URL"):
                where = f"{os.environ['LEAD_SERVER_URL']} (LEAD_SERVER_URL)"
            else:
                where = f"{DEFAULT_SERVER_URL} (the default: set --server or LEAD_SERVER_URL)"
            return _fail(f"cannot reach the LEAD server at {where}: {cause}")
        except AuthenticationError as error:
            if args.api_key or os.environ.get("LEAD_API_KEY"):
                raise
            return _fail(f"{error} (the CLI sends the key from --api-key or LEAD_API_KEY)")

    return run


def _upload(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.upload_dataset(args.file, name=args.name))
    return 0


def _list_datasets(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.list_datasets(limit=args.limit, after=args.after))
    return 0


def _delete_dataset(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.delete_dataset(args.id))
    return 0


def _wait(client: LeadClient, job_id: str, interval: float, timeout: float | None) -> int:
    from tqdm import tqdm

    bar: Any = None
    stage: str | None = None

    def show(job: dict[str, Any]) -> None:
        nonlocal bar, stage
        progress = job["progress"]
        if progress["stage"] != stage and progress["total"]:
            if bar is not None:
                bar.close()
            stage = progress["stage"]
            # opened at the step already reached (a job seen first when done shows 1/1, not
            # 0% then a jump), and without a rate: polls say nothing of the job's speed
            bar = tqdm(
                total=progress["total"],
                initial=min(progress["step"], progress["total"]),
                desc=f"{job['id']} {stage}",
                file=sys.stderr,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
            )
        if bar is not None:
            bar.total = progress["total"] or bar.total  # lowered when training stops early
            bar.n = min(progress["step"], bar.total)
            bar.set_postfix_str(job["status"], refresh=True)

    try:
        job = client.wait_job(job_id, poll_interval=interval, timeout=timeout, on_update=show)
    finally:
        if bar is not None:
            bar.close()
    _print(job)
    result = job.get("result") or {}
    if result.get("served") is False:
        sys.stderr.write(
            f"warning: stitch {result['stitch_id']} is not served: {result['not_served_reason']}\n"
        )
    return 0 if job["status"] == "succeeded" else 1


def _submit(client: LeadClient, args: argparse.Namespace) -> int:
    from lead.data import read_embeddings

    dataset = args.dataset
    options = parse_option_items(args.option)  # a bad --option before any upload
    uploaded = None
    if dataset is not None and (args.source or args.target):  # the files were ignored
        return _fail("give --dataset, or --source and --target files, not both")
    if dataset is None:
        if not (args.source and args.target):
            return _fail("give --dataset, or --source and --target files")
        source, target = read_embeddings(args.source), read_embeddings(args.target)
        name = f"{args.source_model} -> {args.target_model}"[:_NAME_LIMIT]
        dataset = uploaded = client.upload_pairs(
            source,
            target,
            name=name,
            source_model=args.source_model,
            target_model=args.target_model,
        )["id"]
    try:
        job = client.submit_job(
            args.source_model,
            args.target_model,
            dataset=dataset,
            method=args.method,
            options=options,
            holdout_fraction=args.holdout,
            seed=args.seed,
            push_to_hub=args.push_to_hub,
            stitch_id=args.stitch_id,
            allow_below_baseline=args.allow_below_baseline,
            idempotency_key=args.idempotency_key,
        )
    except Exception:
        # a refused job leaves no dataset behind (each retry uploaded one more); a job
        # the server took after all keeps its dataset (deleting it is refused then)
        if uploaded is not None:
            with contextlib.suppress(Exception):
                client.delete_dataset(uploaded)
        raise
    if args.wait:
        return _wait(client, job["id"], args.interval, None)
    _print(job)
    return 0


def _get_job(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.get_job(args.id))
    return 0


def _list_jobs(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.list_jobs(limit=args.limit, after=args.after, status=args.status))
    return 0


def _cancel_job(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.cancel_job(args.id))
    return 0


def _wait_job(client: LeadClient, args: argparse.Namespace) -> int:
    return _wait(client, args.id, args.interval, args.timeout)


def _list_stitches(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.list_stitches())
    return 0


def _get_stitch(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.get_stitch(args.id))
    return 0


def _delete_stitch(client: LeadClient, args: argparse.Namespace) -> int:
    _print(client.delete_stitch(args.id))
    return 0


def _download_stitch(client: LeadClient, args: argparse.Namespace) -> int:
    folder = client.download_stitch(args.id, args.out, force=args.force)
    _print({"id": args.id, "folder": str(folder)})
    return 0


def _align(args: argparse.Namespace) -> int:
    if args.server or args.dataset:
        return int(_remote(_align_remote)(args))
    if not (args.source and args.target):
        return _fail("give --source and --target (or --dataset with --server)")
    from lead.alignment import alignment_scores
    from lead.data import read_embeddings

    X, Y = read_embeddings(args.source), read_embeddings(args.target)
    _print_alignment(
        alignment_scores(X, Y, folds=args.folds, seed=args.seed, max_pairs=args.max_pairs)
    )
    return 0


#: A cross-validated ridge R² below this is what unrelated (shuffled) pairs score.
UNALIGNED_R2 = 0.01


def _print_alignment(scores: dict[str, Any]) -> None:
    """Print the scores; warn on stderr when the pairs look unrelated (rows of the two
    files in different orders scored like shuffled pairs, without a word)."""
    _print(scores)
    r2 = scores.get("ridge_r2_score")
    if isinstance(r2, float) and r2 < UNALIGNED_R2:
        sys.stderr.write(
            f"warning: the cross-validated ridge_r2_score {r2:.4f} is about the mean "
            "estimator's (0) or below, as for shuffled pairs: is row i of --source the same "
            "text as row i of --target?\n"
        )


def _align_remote(client: LeadClient, args: argparse.Namespace) -> int:
    if args.dataset:
        _print_alignment(client.align(dataset=args.dataset, folds=args.folds, seed=args.seed))
        return 0
    from lead.data import read_embeddings

    source, target = read_embeddings(args.source), read_embeddings(args.target)
    _print_alignment(client.align(source=source, target=target, folds=args.folds, seed=args.seed))
    return 0


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="server URL (default: $LEAD_SERVER_URL)")
    parser.add_argument("--api-key", help="API key (default: $LEAD_API_KEY)")


def add_remote_commands(commands: Any) -> None:
    """Add ``datasets``, ``jobs``, ``stitches`` and ``align`` to the ``lead`` subcommand
    parsers."""
    datasets = commands.add_parser("datasets", help="paired-embedding datasets on a server")
    actions = datasets.add_subparsers(dest="action", metavar="ACTION", required=True)
    upload = actions.add_parser("upload", help="upload a .safetensors dataset")
    upload.add_argument("file", help="tensors 'source' (n, d_src) and 'target' (n, d_tgt)")
    upload.add_argument("--name")
    upload.set_defaults(handler=_remote(_upload))
    listing = actions.add_parser("list", help="list datasets")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--after")
    listing.set_defaults(handler=_remote(_list_datasets))
    delete = actions.add_parser("delete", help="delete a dataset")
    delete.add_argument("id")
    delete.set_defaults(handler=_remote(_delete_dataset))
    for sub in (upload, listing, delete):
        _server_arguments(sub)

    jobs = commands.add_parser("jobs", help="training jobs on a server")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    submit = actions.add_parser("submit", help="train a stitch on the server")
    submit.add_argument("--dataset", help="an uploaded dataset id")
    submit.add_argument("--source", metavar="FILE[:TENSOR]", help="uploaded as a dataset first")
    submit.add_argument("--target", metavar="FILE[:TENSOR]")
    submit.add_argument("--source-model", required=True, type=text_argument)
    submit.add_argument("--target-model", required=True, type=text_argument)
    submit.add_argument(
        "--method",
        default="ridge",
        help=FIT_METHODS_HELP,
    )
    submit.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument(
        "--holdout", type=open_fraction_argument, default=0.2, help="held-out share, in (0, 1)"
    )
    submit.add_argument("--seed", type=seed_argument, default=0)
    submit.add_argument("--push-to-hub", metavar="ORG/NAME")
    submit.add_argument("--stitch-id")
    submit.add_argument(
        "--allow-below-baseline",
        action="store_true",
        help="serve (and push) the stitch even if its held-out R² is at or below the "
        "mean-estimator baseline (by default such a stitch is kept but not served)",
    )
    submit.add_argument("--idempotency-key")
    submit.add_argument("--wait", action="store_true", help="follow the job to its end")
    submit.add_argument(
        "--interval", type=seconds_argument, default=1.0, help="seconds between polls"
    )
    submit.set_defaults(handler=_remote(_submit))
    get = actions.add_parser("get", help="show a job")
    get.add_argument("id")
    get.set_defaults(handler=_remote(_get_job))
    listing = actions.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--after")
    listing.add_argument("--status")
    listing.set_defaults(handler=_remote(_list_jobs))
    wait = actions.add_parser("wait", help="follow a job with a progress bar")
    wait.add_argument("id")
    wait.add_argument(
        "--interval", type=seconds_argument, default=1.0, help="seconds between polls"
    )
    wait.add_argument("--timeout", type=seconds_argument, help="give up after this many seconds")
    wait.set_defaults(handler=_remote(_wait_job))
    cancel = actions.add_parser("cancel", help="cancel a job")
    cancel.add_argument("id")
    cancel.set_defaults(handler=_remote(_cancel_job))
    for sub in (submit, get, listing, wait, cancel):
        _server_arguments(sub)

    stitches = commands.add_parser("stitches", help="stitches served by a server")
    actions = stitches.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list the served stitches")
    listing.set_defaults(handler=_remote(_list_stitches))
    get = actions.add_parser("get", help="show a stitch")
    get.add_argument("id")
    get.set_defaults(handler=_remote(_get_stitch))
    download = actions.add_parser(
        "download", help="download a stitch's files into a folder (lead.load_stitch loads it)"
    )
    download.add_argument("id")
    download.add_argument(
        "--out", required=True, type=text_argument, metavar="DIR", help="new or empty folder"
    )
    download.add_argument("--force", action="store_true", help="replace a stitch already in --out")
    download.set_defaults(handler=_remote(_download_stitch))
    delete = actions.add_parser("delete", help="delete a stitch trained by a job")
    delete.add_argument("id")
    delete.set_defaults(handler=_remote(_delete_stitch))
    for sub in (listing, get, download, delete):
        _server_arguments(sub)

    align = commands.add_parser("align", help="alignment scores of two paired embedding sets")
    align.add_argument("--source", metavar="FILE[:TENSOR]")
    align.add_argument("--target", metavar="FILE[:TENSOR]")
    align.add_argument("--dataset", help="an uploaded dataset id (needs a server)")
    align.add_argument("--folds", type=int, default=5)
    align.add_argument("--seed", type=seed_argument, default=0)
    align.add_argument("--max-pairs", type=int, help="local: score a seeded subset this large")
    _server_arguments(align)
    align.set_defaults(handler=_align)
