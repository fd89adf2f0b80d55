"""Job leases: which runner holds a running job, until when, and what happens when it stops.

A runner (one per replica, see :func:`owner_id`) claims the oldest queued job with
:meth:`LeaseOps.claim_next`, which sets the job's ``owner`` and ``lease_until`` and counts an
attempt; it renews the leases of its jobs every few seconds (:meth:`LeaseOps.renew_leases`).
A job whose lease expired, or whose owner is a dead process on this host, is settled by
:meth:`LeaseOps.reap` (any replica may call it); a runner that stops gracefully hands its jobs
back with :meth:`LeaseOps.release`. Settling a job (one transaction per job):

* its result is stored (the stitch was saved and published) → ``succeeded`` (a push still
  ``pending`` is reported failed);
* it was ``cancelling`` → ``cancelled``;
* fewer than ``max_attempts`` attempts → ``queued`` again, for any runner to claim;
* else → ``failed`` with the code ``interrupted``.

A graceful stop (a deploy, a configuration change) is not the job's fault: :meth:`LeaseOps.
release` queues the job again and gives its attempt back, so only runs that died or lost
their lease count against ``max_attempts`` (an adversarial pass saw two routine restarts
fail a training job).

Lease times come from the database's clock (one clock for every replica), in Unix seconds.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterable
from typing import Any

from service.jobs.db import Connection, Database
from service.jobs.records import JobRecord, dumps, loads

__all__ = ["LeaseOps", "owner_id", "owner_is_dead"]

_HELD = "status IN ('running', 'cancelling')"


def owner_id() -> str:
    """A new runner id, ``host/pid/random`` (one per runner; two runners of one process differ)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def owner_is_dead(owner: str) -> bool:
    """Whether ``owner`` (an :func:`owner_id`) is a process of this host that no longer runs.

    False when the owner runs on another host (only its lease tells), is alive, or is not an
    owner id at all.
    """
    parts = owner.rsplit("/", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    return False


def _interrupted(why: str, attempts: int) -> dict[str, str]:
    return {
        "code": "interrupted",
        "message": f"the job was interrupted: {why} after {attempts} attempt(s); submit it again",
    }


def _settle(conn: Connection, row: dict[str, Any], max_attempts: int, why: str) -> JobRecord:
    """Settle one held job (``row``, locked by the caller's transaction); its new record.
    ``max_attempts`` 0: a graceful stop, queued again with its attempt given back."""
    sets: dict[str, Any] = {"lease_until": None}
    result = loads(row["result"])
    if result is not None:
        if (result.get("push") or {}).get("status") == "pending":
            result["push"] = {
                "status": "failed",
                "repo_id": result["push"].get("repo_id"),
                "reason": "the server stopped during the upload",
            }
        sets |= {"status": "succeeded", "finished_at": time.time(), "result": dumps(result)}
    elif row["status"] == "cancelling":
        sets |= {"status": "cancelled", "finished_at": time.time()}
    elif row["attempts"] < max_attempts or not max_attempts:
        sets |= {"status": "queued", "owner": None, "started_at": None, "stage": None}
        sets |= {"step": 0, "total": 0, "scorecard": None}
        if not max_attempts:  # a graceful stop: this run does not count
            sets["attempts"] = max(row["attempts"] - 1, 0)
    else:
        error = _interrupted(why, row["attempts"])
        sets |= {"status": "failed", "finished_at": time.time(), "error": dumps(error)}
    assignments = ", ".join(f"{column} = ?" for column in sets)
    done = conn.execute(
        f"UPDATE jobs SET {assignments} WHERE id = ? RETURNING *", (*sets.values(), row["id"])
    ).fetchone()
    assert done is not None
    return JobRecord.from_row(done)


def _placeholders(values: list[str]) -> str:
    return ", ".join("?" * len(values))


class LeaseOps:
    """The lease operations of :class:`~service.jobs.store.JobStore` (a mixin)."""

    _db: Database

    def claim_next(self, owner: str, lease_s: float) -> JobRecord | None:
        """Claim the oldest ``queued`` job for ``owner``: ``running``, leased for ``lease_s``
        seconds, one more attempt, stage ``starting``. None when no job is queued.

        On PostgreSQL the candidate row is locked with ``FOR UPDATE SKIP LOCKED``, so runners
        claiming at the same time never get the same job.
        """
        db = self._db
        row = (
            db.connection()
            .execute(
                "UPDATE jobs SET status = 'running', owner = ?, lease_until = "
                f"{db.now} + ?, attempts = attempts + 1, started_at = ?, stage = 'starting',"
                " step = 0, total = 0, error = NULL"
                " WHERE status = 'queued' AND id = (SELECT id FROM jobs WHERE status = 'queued'"
                f" ORDER BY seq LIMIT 1{db.skip_locked}) RETURNING *",
                (owner, float(lease_s), time.time()),
            )
            .fetchone()
        )
        return None if row is None else JobRecord.from_row(row)

    def renew_leases(self, owner: str, job_ids: Iterable[str], lease_s: float) -> set[str]:
        """Extend to now + ``lease_s`` seconds the leases of those ``job_ids`` that ``owner``
        still holds (running or cancelling); the ids renewed. A job left out was taken away
        (reaped, or finished elsewhere): its runner stops working on it."""
        ids = list(job_ids)
        if not ids:
            return set()
        rows = (
            self._db.connection()
            .execute(
                f"UPDATE jobs SET lease_until = {self._db.now} + ?"
                f" WHERE owner = ? AND {_HELD} AND id IN ({_placeholders(ids)}) RETURNING id",
                (float(lease_s), owner, *ids),
            )
            .fetchall()
        )
        return {r["id"] for r in rows}

    def active_statuses(self, job_ids: Iterable[str]) -> dict[str, str]:
        """The current status of each of ``job_ids`` that exists, by id (a cheap read that
        shows cancellations requested through another replica)."""
        ids = list(job_ids)
        if not ids:
            return {}
        rows = (
            self._db.connection()
            .execute(f"SELECT id, status FROM jobs WHERE id IN ({_placeholders(ids)})", ids)
            .fetchall()
        )
        return {r["id"]: r["status"] for r in rows}

    def reap(self, max_attempts: int) -> list[JobRecord]:
        """Settle every running or cancelling job whose lease expired (or was never set) or
        whose owner is a dead process of this host (see the module docstring).

        Returns
        -------
        list of JobRecord
            The settled jobs, as they are now.
        """
        db = self._db
        expired = f"(lease_until IS NULL OR lease_until < {db.now})"
        candidates = (
            db.connection()
            .execute(f"SELECT id, owner, {expired} AS expired FROM jobs WHERE {_HELD} ORDER BY seq")
            .fetchall()
        )
        settled = []
        for candidate in candidates:
            if not (candidate["expired"] or owner_is_dead(candidate["owner"] or "")):
                continue
            with db.transaction() as conn:  # check again: renewed or settled meanwhile?
                row = conn.execute(
                    f"SELECT *, {expired} AS expired FROM jobs WHERE id = ? AND {_HELD}"
                    f"{db.skip_locked}",
                    (candidate["id"],),
                ).fetchone()
                if row is not None and (row["expired"] or owner_is_dead(row["owner"] or "")):
                    why = "its replica or worker stopped or died (lease expired)"
                    settled.append(_settle(conn, row, max_attempts, why))
        return settled

    def release(self, owner: str) -> list[JobRecord]:
        """Hand back the jobs that ``owner`` holds, at a graceful stop of its runner: settled
        as :meth:`reap` does, except that a job that must run again is queued with its
        attempt given back (the stop was not its fault); the settled jobs."""
        with self._db.transaction() as conn:
            rows = conn.execute(
                f"SELECT * FROM jobs WHERE owner = ? AND {_HELD} ORDER BY seq{self._db.for_update}",
                (owner,),
            ).fetchall()
            return [_settle(conn, row, 0, "its replica stopped") for row in rows]
