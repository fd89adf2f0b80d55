"""Durable job and dataset records in SQLite (the default) or PostgreSQL (shared by replicas).

``JobStore(path)`` keeps them in one SQLite file in WAL mode (``LEAD_DATA_DIR/lead.sqlite3``);
``JobStore("postgresql://...")`` in a PostgreSQL database that several replicas share (see
:mod:`service.jobs.db`). The schema is versioned (:mod:`service.jobs.migrations`); each
thread and process opens its own connection; writes that read first run in one transaction
and lock the rows they read, so replicas, runners and workers update jobs without lost
updates.

Job life cycle::

    queued ──> running ──> succeeded | failed
      │  ^        │
      │  └────────┤ (lease expired or runner stopped, attempts left: see service.jobs.leases)
      │           └──> cancelling ──> cancelled   (the worker stops at its next check)
      └──> cancelled

On PostgreSQL the bytes of datasets and job data live in the database too
(:mod:`service.jobs.blobs`, :attr:`JobStore.shares_files`), so every replica can read them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lead.errors import ConflictError, DatasetNotFoundError, JobNotFoundError
from service.errors import echo
from service.jobs.dataset_ops import DatasetOps
from service.jobs.db import Connection, open_database
from service.jobs.leases import LeaseOps, owner_id, owner_is_dead
from service.jobs.migrations import migrate
from service.jobs.records import DatasetRecord, JobRecord, StitchState, dumps, new_id
from service.jobs.stitch_ops import StitchOps

__all__ = [
    "ACTIVE_STATUSES",
    "DatasetRecord",
    "IdempotencyKeyTaken",
    "JobRecord",
    "JobStore",
    "StitchState",
    "new_id",
    "owner_id",
    "owner_is_dead",
]

ACTIVE_STATUSES = ("queued", "running", "cancelling")
_HELD = "status IN ('running', 'cancelling')"


class IdempotencyKeyTaken(Exception):
    """``create_job`` was given an ``Idempotency-Key`` that a job already has (the caller
    looks that job up with :meth:`JobStore.find_idempotent`)."""


class JobStore(LeaseOps, DatasetOps, StitchOps):
    """Job and dataset records in a SQLite file or a PostgreSQL database.

    Parameters
    ----------
    target : Path or str
        A ``postgresql://`` (or ``postgres://``) URL, else the SQLite file (created when
        missing). The schema is created or upgraded in place.

    Raises
    ------
    StoreError
        If the PostgreSQL server cannot be reached (the message names the host, never the
        password).
    RuntimeError
        If the database has a newer schema than this code knows.
    """

    def __init__(self, target: Path | str) -> None:
        self._db = open_database(target)
        self.backend: str = self._db.backend
        self.location: str = self._db.location  # for logs: no password
        self.path: Path | None = getattr(self._db, "path", None)
        try:
            migrate(self._db)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Close every connection of this store (at shutdown, when no thread uses it)."""
        self._db.close()

    # ---------------------------------------------------------------- jobs
    def create_job(
        self,
        *,
        job_id: str,
        request: dict[str, Any],
        data_path: str,
        dataset_id: str | None,
        pairs: int,
        stitch_id: str,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> JobRecord:
        """Insert a ``queued`` job.

        Raises
        ------
        IdempotencyKeyTaken
            If ``idempotency_key`` is already taken (checked first).
        ConflictError
            If an active or succeeded job already produces ``stitch_id``.
        DatasetNotFoundError
            If ``dataset_id`` names no dataset (deleted meanwhile).
        """
        try:
            with self._db.transaction() as conn:
                if idempotency_key is not None and self._taken(conn, idempotency_key):
                    raise IdempotencyKeyTaken(idempotency_key)
                self._check_producer(conn, stitch_id)
                lock = f"SELECT id FROM datasets WHERE id = ?{self._db.for_share}"
                if dataset_id is not None and not conn.execute(lock, (dataset_id,)).rows:
                    # (locked against a concurrent delete_dataset)
                    raise DatasetNotFoundError(
                        f"no dataset with id {echo(dataset_id)}", param="dataset"
                    )
                conn.execute(
                    "INSERT INTO jobs (id, status, request, data_path, dataset_id, pairs,"
                    " stitch_id, created_at, idempotency_key, request_hash)"
                    " VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, dumps(request), data_path, dataset_id, pairs, stitch_id,
                     time.time(), idempotency_key, request_hash),
                )  # fmt: skip
        except Exception as exc:
            if self._db.unique_violation(exc) is None:
                raise
            # a concurrent twin committed between our checks and our insert
            if idempotency_key is not None and self._taken(self._db.connection(), idempotency_key):
                raise IdempotencyKeyTaken(idempotency_key) from None
            self._check_producer(self._db.connection(), stitch_id)
            raise
        return self.get_job(job_id)

    @staticmethod
    def _taken(conn: Connection, key: str) -> bool:
        return bool(conn.execute("SELECT id FROM jobs WHERE idempotency_key = ?", (key,)).rows)

    def get_job(self, job_id: str) -> JobRecord:
        """The job with this id.

        Raises
        ------
        JobNotFoundError
            If there is none.
        """
        row = self._db.connection().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
        return JobRecord.from_row(row)

    def find_idempotent(self, key: str) -> tuple[JobRecord, str | None] | None:
        """The job created with this ``Idempotency-Key`` and its request hash, if any."""
        conn = self._db.connection()
        row = conn.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,)).fetchone()
        return None if row is None else (JobRecord.from_row(row), row["request_hash"])

    def list_jobs(
        self, *, limit: int = 20, after: str | None = None, status: str | None = None
    ) -> tuple[list[JobRecord], bool]:
        """Jobs newest first, ``limit`` of them after the job ``after``; and whether more follow.

        Raises
        ------
        JobNotFoundError
            If ``after`` names no job.
        """
        conn = self._db.connection()
        where, args = ["1 = 1"], []
        if after is not None:
            row = conn.execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
            if row is None:
                raise JobNotFoundError(f"no job with id {echo(after)}", param="after")
            where.append("seq < ?")
            args.append(row["seq"])
        if status is not None:
            where.append("status = ?")
            args.append(status)
        rows = conn.execute(
            f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
            (*args, limit + 1),
        ).fetchall()
        return [JobRecord.from_row(r) for r in rows[:limit]], len(rows) > limit

    def job_counts(self) -> tuple[dict[str, int], int]:
        """Jobs by status, and how many were started more than once (their server or worker
        died): what ``/metrics`` reports of the whole store."""
        conn = self._db.connection()
        rows = conn.execute("SELECT status, count(*) AS n FROM jobs GROUP BY status").fetchall()
        again = conn.execute("SELECT count(*) AS n FROM jobs WHERE attempts > 1").fetchall()
        return {r["status"]: int(r["n"]) for r in rows}, int(again[0]["n"])

    def job_status(self, job_id: str) -> str:
        """The current status of a job (a cheap read for cancellation checks)."""
        conn = self._db.connection()
        row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
        return str(row["status"])

    def update_progress(
        self, job_id: str, stage: str, step: int, total: int, *, owner: str | None = None
    ) -> bool:
        """Record the progress of a running job; with ``owner``, only while that owner holds
        it (running or cancelling). Whether the job changed."""
        guard, args = self._guard(owner)
        guard += f" AND {_HELD}" if owner is not None else ""
        cursor = self._db.connection().execute(
            f"UPDATE jobs SET stage = ?, step = ?, total = ? WHERE id = ?{guard}",
            (stage, int(step), int(total), job_id, *args),
        )
        return cursor.rowcount == 1

    @staticmethod
    def _guard(owner: str | None) -> tuple[str, tuple[str, ...]]:
        """The WHERE clause (and its argument) of a write only ``owner`` may do."""
        return ("", ()) if owner is None else (" AND owner = ?", (owner,))

    def request_cancel(self, job_id: str) -> JobRecord:
        """Cancel a queued job at once, or ask a running one to stop (``cancelling``).

        Raises
        ------
        JobNotFoundError
            If there is no such job.
        ConflictError
            If the job has already finished.
        """
        with self._db.transaction() as conn:
            row = conn.execute(
                f"SELECT status FROM jobs WHERE id = ?{self._db.for_update}", (job_id,)
            ).fetchone()
            if row is None:
                raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
            if row["status"] == "queued":
                conn.execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE id = ?",
                    (time.time(), job_id),
                )
            elif row["status"] == "running":
                conn.execute("UPDATE jobs SET status = 'cancelling' WHERE id = ?", (job_id,))
            elif row["status"] != "cancelling":
                raise ConflictError(
                    f"job {job_id} has already finished ({row['status']}); nothing to cancel",
                    param="job_id",
                )
        return self.get_job(job_id)

    def set_outcome(
        self,
        job_id: str,
        *,
        scorecard: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
        owner: str | None = None,
    ) -> bool:
        """Store a running job's scorecard and result before it is marked ``succeeded``;
        False (nothing stored) when the job is no longer running or cancelling, or, with
        ``owner``, no longer held by that owner."""
        guard, args = self._guard(owner)
        cursor = self._db.connection().execute(
            f"UPDATE jobs SET scorecard = ?, result = ? WHERE id = ? AND {_HELD}{guard}",
            (dumps(scorecard), dumps(result), job_id, *args),
        )
        return cursor.rowcount == 1

    def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        error: dict[str, str] | None = None,
        result: dict[str, Any] | None = None,
        owner: str | None = None,
    ) -> bool:
        """Move a ``running`` / ``cancelling`` job to a final status (its lease ends); False
        if it was not active or, with ``owner``, not held by that owner.

        ``result``, when given, replaces the stored one (for example with the push outcome).
        """
        assert status in ("succeeded", "failed", "cancelled"), status
        guard, args = self._guard(owner)
        cursor = self._db.connection().execute(
            "UPDATE jobs SET status = ?, finished_at = ?, error = ?, lease_until = NULL,"
            f" result = COALESCE(?, result) WHERE id = ? AND {_HELD}{guard}",
            (status, time.time(), dumps(error), dumps(result), job_id, *args),
        )
        return cursor.rowcount == 1
