"""File bytes in PostgreSQL, so that every replica and every worker can read them.

A blob is a file cut into parts of :data:`PART_BYTES` in the table ``lead_blobs(key, part,
data)``; its key is the file's path relative to the data dir (``datasets/ds_x.safetensors``,
``job-data/job_x.safetensors``). Writes replace the whole blob in one transaction; reads
stream it part by part through a server-side cursor (one statement: one consistent
snapshot) into a temporary file that is renamed into place, so memory stays at one part and
a reader never sees half a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from lead._durable import atomic_write
from service.jobs.db import PostgresDatabase

__all__ = ["PART_BYTES", "delete_blob", "fetch_blob", "put_blob"]

PART_BYTES = 8 * 1024 * 1024


class _Absent(Exception):
    """No blob with the key (raised inside the write callback to drop the temporary file)."""


def put_blob(db: PostgresDatabase, key: str, path: Path) -> None:
    """Store the file at ``path`` under ``key``, replacing any blob of that key."""
    from psycopg.rows import tuple_row

    conn = db.raw()
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cursor:
        cursor.execute("DELETE FROM lead_blobs WHERE key = %s", (key,))
        with Path(path).open("rb") as handle:
            part = 0
            while True:
                chunk = handle.read(PART_BYTES)
                if chunk or part == 0:  # an empty file is one empty part: it exists
                    cursor.execute(
                        "INSERT INTO lead_blobs (key, part, data) VALUES (%s, %s, %b)",
                        (key, part, chunk),
                    )
                if len(chunk) < PART_BYTES:
                    break
                part += 1


def fetch_blob(db: PostgresDatabase, key: str, dest: Path) -> bool:
    """Write the blob ``key`` to ``dest`` atomically; False (``dest`` untouched) when absent."""
    from psycopg.rows import tuple_row

    conn = db.raw()

    def write(handle: IO[bytes]) -> None:
        parts = 0
        with conn.cursor(name="lead_blob", row_factory=tuple_row, binary=True) as cursor:
            cursor.itersize = 1  # one part in memory at a time
            cursor.execute("SELECT data FROM lead_blobs WHERE key = %s ORDER BY part", (key,))
            for (data,) in cursor:
                handle.write(data)
                parts += 1
        if parts == 0:
            raise _Absent

    try:
        with conn.transaction():  # a server-side cursor lives in a transaction
            atomic_write(dest, write)
    except _Absent:
        return False
    return True


def delete_blob(db: PostgresDatabase, key: str) -> None:
    """Remove the blob ``key`` (nothing when there is none)."""
    db.connection().execute("DELETE FROM lead_blobs WHERE key = ?", (key,))
