"""Tables of real SciFact vectors from the shipped fixture in the session's PostgreSQL (the
``pg_uri`` fixture of ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lead.migrate.stores import with_params


def sql(uri: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on its own connection; the rows it returns (if any)."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def make_table(
    uri: str, name: str, ids: np.ndarray, vectors: np.ndarray | list[Any], *, kind: str = "vector"
) -> str:
    """Create table ``name`` (id bigint primary key, emb vector(d)) holding the rows; returns
    its source URI. A ``None`` row is stored as NULL."""
    import psycopg

    dim = next(len(v) for v in vectors if v is not None)
    id_sql = "bigint" if np.asarray(ids).dtype.kind in "iu" else "text"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"CREATE TABLE {name} (id {id_sql} PRIMARY KEY, emb {kind}({dim}))")
        with conn.cursor() as cursor, cursor.copy(f"COPY {name} (id, emb) FROM STDIN") as copy:
            for key, row in zip(ids, vectors, strict=True):
                text = None if row is None else "[" + ",".join(repr(float(x)) for x in row) + "]"
                copy.write_row((key.item() if hasattr(key, "item") else key, text))
    return with_params(uri, table=name, column="emb")


def checksum(uri: str, table: str, column: str = "emb") -> str:
    """md5 of every (id, vector) of a table in id order: changes if any value does."""
    rows = sql(
        uri,
        f"SELECT md5(string_agg(id::text || ':' || {column}::text, ',' ORDER BY id)) FROM {table}",
    )
    return str(rows[0][0])


@pytest.fixture
def tmp_target(tmp_path: Path) -> Path:
    return tmp_path / "target"


@pytest.fixture(scope="session")
def unscored(tmp_path_factory: pytest.TempPathFactory, scifact_small: Any) -> Any:
    """A translator whose stitch has no confidence head (the bundled ones all have one)."""
    from lead.migrate.translator import LocalTranslator
    from tests.migrate._data import unscored_stitch

    folder = unscored_stitch(tmp_path_factory.mktemp("unscored") / "s", scifact_small)
    return LocalTranslator(folder)
