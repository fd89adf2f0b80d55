"""Versioned schema migrations of the job store, for SQLite and PostgreSQL.

:data:`MIGRATIONS` is an ordered list; each step brings a database from the version before it
to its own. SQLite keeps the version in ``PRAGMA user_version`` and applies pending steps
inside one ``BEGIN IMMEDIATE`` transaction; PostgreSQL keeps it in the table
``lead_schema_version`` (one row per applied step) and applies them in one transaction that
first takes ``pg_advisory_xact_lock``, so that replicas starting together wait for each other
instead of racing. A database newer than this code is refused.

Versions:

1. ``jobs`` and ``datasets`` (the schema of the first release).
2. Leases: ``jobs.attempts``, ``jobs.owner``, ``jobs.lease_until``; at most one job that is
   not failed or cancelled per stitch id (a unique partial index); dataset and job-data bytes
   in ``lead_blobs`` (PostgreSQL only: a SQLite store keeps them as files).
3. ``dataset_tombstones``: the listing position (``seq``) of each deleted dataset, so that
   ``GET /v1/datasets?after=`` a dataset deleted meanwhile continues where it stood.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.jobs.db import Connection, Database

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Migration", "migrate"]


@dataclass(frozen=True)
class Migration:
    """One step: its version and its statements (``;``-separated) per backend."""

    version: int
    sqlite: str
    postgresql: str


_JOBS = """
CREATE TABLE IF NOT EXISTS jobs (
    seq {seq},
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
    created_at {real} NOT NULL,
    started_at {real},
    finished_at {real},
    scorecard TEXT,
    result TEXT,
    error TEXT,
    idempotency_key TEXT UNIQUE,
    request_hash TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
CREATE TABLE IF NOT EXISTS datasets (
    seq {seq},
    id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL,
    path TEXT NOT NULL,
    created_at {real} NOT NULL
)
"""
_LEASES = """
ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN owner TEXT;
ALTER TABLE jobs ADD COLUMN lease_until {real};
UPDATE jobs SET attempts = 1 WHERE started_at IS NOT NULL;
CREATE UNIQUE INDEX jobs_stitch_id_producer ON jobs (stitch_id)
    WHERE status NOT IN ('failed', 'cancelled')
"""
_SQLITE = {"seq": "INTEGER PRIMARY KEY AUTOINCREMENT", "real": "REAL"}
_POSTGRESQL = {"seq": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "real": "DOUBLE PRECISION"}
_BLOBS = """;
CREATE TABLE lead_blobs (
    key TEXT NOT NULL,
    part INTEGER NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (key, part)
)
"""
_TOMBSTONES = """
CREATE TABLE dataset_tombstones (
    id TEXT NOT NULL PRIMARY KEY,
    seq BIGINT NOT NULL
)
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, _JOBS.format(**_SQLITE), _JOBS.format(**_POSTGRESQL)),
    Migration(2, _LEASES.format(**_SQLITE), _LEASES.format(**_POSTGRESQL) + _BLOBS),
    Migration(3, _TOMBSTONES, _TOMBSTONES),
)
SCHEMA_VERSION = MIGRATIONS[-1].version
_LOCK_KEY = 0x1EAD_5C4E_3A00  # pg_advisory_xact_lock key of LEAD's schema migrations


def _apply(conn: Connection, db: Database, version: int) -> list[int]:
    """Apply the steps after ``version``; the versions applied."""
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"the job database {db.location} has schema version {version}, newer than this "
            f"LEAD (which knows up to {SCHEMA_VERSION}); upgrade LEAD"
        )
    applied = []
    for step in MIGRATIONS:
        if step.version > version:
            sql = step.sqlite if db.backend == "sqlite" else step.postgresql
            for statement in sql.split(";"):
                if statement.strip():
                    conn.execute(statement)
            applied.append(step.version)
    return applied


def migrate(db: Database) -> list[int]:
    """Bring ``db`` to :data:`SCHEMA_VERSION`; the versions applied (empty when current).

    Raises
    ------
    RuntimeError
        If the database has a newer schema version than this code knows.
    """
    with db.transaction() as conn:
        if db.backend == "sqlite":
            row = conn.execute("PRAGMA user_version").fetchone()
            assert row is not None
            applied = _apply(conn, db, int(row["user_version"]))
            if applied:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return applied
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS lead_schema_version"
            " (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        row = conn.execute(
            "SELECT COALESCE(MAX(version), 0) AS v FROM lead_schema_version"
        ).fetchone()
        assert row is not None
        applied = _apply(conn, db, int(row["v"]))
        for version in applied:
            conn.execute("INSERT INTO lead_schema_version (version) VALUES (?)", (version,))
        return applied
