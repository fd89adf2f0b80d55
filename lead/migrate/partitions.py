"""Fill a target partition by partition: the unit of work of ``--engine ray``.

A partition is a range of source positions ``(after, until]``: rows ``after`` to ``until``
(excluded) of a Parquet source, cut at row group or file boundaries; or ids of a pgvector
table, cut at quantiles of the id column (integer or text ids alike, in the order the
source reads them). The plan is recorded in the target when a run starts, and a resumed run
works through the same partitions, whatever count it is asked for.

Each partition lands whole or not at all, together with the marker that says it is done:

* a Parquet folder target (:class:`~lead.migrate.parquet_target.ParquetTarget`) gets one part
  ``part-NNNNNN.parquet`` per partition (N its index; temporary name, fsync, rename), whose
  metadata names the partition; the plan is in ``_lead_partitions.json``;
* a pgvector target (:class:`~lead.migrate.pgvector.PgVectorTarget`) gets the rows of a
  partition in one transaction that also marks the partition's row of
  ``lead_migration_partitions`` done, after locking that row (``SELECT ... FOR UPDATE``),
  so a partition run twice at once (a retried task) lands once. The driver records the
  plan under the target's advisory lock (:meth:`~lead.migrate.pgvector.PgVectorTarget.lock`),
  held for the run, so a second apply is refused; its workers write without it.

A resumed run skips the partitions that are done, so each row is written exactly once. When
all are done, the caller finishes the target as the in-process engine does
(:meth:`~lead.migrate.stores.Target.finish`); either engine then finds the migration done.
An unfinished partitioned target is refused by the in-process engine, and an unfinished
in-process target by this one.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lead.errors import ConflictError, InvalidInputError
from lead.migrate._pg import errors_of
from lead.migrate.apply import _read_ahead, _translate
from lead.migrate.files import ParquetSource
from lead.migrate.parquet_target import PARTITIONS, ParquetTarget, _write_json
from lead.migrate.pgvector import PgVectorSource, PgVectorTarget
from lead.migrate.stores import Progress, Source, Target
from lead.migrate.translator import Translator

__all__ = [
    "Partition",
    "PartitionResult",
    "PartitionStore",
    "migrate_partition",
    "partition_store",
    "plan_partitions",
    "unsupported",
]

#: rows per partition of a pgvector source when no count is asked for
PG_ROWS_PER_PARTITION = 1_000_000

Rows = Iterable[tuple[np.ndarray, np.ndarray, Any]]


@dataclass(frozen=True)
class Partition:
    """Source positions ``(after, until]``: rows for Parquet, ids for pgvector.

    Attributes
    ----------
    index : int
        0, 1, ... in source order.
    after : Any
        The position the partition starts after (None: the beginning).
    until : Any
        The last position it holds (None: the end).
    """

    index: int
    after: Any
    until: Any


@dataclass(frozen=True)
class PartitionResult:
    """A partition that landed.

    Attributes
    ----------
    index : int
    rows : int
        Rows written for it.
    position : Any
        The source position after its last row (None: it has no rows).
    skipped : bool
        It was done already; nothing was written this time.
    """

    index: int
    rows: int
    position: Any
    skipped: bool = False


def plan_partitions(
    source: Source, count: int | None = None, *, workers: int = 1
) -> list[Partition]:
    """Cut ``source`` into about ``count`` partitions (fewer where the data allow no more).

    Parameters
    ----------
    source : ParquetSource or PgVectorSource
    count : int, optional
        Default for Parquet: one per file, or two per worker cut at row groups when there
        are fewer files than workers; for pgvector, one per million rows and at least two
        per worker.
    workers : int, default 1
        The workers that will run them.

    Raises
    ------
    InvalidInputError
        Another kind of source, or ``count`` below 1.
    """
    if count is not None and count < 1:
        raise InvalidInputError(f"partitions must be at least 1, got {count}", param="partitions")
    if isinstance(source, ParquetSource):
        groups = source.row_groups()
        if count is None and len(groups) < workers:
            count = min(2 * workers, sum(len(sizes) for sizes in groups))
        return _plan_rows(groups, count)
    if isinstance(source, PgVectorSource):
        if count is None:
            count = max(2 * workers, math.ceil(source.info.rows / PG_ROWS_PER_PARTITION))
        bounds = [None, *source.id_quantiles(count), None]
        return [Partition(k, a, b) for k, (a, b) in enumerate(itertools.pairwise(bounds))]
    raise unsupported("source", source.info.uri)


def _plan_rows(groups: list[list[int]], count: int | None) -> list[Partition]:
    """Row ranges: one per file, or ``count`` cut at the nearest row group boundaries (at
    even row counts when there are fewer row groups than partitions)."""
    ends = np.cumsum([n for sizes in groups for n in sizes], dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        return []
    if count is None:
        cuts = np.cumsum([sum(sizes) for sizes in groups]).tolist()
    elif len(ends) >= count:
        want = np.arange(1, count) * total / count
        cuts = ends[np.abs(ends[None, :] - want[:, None]).argmin(axis=1)].tolist()
    else:
        cuts = [round(k * total / count) for k in range(1, count)]
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < total}), total]
    return [Partition(k, a, b) for k, (a, b) in enumerate(itertools.pairwise(bounds))]


class PartitionStore(Protocol):
    """The partition plan and done-markers kept in a target (see the module docstring)."""

    def claim(self, plan: list[Partition], progress: Progress) -> list[Partition]:
        """Record ``plan`` in a fresh target; a target that has one keeps it (returned).

        ``progress`` is what :meth:`Target.open` returned.

        Raises
        ------
        ConflictError
            The in-process engine filled part of the target.
        """

    def done(self) -> dict[int, PartitionResult]:
        """The partitions that landed, by index."""

    def write(self, partition: Partition, rows: Rows) -> PartitionResult:
        """Write ``rows`` (ids, vectors, source position) and mark ``partition`` done, in
        one atomic step; a partition that is done already is skipped without reading
        ``rows``."""


def partition_store(target: Target) -> PartitionStore:
    """The partition store of an opened (:meth:`Target.open`) ``target``.

    Raises
    ------
    InvalidInputError
        A target that is neither a Parquet folder nor a pgvector table.
    """
    if isinstance(target, ParquetTarget):
        return ParquetPartitions(target)
    if isinstance(target, PgVectorTarget):
        return PgVectorPartitions(target)
    raise unsupported("target", target.uri)


def unsupported(role: str, uri: str) -> InvalidInputError:
    """The error for a ``role`` (``source`` or ``target``) store the ray engine does not
    handle."""
    kinds = "Parquet files or folders" if role == "source" else "Parquet folders"
    return InvalidInputError(
        f"{uri}: the ray engine migrates between {kinds} and pgvector tables; migrate this "
        f"{role} without --engine ray",
        param=role,
    )


def _in_process_refusal(uri: str) -> ConflictError:
    return ConflictError(
        f"{uri} holds part of a migration by the in-process engine; resume it without --engine ray",
        param="target",
    )


class ParquetPartitions:
    """Partitions of a Parquet folder target: one part file each."""

    def __init__(self, target: ParquetTarget) -> None:
        self.target = target
        self.path = target.path

    def claim(self, plan: list[Partition], progress: Progress) -> list[Partition]:
        self.target.lock()  # the driver's: its workers write their parts under it
        self.target.remove_unfinished_parts()
        stored = self.path / PARTITIONS
        if stored.is_file():
            return [Partition(*p) for p in json.loads(stored.read_text())["partitions"]]
        if progress.position is not None or any(self.path.glob("part-*.parquet")):
            raise _in_process_refusal(self.target.uri)
        _write_json(stored, {"partitions": [[p.index, p.after, p.until] for p in plan]})
        return plan

    def _name(self, index: int) -> str:
        return f"part-{index:06d}.parquet"

    def done(self) -> dict[int, PartitionResult]:
        from pyarrow import parquet as pq

        found = {}
        for part in sorted(self.path.glob("part-*.parquet")):
            meta = pq.read_metadata(part)
            state = json.loads((meta.metadata or {})[b"lead.position"])
            index = int(state["partition"])
            found[index] = PartitionResult(index, meta.num_rows, state["position"], True)
        return found

    def write(self, partition: Partition, rows: Rows) -> PartitionResult:
        if (self.path / self._name(partition.index)).is_file():
            return self.done()[partition.index]
        state = {"partition": partition.index, "position": partition.until}
        count = self.target.write_part(
            self._name(partition.index), state, ((ids, vectors) for ids, vectors, _ in rows)
        )
        return PartitionResult(partition.index, count, partition.until)


class PgVectorPartitions:
    """Partitions of a pgvector target: rows of ``lead_migration_partitions``."""

    def __init__(self, target: PgVectorTarget) -> None:
        self.target = target
        self.conn = target.conn

    def _sql(self, template: str) -> Any:
        return self.target._sql(template, parts=self.target.parts_table)

    def claim(self, plan: list[Partition], progress: Progress) -> list[Partition]:
        with errors_of(self.target.uri):
            return self._claim(plan, progress)

    def _claim(self, plan: list[Partition], progress: Progress) -> list[Partition]:
        from psycopg.types.json import Jsonb

        key = self.target.key
        self.target.lock()  # the driver's: its workers write under it
        with self.target.writing() as cursor:  # a new target is created with the plan
            self.target.bookkeeping_lock(cursor)
            cursor.execute(
                self._sql(
                    "CREATE TABLE IF NOT EXISTS {parts} (target text NOT NULL,"
                    " partition integer NOT NULL, after jsonb, until jsonb, rows bigint,"
                    " position jsonb, done boolean NOT NULL DEFAULT false,"
                    " updated_at timestamptz DEFAULT now(), PRIMARY KEY (target, partition))"
                )
            )
            stored = cursor.execute(
                self._sql(
                    "SELECT partition, after, until FROM {parts} WHERE target = %s "
                    "ORDER BY partition"
                ),
                (key,),
            ).fetchall()
            if stored:
                return [Partition(int(k), a, b) for k, a, b in stored]
            if progress.position is not None or progress.rows_written:
                raise _in_process_refusal(self.target.uri)
            cursor.executemany(
                self._sql(
                    "INSERT INTO {parts} (target, partition, after, until) VALUES (%s, %s, %s, %s)"
                ),
                [(key, p.index, Jsonb(p.after), Jsonb(p.until)) for p in plan],
            )
        return plan

    def done(self) -> dict[int, PartitionResult]:
        with errors_of(self.target.uri):
            rows = self.conn.execute(
                self._sql(
                    "SELECT partition, rows, position FROM {parts} WHERE target = %s AND done"
                ),
                (self.target.key,),
            ).fetchall()
        return {int(k): PartitionResult(int(k), int(n), pos, True) for k, n, pos in rows}

    def write(self, partition: Partition, rows: Rows) -> PartitionResult:
        with errors_of(self.target.uri):
            return self._write(partition, rows)

    def _write(self, partition: Partition, rows: Rows) -> PartitionResult:
        from psycopg.types.json import Jsonb

        key, index = self.target.key, partition.index
        with self.conn.transaction(), self.conn.cursor() as cursor:
            found = cursor.execute(
                self._sql(
                    "SELECT done, rows, position FROM {parts} WHERE target = %s "
                    "AND partition = %s FOR UPDATE"
                ),
                (key, index),
            ).fetchone()
            if found is None:
                raise ConflictError(
                    f"partition {index} is not in the plan of {self.target.uri}",
                    param="target",
                )
            if found[0]:
                return PartitionResult(index, int(found[1]), found[2], True)
            count, position = 0, None
            for ids, vectors, at in rows:
                self.target.write_rows(cursor, ids, vectors)
                count, position = count + len(ids), at
            cursor.execute(
                self._sql(
                    "UPDATE {parts} SET done = true, rows = %s, position = %s, "
                    "updated_at = now() WHERE target = %s AND partition = %s"
                ),
                (count, Jsonb(position), key, index),
            )
        return PartitionResult(index, count, position)


def migrate_partition(
    source: ParquetSource | PgVectorSource,
    store: PartitionStore,
    translator: Translator,
    partition: Partition,
    *,
    batch_size: int = 8192,
    column: str = "the source column",
) -> PartitionResult:
    """Read, translate and write one partition (reading a batch ahead in a thread).

    Raises
    ------
    ZeroVectorError
        A zero vector for a stitch fitted on unit-length vectors (naming its id); nothing
        of the partition is written.
    """

    def rows() -> Iterator[tuple[np.ndarray, np.ndarray, Any]]:
        batches = source.batches(batch_size, after=partition.after, until=partition.until)
        for batch in _read_ahead(batches, depth=2):
            yield batch.ids, _translate(translator, batch, column, False)[0], batch.position

    return store.write(partition, rows())
