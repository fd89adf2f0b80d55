"""What the job store returns: frozen records of jobs and datasets, and their JSON columns."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DatasetRecord", "JobRecord", "StitchState", "dumps", "loads", "new_id"]


def new_id(prefix: str) -> str:
    """A random id such as ``job_3f9c0a1b2d4e5f60718293a4`` (96 random bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def loads(text: str | None) -> Any:
    """A JSON column's value (None for SQL NULL)."""
    return None if text is None else json.loads(text)


def dumps(value: Any) -> str | None:
    """A JSON column's text (SQL NULL for None); keys sorted, no NaN."""
    return None if value is None else json.dumps(value, sort_keys=True, allow_nan=False)


@dataclass(frozen=True)
class JobRecord:
    """One training job as stored. ``request`` is the normalised request body.

    ``attempts`` counts the times a runner claimed the job, less the runs that a graceful
    stop handed back (:meth:`~service.jobs.leases.LeaseOps.release`); ``owner`` is the runner that
    holds (or last held) it (see :func:`service.jobs.leases.owner_id`) and ``lease_until``
    (Unix seconds) the end of its lease, None when no runner holds it.
    """

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
    attempts: int
    owner: str | None
    lease_until: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobRecord:
        """The record of one ``jobs`` row (a mapping of column names to values)."""
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
            scorecard=loads(row["scorecard"]),
            result=loads(row["result"]),
            error=loads(row["error"]),
            attempts=row["attempts"],
            owner=row["owner"],
            lease_until=row["lease_until"],
        )


@dataclass(frozen=True)
class StitchState:
    """What a succeeded (or still finishing) job's result says of its stitch."""

    served: bool  # false below the baseline (unless allowed) and once deleted
    deleted: bool  # DELETE /v1/stitches/{id} committed (the folder may remain)
    #: False while the job is still running: its stitch may be published and being
    #: registered by the replica that trained it, which marks it succeeded right after
    finished: bool = True


@dataclass(frozen=True)
class DatasetRecord:
    """One uploaded dataset: ``info`` holds its shapes, dtype, size and checksum."""

    id: str
    info: dict[str, Any]
    path: str
    created_at: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> DatasetRecord:
        """The record of one ``datasets`` row."""
        return cls(row["id"], json.loads(row["info"]), row["path"], row["created_at"])
