"""Durable job and dataset records in SQLite (stdlib ``sqlite3``, WAL mode).

The database file lives at ``LEAD_DATA_DIR/lead.sqlite3``. Each thread and each process
opens its own connection (``sqlite3`` connections are not shared); every write runs in an
explicit ``BEGIN IMMEDIATE`` transaction, so the server process and the training workers
can update the same job without lost updates.

Job life cycle::

    queued ──> running ──> succeeded | failed
      │           │
      │           └──> cancelling ──> cancelled   (the worker stops at its next check)
      └──> cancelled

After a crash, :meth:`JobStore.recover` marks ``running`` / ``cancelling`` jobs ``failed``
with the code ``interrupted`` and returns the ``queued`` ones to be submitted again.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lead.errors import ConflictError, DatasetNotFoundError, JobNotFoundError
from service.errors import echo

__all__ = ["ACTIVE_STATUSES", "DatasetRecord", "JobRecord", "JobStore", "new_id"]

ACTIVE_STATUSES = ("queued", "running", "cancelling")
_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    data_path TEXT NOT NULL,
    dataset_id TEXT,
    pairs INTEGER NOT NULL,
    stitch_id TEXT NOT NULL,
    stage TEXT,
    step INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    scorecard TEXT,
    result TEXT,
    error TEXT,
    idempotency_key TEXT UNIQUE,
    request_hash TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
CREATE TABLE IF NOT EXISTS datasets (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL,
    path TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


def new_id(prefix: str) -> str:
    """A random id such as ``job_3f9c0a1b2d4e5f60718293a4`` (96 random bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, allow_nan=False)


