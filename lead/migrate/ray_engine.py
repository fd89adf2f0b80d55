"""``apply --engine ray``: the migration as a Ray Data pipeline, on one machine or many.

On a cluster, start Ray on each node, then run ``apply`` anywhere in it::

    ray start --head --port=6379                # on the head node
    ray start --address=HEAD:6379               # on every other node
    lead migrate apply postgresql://db/app?table=docs&column=emb \\
        postgresql://db/app?table=docs_v2&column=emb \\
        --stitch minilm-to-mpnet --engine ray --ray-address auto

Without ``--ray-address``, a local Ray instance is started for the run (or the one this
process has already initialised is used). Every node needs LEAD installed, the stitch
(a folder on a shared path, a bundled id or a Hub id) and access to the stores: the
database, or the Parquet folders on a shared file system.

The driver checks everything first, as the in-process engine does (the stitch's dimension,
NULL / non-finite / duplicate ids in the source, the target's content and its recorded
migration), so bad input is refused before anything is written. It then records a
partition plan in the target (:mod:`lead.migrate.partitions`: Parquet row ranges, pgvector
id ranges) and hands the partitions that are not done yet to a Ray Data pipeline::

    from_items(partitions) -> map_batches(PartitionWorker, actor pool) -> iter_rows

Each actor loads the stitch once (on its GPU when Ray gave it one, see ``num_gpus``), and
for each partition reads it from the source in batches, translates them and writes the
partition with its done-marker in one atomic step (one part file, or one transaction): a
partition is the unit of resumption, so it is read, translated and written by the same
worker, which keeps at most a few batches in memory. A killed run resumes with the same
command and skips the done partitions, so each row lands exactly once; when all are done
the driver finishes the target as the in-process engine does, so either engine then finds
the migration done, and ``verify`` reads the target as usual. The source is never
modified; the translation is batch-invariant, so the target holds the same bytes as an
in-process run's.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from lead._ray import check_ray_reachable
from lead.errors import ConflictError, InvalidInputError, LeadError
from lead.migrate.apply import (
    ApplyResult,
    _progress,
    check_dims,
    check_finished_rows,
    check_go,
    check_written_rows,
    column_name,
    migration_spec,
)
from lead.migrate.files import ParquetSource
from lead.migrate.parquet_target import ParquetTarget
from lead.migrate.partitions import (
    Partition,
    PartitionResult,
    migrate_partition,
    partition_store,
    plan_partitions,
    unsupported,
)
from lead.migrate.pgvector import PgVectorSource, PgVectorTarget
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import MigrationSpec, Progress, require
from lead.migrate.translator import LocalTranslator

__all__ = ["PartitionWorker", "RayJob", "run_apply_ray"]


@dataclass(frozen=True)
class RayJob:
    """What every worker needs (sent to each actor once).

    Attributes
    ----------
    source, target : str
        The store URIs as given (passwords included: the workers connect with them).
    stitch : str
    spec : MigrationSpec
        Recorded in the target; a worker whose stitch has other weights refuses to start.
    batch_size : int
    column : str
        How errors name the source column.
    """

    source: str
    target: str
    stitch: str
    spec: MigrationSpec
    batch_size: int
    column: str


class PartitionWorker:
    """A Ray Data actor: loads the stitch and opens the stores once, then migrates the
    partitions it is given (:func:`lead.migrate.partitions.migrate_partition`).

    Each call gets a batch of partitions (columns ``index``, ``after``, ``until``; the
    positions as JSON) and answers, per partition, the rows written, the position reached
    and whether it was done already, or the :class:`~lead.errors.LeadError` that stopped
    it (``error``, as JSON: Ray Data does not hand the original exception back).
    """

    def __init__(self, job: RayJob) -> None:
        self.job = job
        self.failure: LeadError | None = None
        try:
            self._open(job)
        except LeadError as error:
            self.failure = error

    def _open(self, job: RayJob) -> None:
        import ray

        device = "cuda" if ray.get_gpu_ids() else "cpu"
        self.translator = LocalTranslator(
            job.stitch, inverse=job.spec.inverse, normalize=job.spec.normalize, device=device
        )
        if self.translator.ref.sha256 != job.spec.stitch_sha256:
            raise ConflictError(
                f"stitch {job.stitch} has other weights on a worker's node than on the "
                "driver's; give every node the same stitch",
                param="stitch",
            )
        source, target = open_source(job.source), open_target(job.target)
        # the driver checked the kinds
        assert isinstance(source, ParquetSource | PgVectorSource)
        assert isinstance(target, ParquetTarget | PgVectorTarget)
        self.source, self.target = source, target
        target.open(job.spec, source.info, partitioned=True)
        self.store = partition_store(target)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        answers: list[dict[str, Any]] = []
        for index, after, until in zip(batch["index"], batch["after"], batch["until"], strict=True):
            partition = Partition(int(index), json.loads(after), json.loads(until))
            try:
                if self.failure is not None:
                    raise self.failure
                done = migrate_partition(
                    self.source,
                    self.store,
                    self.translator,
                    partition,
                    batch_size=self.job.batch_size,
                    column=self.job.column,
                )
                answers.append(_answer(done, ""))
            except LeadError as error:
                answers.append(_answer(PartitionResult(partition.index, 0, None), _dump(error)))
        return {key: np.asarray([a[key] for a in answers]) for key in _ANSWER_KEYS}


_ANSWER_KEYS = ("index", "rows", "position", "skipped", "error")


def _answer(result: PartitionResult, error: str) -> dict[str, Any]:
    return {
        "index": result.index,
        "rows": result.rows,
        "position": json.dumps(result.position),
        "skipped": result.skipped,
        "error": error,
    }


def _dump(error: LeadError) -> str:
    kind = type(error)
    state = {k: v for k, v in vars(error).items() if k != "message"}
    return json.dumps(
        {
            "module": kind.__module__,
            "name": kind.__qualname__,
            "message": error.message,
            "state": state,
        },
        default=str,
    )


def _load(text: str) -> LeadError:
    """The :class:`LeadError` a worker reported, as its own class."""
    found = json.loads(text)
    kind = getattr(importlib.import_module(found["module"]), found["name"], None)
    if not (isinstance(kind, type) and issubclass(kind, LeadError)):
        return LeadError(found["message"])
    error = kind.__new__(kind)
    Exception.__init__(error, found["message"])
    error.message = found["message"]
    error.__dict__.update(found["state"])
    return error


@contextmanager
def _ray_connected(address: str | None) -> Iterator[Any]:
    """Ray, initialised: the instance this process has already, or one started (local, or
    joined at ``address``) for the run and shut down after it."""
    ray = require("ray", "ray")
    if ray.is_initialized():
        yield ray
        return
    if address:  # an unreachable head: ray.init would retry it for minutes
        check_ray_reachable(address, setting="--ray-address")
    # no address: a new local instance ("local"), not whatever cluster an earlier
    # `ray start` on this machine left recorded in /tmp/ray
    ray.init(address=address or "local", include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()


def run_apply_ray(
    source: str,
    target: str,
    stitch: str,
    *,
    batch_size: int = 8192,
    partitions: int | None = None,
    address: str | None = None,
    num_gpus: float | None = None,
    workers: int | None = None,
    inverse: bool = False,
    normalize: bool = False,
    skip_null: bool = False,
    allow_no_go: bool = False,
    progress: Any = True,
) -> ApplyResult:
    """Translate every vector of ``source`` into ``target`` on a Ray cluster; resume where
    a run stopped (see the module docstring).

    Parameters
    ----------
    source : str
        A Parquet file or folder, or a pgvector table (URI); read only, never modified.
    target : str
        A Parquet folder, or a pgvector table or column (URI): new, or holding this
        migration (then the run resumes; a finished one is a no-op).
    stitch : str
        A stitch folder, a bundled stitch id or a Hub repo id, loaded by every worker.
    batch_size : int, default 8192
        Rows per read, translation and write inside a partition.
    partitions : int, optional
        How many partitions to cut the source into (each one atomic). Default: one per
        Parquet file; for pgvector, one per million rows and at least two per worker. A
        resumed run keeps the plan of the first.
    address : str, optional
        A Ray cluster (``auto``, ``HOST:6379`` or ``ray://HOST:10001``); default the Ray
        this process has initialised, or a local one started for the run.
    num_gpus : float, optional
        GPUs per worker (the stitch runs on the GPU when it gets one). Default: 1 when the
        cluster has GPUs, else 0.
    workers : int, optional
        Actors at most. Default: one per GPU (``num_gpus``), else one per cluster CPU.
    inverse, normalize, skip_null : bool
        As for :func:`lead.migrate.apply.run_apply`.
    progress : bool or callable, default True
        A progress bar on stderr, or ``f(rows_done, rows_total)`` called per partition.

    Returns
    -------
    ApplyResult

    Raises
    ------
    InvalidInputError
        A source or target kind the engine does not handle, a bad setting; NULL vectors
        (without ``skip_null``), non-finite values or duplicate ids in the source.
    ShapeMismatchError
        The source's dimension is not the stitch's.
    ConflictError
        The target exists with other content, holds another migration, or part of one by
        the in-process engine; a worker's stitch differs from the driver's.
    ZeroVectorError
        A zero vector for a stitch fitted on unit-length vectors (naming its id).
    """
    for name, value in (
        ("batch_size", batch_size),
        ("partitions", partitions),
        ("workers", workers),
    ):
        if value is not None and value < 1:
            raise InvalidInputError(f"{name} must be at least 1, got {value}", param=name)
    if num_gpus is not None and num_gpus < 0:
        raise InvalidInputError(f"num_gpus must be 0 or more, got {num_gpus}", param="num_gpus")
    started = time.perf_counter()
    translator = LocalTranslator(stitch, inverse=inverse, normalize=normalize)
    with open_source(source) as src, open_target(target) as tgt:
        if not isinstance(src, ParquetSource | PgVectorSource):
            raise unsupported("source", src.info.uri)
        if not isinstance(tgt, ParquetTarget | PgVectorTarget):
            raise unsupported("target", tgt.uri)
        column = column_name(src)
        check_go(translator, allow_no_go=allow_no_go)
        check_dims(src, translator, column)
        src.check(skip_null=skip_null, zero_rows=translator.ref.unit_input)
        spec = migration_spec(src, translator, inverse=inverse, normalize=normalize)
        with _ray_connected(address) as ray:
            state = tgt.open(spec, src.info, partitioned=True)
            check_source = getattr(tgt, "check_source", None)  # as in-process (apply.py)
            if check_source is not None and not state.done:
                check_source(src)
            nulls = src.info.null_rows or 0
            total = src.info.rows - (nulls if skip_null else 0)
            if state.done:
                check_finished_rows(tgt.uri, state.rows_written, total)
                seconds = time.perf_counter() - started
                rows = state.rows_written
                return ApplyResult(tgt.uri, 0, rows, rows, seconds, True)
            resources = ray.cluster_resources()
            if num_gpus and resources.get("GPU", 0) < num_gpus:
                raise InvalidInputError(
                    f"--num-gpus {num_gpus}: the Ray cluster has {resources.get('GPU', 0):g} "
                    "GPUs; the actors would wait for ever",
                    param="num_gpus",
                )
            gpus = num_gpus if num_gpus is not None else (1.0 if resources.get("GPU") else 0.0)
            width = workers or max(
                1, int(resources.get("GPU", 0) // gpus if gpus else resources.get("CPU", 1))
            )
            store = partition_store(tgt)
            plan = store.claim(plan_partitions(src, partitions, workers=width), state)
            results = store.done()
            resumed = sum(r.rows for r in results.values())
            pending = [p for p in plan if p.index not in results]
            job = RayJob(source, target, stitch, spec, batch_size, column)
            report, close = _progress(progress, total, resumed)
            try:
                for result in _run(ray, job, pending, width, gpus):
                    results[result.index] = result
                    report(sum(r.rows for r in results.values()))
            finally:
                close()
        written = sum(r.rows for r in results.values())
        positions = [results[p.index].position for p in plan if p.index in results]
        last = next((p for p in reversed(positions) if p is not None), None)
        check_written_rows(tgt.uri, written, total, resumed)
        tgt.finish(Progress(position=last, rows_written=written, done=True))
    seconds = time.perf_counter() - started
    return ApplyResult(tgt.uri, written - resumed, written, resumed, seconds, False)


def _run(
    ray: Any, job: RayJob, pending: list[Partition], width: int, gpus: float
) -> Iterator[PartitionResult]:
    """Migrate ``pending`` partitions on the cluster; results as they land.

    Raises
    ------
    LeadError
        The first that a worker reported (the partitions in flight still land whole).
    """
    if not pending:
        return
    items = [
        {"index": p.index, "after": json.dumps(p.after), "until": json.dumps(p.until)}
        for p in pending
    ]
    data = ray.data.from_items(items, override_num_blocks=len(items))
    data = data.map_batches(
        PartitionWorker,
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=min(width, len(pending))),
        fn_constructor_kwargs={"job": job},
        num_cpus=1,
        num_gpus=gpus or None,
    )
    data.context.enable_progress_bars = False  # this engine draws its own
    for row in data.iter_rows():
        if row["error"]:
            raise _load(str(row["error"]))
        yield PartitionResult(
            int(row["index"]),
            int(row["rows"]),
            json.loads(row["position"]),
            bool(row["skipped"]),
        )
