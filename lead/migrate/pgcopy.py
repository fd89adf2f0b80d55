"""PostgreSQL's binary ``COPY`` format for (id, pgvector) rows, parsed and built with NumPy.

A row is: int16 field count, then each field as int32 length + bytes. Ids travel as
``bigint`` (8 bytes, big-endian) or text (UTF-8); a pgvector ``vector`` as ``vector_send``
writes it (int16 dimension, int16 unused, then big-endian float32 values), a ``halfvec``
the same with float16 values. With integer ids every row has one size, so whole runs of
rows are read and written as one NumPy record array, with no Python object per value.

Sources: PostgreSQL, "COPY: Binary Format",
https://www.postgresql.org/docs/current/sql-copy.html; pgvector's ``vector_send`` /
``halfvec_send``, https://github.com/pgvector/pgvector.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from lead.errors import InvalidInputError, ShapeMismatchError, StoreError
from lead.migrate.stores import Batch

__all__ = ["COPY_HEADER", "COPY_TRAILER", "CopyParser", "copy_rows", "fetch_copy", "row_dtype"]

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
COPY_TRAILER = struct.pack(">h", -1)


def row_dtype(id_type: str | None, value: str, dim: int) -> np.dtype[Any]:
    """A binary COPY row of (integer id, vector) as one packed NumPy record."""
    width = np.dtype(value).itemsize
    fields: list[tuple[Any, ...]] = [("fields", ">i2")]
    if id_type is not None:
        fields += [("id_len", ">i4"), ("id", id_type)]
    fields += [("vec_len", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("values", value, (dim,))]
    dtype = np.dtype(fields)
    assert (
        dtype.itemsize == 2 + (4 + np.dtype(id_type).itemsize if id_type else 0) + 8 + width * dim
    )
    return dtype


class CopyParser:
    """Incremental parser of a binary COPY stream of (id, vector) rows.

    Integer ids: rows have one size, so whole runs of rows are viewed as a NumPy record
    array (after checking every row's length fields). Text ids: rows are walked one by
    one for their lengths, and the vectors gathered with NumPy.
    """

    def __init__(self, int_ids: bool, value: str, dim: int, name: str) -> None:
        self.value, self.dim, self.name = value, dim, name
        self.int_ids = int_ids
        self.row = row_dtype(">i8", value, dim) if int_ids else None
        self.buffer = bytearray()
        self.header_done = False
        self.ended = False
        self.ids: list[np.ndarray] = []
        self.vectors: list[np.ndarray] = []
        self.ready = 0
        self.vec_bytes = np.dtype(value).itemsize * dim

    def feed(self, chunk: Any) -> None:
        self.buffer += chunk
        if not self.header_done:
            if len(self.buffer) < 19:
                return
            if bytes(self.buffer[:11]) != COPY_HEADER[:11]:
                raise StoreError(f"{self.name}: not a binary COPY stream")
            ext = struct.unpack_from(">i", self.buffer, 15)[0]
            del self.buffer[: 19 + ext]
            self.header_done = True
        self._parse()

    def _parse(self) -> None:
        if self.row is not None:
            self._parse_fixed()
        else:
            self._parse_text()

    def _parse_fixed(self) -> None:
        assert self.row is not None
        size = self.row.itemsize
        count = len(self.buffer) // size
        if not count:
            self._check_trailer()
            return
        records = np.frombuffer(self.buffer, dtype=self.row, count=count).copy()
        del self.buffer[: count * size]
        if not (
            (records["fields"] == 2).all()
            and (records["id_len"] == self.row["id"].itemsize).all()
            and (records["vec_len"] == 4 + self.vec_bytes).all()
            and (records["dim"] == self.dim).all()
        ):
            raise ShapeMismatchError(
                f"a vector in {self.name} does not have dimension {self.dim}", param="column"
            )
        self.ids.append(records["id"].astype(np.int64))
        self.vectors.append(records["values"].astype(np.float32))
        self.ready += count
        self._check_trailer()

    def _parse_text(self) -> None:
        buf, at, offsets, ids = bytes(self.buffer), 0, [], []
        while len(buf) - at >= 2:
            (fields,) = struct.unpack_from(">h", buf, at)
            if fields == -1:
                self.ended = True
                at += 2
                break
            if len(buf) - at < 6:
                break
            (id_len,) = struct.unpack_from(">i", buf, at + 2)
            head = at + 6 + id_len
            if len(buf) < head + 4:
                break
            (vec_len,) = struct.unpack_from(">i", buf, head)
            end = head + 4 + vec_len
            if len(buf) < end:
                break
            if vec_len != 4 + self.vec_bytes:
                raise ShapeMismatchError(
                    f"a vector in {self.name} does not have dimension {self.dim}", param="column"
                )
            ids.append(buf[at + 6 : head].decode())
            offsets.append(head + 8)
            at = end
        if offsets:
            values = np.frombuffer(buf, dtype=np.uint8)
            index = np.asarray(offsets)[:, None] + np.arange(self.vec_bytes)[None, :]
            raw = values[index].reshape(-1).view(self.value).reshape(len(offsets), self.dim)
            self.ids.append(np.asarray(ids, dtype=object))
            self.vectors.append(raw.astype(np.float32))
            self.ready += len(offsets)
        del self.buffer[:at]

    def _check_trailer(self) -> None:
        if len(self.buffer) >= 2 and struct.unpack_from(">h", self.buffer, 0)[0] == -1:
            self.ended = True
            del self.buffer[:2]

    def rows_ready(self) -> int:
        return self.ready

    def take(self, n: int) -> Batch:
        ids = np.concatenate(self.ids) if len(self.ids) > 1 else self.ids[0]
        vectors = np.concatenate(self.vectors) if len(self.vectors) > 1 else self.vectors[0]
        n = min(n, len(ids))
        head_ids, head_vectors = ids[:n], vectors[:n]
        self.ids = [ids[n:]] if n < len(ids) else []
        self.vectors = [vectors[n:]] if n < len(ids) else []
        self.ready -= n
        last = head_ids[-1]
        position = int(last) if self.int_ids else str(last)
        return Batch(head_ids, head_vectors, position)


def copy_rows(ids: np.ndarray, vectors: np.ndarray, value: str, int_ids: bool) -> bytes:
    """A binary COPY stream of (id, vector) rows (ids bigint or text)."""
    n, dim = vectors.shape
    if int_ids:
        records = np.empty(n, dtype=row_dtype(">i8", value, dim))
        records["fields"], records["id_len"], records["id"] = 2, 8, ids
        records["vec_len"] = 4 + np.dtype(value).itemsize * dim
        records["dim"], records["unused"], records["values"] = dim, 0, vectors
        return COPY_HEADER + records.tobytes() + COPY_TRAILER
    body = np.empty(n, dtype=row_dtype(None, value, dim))
    body["fields"], body["vec_len"] = 2, 4 + np.dtype(value).itemsize * dim
    body["dim"], body["unused"], body["values"] = dim, 0, vectors
    raw = body.tobytes()
    size = body.dtype.itemsize
    parts = [COPY_HEADER]
    for i, key in enumerate(ids):
        text = str(key).encode()
        parts += [
            raw[i * size : i * size + 2],
            struct.pack(">i", len(text)),
            text,
            raw[i * size + 2 : (i + 1) * size],
        ]
    parts.append(COPY_TRAILER)
    return b"".join(parts)


def fetch_copy(
    conn: Any,
    table: Any,
    column: Any,
    ident: Any,
    ids: np.ndarray,
    name: str,
    int_ids: bool,
    value: str,
    dim: int,
) -> np.ndarray:
    """Vectors of ``ids`` in that order, by one binary COPY.

    Raises
    ------
    InvalidInputError
        An id without a vector (missing, or NULL).
    """
    from psycopg import sql

    keys = [int(i) for i in ids] if int_ids else [str(i) for i in ids]
    query = sql.SQL(
        "COPY (SELECT {ident}, {col} FROM {tbl} WHERE {ident} = ANY({keys}) "
        "AND {col} IS NOT NULL) TO STDOUT (FORMAT BINARY)"
    ).format(ident=ident, col=column, tbl=table, keys=sql.Literal(keys))
    parser = CopyParser(int_ids, value, dim, name)
    with conn.cursor() as cursor, cursor.copy(query) as copy:
        for chunk in copy:
            parser.feed(chunk)
    found = parser.take(parser.rows_ready()) if parser.rows_ready() else None
    index = {} if found is None else {k: i for i, k in enumerate(found.ids.tolist())}
    missing = [k for k in keys if k not in index]
    if missing:
        raise InvalidInputError(
            f"{len(missing)} ids have no vector in {name} (the first: {missing[0]!r})",
            param="ids",
        )
    assert found is not None
    return found.vectors[[index[k] for k in keys]]
