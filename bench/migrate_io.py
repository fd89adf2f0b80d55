"""The I/O limit of a pgvector migration: copy a table out and back in, with no translation.

Run by ``bench.migrate`` in its own process (so its peak RSS is its own), beside ``lead
migrate apply`` on the same table. It does what ``apply`` does minus the stitch and the
checkpoints, with lead's own pieces so that nothing else differs: the source is read by
:meth:`lead.migrate.pgvector.PgVectorSource.batches` (one binary ``COPY (SELECT id, C ...
ORDER BY id) TO STDOUT`` stream, parsed with NumPy) in a read-ahead thread, each batch is
widened from 384 to 768 values by repeating its columns (NumPy, no stitch), and written
with ``copy_rows`` into one binary ``COPY ... FROM STDIN`` (one transaction) of a new table
made as ``apply`` makes its target (``id bigint PRIMARY KEY, C vector(768)``).

Usage: python -m bench.migrate_io SOURCE_URI TARGET_TABLE BATCH_SIZE
Prints one JSON line: rows, seconds (from opening the source to the commit).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    import psycopg

    from lead.migrate.apply import _read_ahead
    from lead.migrate.pgcopy import COPY_HEADER, COPY_TRAILER, copy_rows
    from lead.migrate.registry import open_source
    from lead.migrate.stores import parse_store_uri

    source_uri, table, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rows = 0
    with open_source(source_uri) as source:
        started = time.perf_counter()  # as apply's own timer: after the source is described
        dim = 2 * source.info.dim
        with psycopg.connect(parse_store_uri(source_uri).connect, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, emb vector({dim}))")
            copy_sql = f"COPY {table} (id, emb) FROM STDIN (FORMAT BINARY)"
            with conn.transaction(), conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                copy.write(COPY_HEADER)
                for batch in _read_ahead(source.batches(batch_size), depth=2):
                    wide = np.concatenate([batch.vectors, batch.vectors], axis=1)
                    data = copy_rows(batch.ids, wide, ">f4", True)
                    copy.write(memoryview(data)[len(COPY_HEADER) : -len(COPY_TRAILER)])
                    rows += len(batch.ids)
                copy.write(COPY_TRAILER)
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