@dataclass(frozen=True)
class JobRecord:
    """One training job as stored. ``request`` is the normalised request body."""

    id: str
    status: str
    request: dict[str, Any]
    data_path: str
    dataset_id: str | None
    pairs: int
    stitch_id: str
    stage: str | None
    step: int
    total: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    scorecard: dict[str, Any] | None
    result: dict[str, Any] | None
    error: dict[str, str] | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        return cls(
            id=row["id"],
            status=row["status"],
            request=json.loads(row["request"]),
            data_path=row["data_path"],
            dataset_id=row["dataset_id"],
            pairs=row["pairs"],
            stitch_id=row["stitch_id"],
            stage=row["stage"],
            step=row["step"],
            total=row["total"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            scorecard=_loads(row["scorecard"]),
            result=_loads(row["result"]),
            error=_loads(row["error"]),
        )


@dataclass(frozen=True)
class StitchState:
    """What a succeeded job's result says of its stitch."""

    served: bool  # false below the baseline (unless allowed) and once deleted
    deleted: bool  # DELETE /v1/stitches/{id} committed (the folder may remain)


@dataclass(frozen=True)
class DatasetRecord:
    """One uploaded dataset: ``info`` holds its shapes, dtype, size and checksum."""

    id: str
    info: dict[str, Any]
    path: str
    created_at: float


class JobStore:
    """Job and dataset records in one SQLite file.

    Parameters
    ----------
    path : Path
        The database file; created with its tables when missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, sqlite3.Connection] = {}
        conn = self._connection()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > _SCHEMA_VERSION:
            raise RuntimeError(
                f"{path} has schema version {version}; this LEAD knows {_SCHEMA_VERSION}"
            )
        conn.executescript(_SCHEMA + f"PRAGMA user_version = {_SCHEMA_VERSION};")

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # one connection per thread; check_same_thread=False only so close() can close it
            conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn = conn
            with self._lock:
                for thread in [t for t in self._open if not t.is_alive()]:
                    self._open.pop(thread).close()  # threads of a pool come and go
                self._open[threading.current_thread()] = conn
        return conn

    def close(self) -> None:
        """Close every connection of this store (at shutdown, when no thread uses it)."""
        with self._lock:
            for conn in self._open.values():
                conn.close()
            self._open.clear()
        self._local = threading.local()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

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
        ConflictError
            If an active or succeeded job already produces ``stitch_id``.
        sqlite3.IntegrityError
            If ``idempotency_key`` is already taken (the caller looks the job up).
        """
        with self._transaction() as conn:
            taken = self._producer(conn, stitch_id)
            if taken is not None:
                deleted = (_loads(taken["result"]) or {}).get("stitch_deleted_at") is not None
                raise ConflictError(
                    f"stitch id {stitch_id!r} was produced by job {taken['id']} and deleted; "
                    "the ids of deleted stitches are not used again"
                    if deleted
                    else f"stitch id {stitch_id!r} is already produced by job {taken['id']}",
                    param="stitch_id",
                )
            conn.execute(
                "INSERT INTO jobs (id, status, request, data_path, dataset_id, pairs, stitch_id,"
                " created_at, idempotency_key, request_hash)"
                " VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    _dumps(request),
                    data_path,
                    dataset_id,
                    pairs,
                    stitch_id,
                    time.time(),
                    idempotency_key,
                    request_hash,
                ),
            )
        return self.get_job(job_id)

    @staticmethod
    def _producer(conn: sqlite3.Connection, stitch_id: str) -> sqlite3.Row | None:
        """The job (at most one) that produces or produced ``stitch_id``: not failed or
        cancelled."""
        row: sqlite3.Row | None = conn.execute(
            "SELECT id, status, result FROM jobs"
            " WHERE stitch_id = ? AND status NOT IN ('failed', 'cancelled')",
            (stitch_id,),
        ).fetchone()
        return row

    def mark_stitch_deleted(self, stitch_id: str) -> JobRecord | None:
        """Record in the job that trained ``stitch_id`` that the stitch is deleted
        (``result.stitch_deleted_at``, Unix seconds); None when no job produced it.

        Raises
        ------
        ConflictError
            If the job has not succeeded yet (queued, running or cancelling).
        """
        with self._transaction() as conn:
            row = self._producer(conn, stitch_id)
            if row is None:
                return None
            if row["status"] != "succeeded":
                raise ConflictError(
                    f"stitch {echo(stitch_id)} is still being trained by job {row['id']} "
                    f"({row['status']}); cancel the job instead",
                    param="stitch_id",
                )
            result = _loads(row["result"]) or {"stitch_id": stitch_id}
            if result.get("stitch_deleted_at") is None:
                result["stitch_deleted_at"] = int(time.time())
                result["served"] = False
                result["not_served_reason"] = "deleted (DELETE /v1/stitches/{id})"
            conn.execute("UPDATE jobs SET result = ? WHERE id = ?", (_dumps(result), row["id"]))
        return self.get_job(row["id"])

    def stitch_deleted_at(self, stitch_id: str) -> tuple[str, int] | None:
        """(job id, Unix seconds) when a job's stitch ``stitch_id`` was deleted, else None."""
        with self._transaction() as conn:
            row = self._producer(conn, stitch_id)
        if row is None:
            return None
        deleted = (_loads(row["result"]) or {}).get("stitch_deleted_at")
        return None if deleted is None else (str(row["id"]), int(deleted))

    def get_job(self, job_id: str) -> JobRecord:
        """The job with this id.

        Raises
        ------
        JobNotFoundError
            If there is none.
        """
        row = self._connection().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
        return JobRecord.from_row(row)

    def find_idempotent(self, key: str) -> tuple[JobRecord, str | None] | None:
        """The job created with this ``Idempotency-Key`` and its request hash, if any."""
        row = (
            self._connection()
            .execute("SELECT * FROM jobs WHERE idempotency_key = ?", (key,))
            .fetchone()
        )
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
        conn = self._connection()
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

    def queued_job_ids(self) -> list[str]:
        """Ids of queued jobs, oldest first."""
        rows = (
            self._connection()
            .execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY seq")
            .fetchall()
        )
        return [r["id"] for r in rows]

    def succeeded_stitches(self) -> dict[str, StitchState]:
        """What the succeeded jobs' results say of their stitches, by stitch id, oldest
        job first (by ``finished_at``)."""
        rows = (
            self._connection()
            .execute(
                "SELECT stitch_id, finished_at, result FROM jobs WHERE status = 'succeeded'"
                " ORDER BY finished_at, stitch_id"
            )
            .fetchall()
        )
        states = {}
        for row in rows:
            result = _loads(row["result"]) or {}
            states[row["stitch_id"]] = StitchState(
                # records from before ``served`` existed count as served
                served=result.get("served") is not False,
                deleted=result.get("stitch_deleted_at") is not None,
            )
        return states

    def claim_job(self, job_id: str) -> bool:
        """Move a ``queued`` job to ``running``; False when it is no longer queued."""
        with self._transaction() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET status = 'running', started_at = ?, stage = 'starting'"
                " WHERE id = ? AND status = 'queued'",
                (time.time(), job_id),
            )
        return cursor.rowcount == 1

    def job_status(self, job_id: str) -> str:
        """The current status of a job (a cheap read for cancellation checks)."""
        row = (
            self._connection().execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )
        if row is None:
            raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
        return str(row["status"])

    def update_progress(self, job_id: str, stage: str, step: int, total: int) -> None:
        """Record the progress of a running job."""
        with self._transaction() as conn:
            conn.execute(
                "UPDATE jobs SET stage = ?, step = ?, total = ? WHERE id = ?",
                (stage, int(step), int(total), job_id),
            )

    def request_cancel(self, job_id: str) -> JobRecord:
        """Cancel a queued job at once, or ask a running one to stop (``cancelling``).

        Raises
        ------
        JobNotFoundError
            If there is no such job.
        ConflictError
            If the job has already finished.
        """
        with self._transaction() as conn:
            status = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if status is None:
                raise JobNotFoundError(f"no job with id {echo(job_id)}", param="job_id")
            if status["status"] == "queued":
                conn.execute(
                    "UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE id = ?",
                    (time.time(), job_id),
                )
            elif status["status"] == "running":
                conn.execute("UPDATE jobs SET status = 'cancelling' WHERE id = ?", (job_id,))
            elif status["status"] != "cancelling":
                raise ConflictError(
                    f"job {job_id} has already finished ({status['status']}); nothing to cancel",
                    param="job_id",
                )
        return self.get_job(job_id)

    def set_outcome(
        self,
        job_id: str,
        *,
        scorecard: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
    ) -> bool:
        """Store a running job's scorecard and result before it is marked ``succeeded``;
        False (nothing stored) when the job is no longer running or cancelling."""
        with self._transaction() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET scorecard = ?, result = ?"
                " WHERE id = ? AND status IN ('running', 'cancelling')",
                (_dumps(scorecard), _dumps(result), job_id),
            )
        return cursor.rowcount == 1

    def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        error: dict[str, str] | None = None,
        result: dict[str, Any] | None = None,
    ) -> bool:
        """Move a ``running`` / ``cancelling`` job to a final status; False if it was not active.

        ``result``, when given, replaces the stored one (for example with the push outcome).
        """
        assert status in ("succeeded", "failed", "cancelled"), status
        with self._transaction() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, error = ?,"
                " result = COALESCE(?, result)"
                " WHERE id = ? AND status IN ('running', 'cancelling')",
                (status, time.time(), _dumps(error), _dumps(result), job_id),
            )
        return cursor.rowcount == 1

    def recover(self) -> tuple[list[str], list[str]]:
        """After a restart: settle the jobs that were running, and return the queued ones.

        A job whose worker had stored its result (the stitch was saved) is ``succeeded``
        (a push still pending is reported failed); any other running or cancelling job
        is ``failed`` with the code ``interrupted``.

        Returns
        -------
        queued : list of str
            Ids of ``queued`` jobs, oldest first, to be submitted again.
        interrupted_stitches : list of str
            Stitch ids of the jobs marked ``interrupted`` (any folder of theirs is stale).
        """
        error = {
            "code": "interrupted",
            "message": "the server stopped while the job was running; submit it again",
        }
        now = time.time()
        interrupted = []
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT id, stitch_id, result FROM jobs WHERE status IN ('running', 'cancelling')"
            ).fetchall()
            for row in rows:
                result = _loads(row["result"])
                if result is None:
                    interrupted.append(row["stitch_id"])
                    conn.execute(
                        "UPDATE jobs SET status = 'failed', finished_at = ?, error = ?"
                        " WHERE id = ?",
                        (now, _dumps(error), row["id"]),
                    )
                    continue
                if (result.get("push") or {}).get("status") == "pending":
                    result["push"] = {
                        "status": "failed",
                        "repo_id": result["push"].get("repo_id"),
                        "reason": "the server stopped during the upload",
                    }
                conn.execute(
                    "UPDATE jobs SET status = 'succeeded', finished_at = ?, result = ?"
                    " WHERE id = ?",
                    (now, _dumps(result), row["id"]),
                )
        return self.queued_job_ids(), interrupted

    # ------------------------------------------------------------ datasets
    def add_dataset(self, dataset_id: str, info: dict[str, Any], path: str) -> DatasetRecord:
        """Record an uploaded dataset whose file is already in place."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO datasets (id, info, path, created_at) VALUES (?, ?, ?, ?)",
                (dataset_id, _dumps(info), path, time.time()),
            )
        return self.get_dataset(dataset_id)

    def get_dataset(self, dataset_id: str) -> DatasetRecord:
        """The dataset with this id.

        Raises
        ------
        DatasetNotFoundError
            If there is none.
        """
        row = (
            self._connection()
            .execute("SELECT * FROM datasets WHERE id = ?", (dataset_id,))
            .fetchone()
        )
        if row is None:
            raise DatasetNotFoundError(f"no dataset with id {echo(dataset_id)}", param="dataset")
        return DatasetRecord(row["id"], json.loads(row["info"]), row["path"], row["created_at"])

    def list_datasets(
        self, *, limit: int = 20, after: str | None = None
    ) -> tuple[list[DatasetRecord], bool]:
        """Datasets newest first, ``limit`` of them after the dataset ``after``; and whether more
        follow."""
        conn = self._connection()
        cutoff = None
        if after is not None:
            row = conn.execute("SELECT seq FROM datasets WHERE id = ?", (after,)).fetchone()
            if row is None:
                raise DatasetNotFoundError(f"no dataset with id {echo(after)}", param="after")
            cutoff = row["seq"]
        rows = conn.execute(
            "SELECT * FROM datasets WHERE seq < ? ORDER BY seq DESC LIMIT ?",
            (cutoff if cutoff is not None else 2**62, limit + 1),
        ).fetchall()
        records = [
            DatasetRecord(r["id"], json.loads(r["info"]), r["path"], r["created_at"])
            for r in rows[:limit]
        ]
        return records, len(rows) > limit

    def data_paths(self) -> set[str]:
        """Paths (relative to the data dir) of every dataset file and job data file on record."""
        conn = self._connection()
        rows = conn.execute("SELECT path FROM datasets UNION SELECT data_path FROM jobs").fetchall()
        return {r[0] for r in rows}

    def delete_dataset(self, dataset_id: str) -> DatasetRecord:
        """Forget a dataset (the caller removes its file).

        Raises
        ------
        DatasetNotFoundError
            If there is none.
        ConflictError
            If a queued or running job still reads it.
        """
        record = self.get_dataset(dataset_id)
        with self._transaction() as conn:
            busy = conn.execute(
                "SELECT id FROM jobs WHERE dataset_id = ? AND status IN (?, ?, ?)",
                (dataset_id, *ACTIVE_STATUSES),
            ).fetchone()
            if busy is not None:
                raise ConflictError(
                    f"dataset {dataset_id} is used by the unfinished job {busy['id']}",
                    param="dataset",
                )
            cursor = conn.execute("DELETE FROM datasets WHERE id = ?", (dataset_id,))
        if cursor.rowcount != 1:
            raise DatasetNotFoundError(f"no dataset with id {echo(dataset_id)}", param="dataset")
        return record
