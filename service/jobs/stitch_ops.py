"""What the job store records of the stitches that jobs produce: at most one job per stitch
id (not failed or cancelled), deletions, and the states of the succeeded jobs' stitches."""

from __future__ import annotations

import time
from typing import Any

from lead.errors import ConflictError
from service.errors import echo
from service.jobs.db import Connection, Database
from service.jobs.records import JobRecord, StitchState, dumps, loads

__all__ = ["StitchOps"]


class StitchOps:
    """The stitch operations of :class:`~service.jobs.store.JobStore` (a mixin)."""

    _db: Database

    def _producer(self, conn: Connection, stitch_id: str) -> dict[str, Any] | None:
        """The job (at most one) that produces or produced ``stitch_id``: not failed or
        cancelled; locked inside a transaction on PostgreSQL."""
        return conn.execute(
            "SELECT id, status, result FROM jobs"
            f" WHERE stitch_id = ? AND status NOT IN ('failed', 'cancelled'){self._db.for_update}",
            (stitch_id,),
        ).fetchone()

    def _check_producer(self, conn: Connection, stitch_id: str) -> None:
        taken = self._producer(conn, stitch_id)
        if taken is not None:
            deleted = (loads(taken["result"]) or {}).get("stitch_deleted_at") is not None
            raise ConflictError(
                f"stitch id {stitch_id!r} was produced by job {taken['id']} and deleted; "
                "the ids of deleted stitches are not used again"
                if deleted
                else f"stitch id {stitch_id!r} is already produced by job {taken['id']}",
                param="stitch_id",
            )

    def mark_stitch_deleted(self, stitch_id: str) -> JobRecord | None:
        """Record in the job that trained ``stitch_id`` that the stitch is deleted
        (``result.stitch_deleted_at``, Unix seconds); None when no job produced it.

        Raises
        ------
        ConflictError
            If the job has not succeeded yet (queued, running or cancelling).
        """
        with self._db.transaction() as conn:
            row = self._producer(conn, stitch_id)
            if row is None:
                return None
            if row["status"] != "succeeded":
                raise ConflictError(
                    f"stitch {echo(stitch_id)} is still being trained by job {row['id']} "
                    f"({row['status']}); cancel the job instead",
                    param="stitch_id",
                )
            result = loads(row["result"]) or {"stitch_id": stitch_id}
            if result.get("stitch_deleted_at") is None:
                result["stitch_deleted_at"] = int(time.time())
                result["served"] = False
                result["not_served_reason"] = "deleted (DELETE /v1/stitches/{id})"
            done = conn.execute(
                "UPDATE jobs SET result = ? WHERE id = ? RETURNING *", (dumps(result), row["id"])
            ).fetchone()
        assert done is not None
        return JobRecord.from_row(done)

    def stitch_deleted_at(self, stitch_id: str) -> tuple[str, int] | None:
        """(job id, Unix seconds) when a job's stitch ``stitch_id`` was deleted, else None."""
        row = self._producer(self._db.connection(), stitch_id)
        if row is None:
            return None
        deleted = (loads(row["result"]) or {}).get("stitch_deleted_at")
        return None if deleted is None else (str(row["id"]), int(deleted))

    def succeeded_stitches(self) -> dict[str, StitchState]:
        """What the succeeded jobs' results say of their stitches, by stitch id, oldest
        job first (by ``finished_at``); jobs still running or cancelling come last, with
        ``finished`` false (the replica that trained one may be registering its stitch)."""
        rows = (
            self._db.connection()
            .execute(
                "SELECT stitch_id, status, finished_at, result FROM jobs"
                " WHERE status IN ('succeeded', 'running', 'cancelling')"
                " ORDER BY status <> 'succeeded', finished_at, stitch_id"
            )
            .fetchall()
        )
        states = {}
        for row in rows:
            result = loads(row["result"]) or {}
            states[row["stitch_id"]] = StitchState(
                # records from before ``served`` existed count as served
                served=result.get("served") is not False,
                deleted=result.get("stitch_deleted_at") is not None,
                finished=row["status"] == "succeeded",
            )
        return states
