"""The dataset records of the job store, and the file bytes it shares on PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lead.errors import ConflictError, DatasetNotFoundError
from service.errors import echo
from service.jobs import blobs
from service.jobs.db import Database, PostgresDatabase
from service.jobs.records import DatasetRecord, dumps

__all__ = ["DatasetOps"]


#: The statuses of a job that will not run again, as SQL literals.
_FINISHED = "'succeeded', 'failed', 'cancelled'"


class DatasetOps:
    """The dataset and blob operations of :class:`~service.jobs.store.JobStore` (a mixin)."""

    _db: Database

    @property
    def shares_files(self) -> bool:
        """Whether dataset and job-data bytes live in the database (PostgreSQL), for every
        replica and worker, besides the files in the data dir; False on SQLite."""
        return isinstance(self._db, PostgresDatabase)

    def put_blob(self, key: str, path: Path) -> None:
        """Share the file at ``path`` under ``key`` (its path relative to the data dir),
        replacing any earlier bytes of that key; nothing on SQLite. Call it before the record
        that refers to the file is added."""
        if isinstance(self._db, PostgresDatabase):
            blobs.put_blob(self._db, key, path)

    def fetch_blob(self, key: str, dest: Path) -> bool:
        """Write the shared bytes of ``key`` to ``dest`` (atomically: a temporary file
        renamed into place); False when there are none (always on SQLite)."""
        if isinstance(self._db, PostgresDatabase):
            return blobs.fetch_blob(self._db, key, dest)
        return False

    def delete_blob(self, key: str) -> None:
        """Forget the shared bytes of ``key`` (nothing when there are none, or on SQLite)."""
        if isinstance(self._db, PostgresDatabase):
            blobs.delete_blob(self._db, key)

    def add_dataset(self, dataset_id: str, info: dict[str, Any], path: str) -> DatasetRecord:
        """Record an uploaded dataset whose file (and blob, see :meth:`put_blob`) is in place."""
        self._db.connection().execute(
            "INSERT INTO datasets (id, info, path, created_at) VALUES (?, ?, ?, ?)",
            (dataset_id, dumps(info), path, time.time()),
        )
        return self.get_dataset(dataset_id)

    def get_dataset(self, dataset_id: str) -> DatasetRecord:
        """The dataset with this id.

        Raises
        ------
        DatasetNotFoundError
            If there is none.
        """
        conn = self._db.connection()
        row = conn.execute("SELECT * FROM datasets WHERE id = ?", (dataset_id,)).fetchone()
        if row is None:
            hint = (
                ""
                if dataset_id.startswith("ds_")
                else " (a dataset is named by its id, ds_...; GET /v1/datasets, or `lead "
                "datasets list`, shows each id with its name)"
            )
            raise DatasetNotFoundError(
                f"no dataset with id {echo(dataset_id)}{hint}", param="dataset"
            )
        return DatasetRecord.from_row(row)

    def list_datasets(
        self, *, limit: int = 20, after: str | None = None
    ) -> tuple[list[DatasetRecord], bool]:
        """Datasets newest first, ``limit`` of them after the dataset ``after``; and whether more
        follow. ``after`` may have been deleted since it was listed: the listing continues
        where it stood (its tombstone keeps its position).

        Raises
        ------
        DatasetNotFoundError
            If ``after`` names no dataset, present or deleted.
        """
        conn = self._db.connection()
        cutoff = 2**62
        if after is not None:
            row = conn.execute(
                "SELECT seq FROM datasets WHERE id = ?"
                " UNION ALL SELECT seq FROM dataset_tombstones WHERE id = ?",
                (after, after),
            ).fetchone()
            if row is None:
                raise DatasetNotFoundError(f"no dataset with id {echo(after)}", param="after")
            cutoff = row["seq"]
        rows = conn.execute(
            "SELECT * FROM datasets WHERE seq < ? ORDER BY seq DESC LIMIT ?", (cutoff, limit + 1)
        ).fetchall()
        return [DatasetRecord.from_row(r) for r in rows[:limit]], len(rows) > limit

    def data_paths(self) -> set[str]:
        """Paths (relative to the data dir) of every dataset file, and of the inline pairs
        of every job that may still run (a finished job's are no longer needed)."""
        conn = self._db.connection()
        rows = conn.execute(
            "SELECT path FROM datasets UNION SELECT data_path AS path FROM jobs "
            f"WHERE dataset_id IS NOT NULL OR status NOT IN ({_FINISHED})"
        ).fetchall()
        return {r["path"] for r in rows}

    def finished_job_data(self) -> set[str]:
        """Paths (relative to the data dir) of the inline pairs of finished jobs
        (succeeded, failed or cancelled): never read again, to be removed."""
        conn = self._db.connection()
        rows = conn.execute(
            f"SELECT data_path FROM jobs WHERE dataset_id IS NULL AND status IN ({_FINISHED})"
        ).fetchall()
        return {r["data_path"] for r in rows}

    def delete_dataset(self, dataset_id: str) -> DatasetRecord:
        """Forget a dataset and its shared bytes (the caller removes its file).

        Raises
        ------
        DatasetNotFoundError
            If there is none.
        ConflictError
            If a queued or running job still reads it.
        """
        db = self._db
        with db.transaction() as conn:
            row = conn.execute(
                f"SELECT * FROM datasets WHERE id = ?{db.for_update}", (dataset_id,)
            ).fetchone()
            if row is None:
                raise DatasetNotFoundError(
                    f"no dataset with id {echo(dataset_id)}", param="dataset"
                )
            busy = conn.execute(
                "SELECT id FROM jobs WHERE dataset_id = ?"
                " AND status IN ('queued', 'running', 'cancelling')",
                (dataset_id,),
            ).fetchone()
            if busy is not None:
                raise ConflictError(
                    f"dataset {dataset_id} is used by the unfinished job {busy['id']}",
                    param="dataset",
                )
            conn.execute("DELETE FROM datasets WHERE id = ?", (dataset_id,))
            conn.execute(
                "INSERT INTO dataset_tombstones (id, seq) VALUES (?, ?)", (dataset_id, row["seq"])
            )
            if isinstance(db, PostgresDatabase):
                conn.execute("DELETE FROM lead_blobs WHERE key = ?", (row["path"],))
        return DatasetRecord.from_row(row)
