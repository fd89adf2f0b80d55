"""Qdrant stores: read one dense vector of a collection, write a new collection or vector.

URIs: ``qdrant://host:port/collection?vector=NAME`` for a Qdrant server (port 6333 when
left out), ``qdrant:///abs/path/to/storage/collection`` for qdrant-client's local
(embedded) mode, whose storage folder is ``/abs/path/to/storage``. ``vector`` names a
named vector; without it the collection's unnamed vector is used (or its only named one;
a collection with several is refused, listing their names). The other query parameters go
to :class:`qdrant_client.QdrantClient`: ``api_key``, ``https``, ``prefix``, ``timeout``,
``prefer_grpc``, ``grpc_port``, ``pool_size``, ``check_compatibility`` (off unless set:
LEAD checks what it needs itself). ``api_key`` is shown as ``***`` in every message and
record. A target takes ``distance=Cosine|Dot|Euclid|Manhattan`` (default Cosine; a source
ignores it, so a target's URI can be the next migration's source).

A source is scrolled in point-id order (integer ids before UUIDs, as Qdrant orders them),
one vector and no payload per point; a position is the last id of a batch. Its ids are
int64 when the points' ids are integers, else the UUIDs as text in Qdrant's canonical
spelling (lowercase, hyphenated; a collection mixing both is refused). Its
:meth:`~QdrantSource.fetch` and :meth:`~QdrantSource.texts` take any spelling of a UUID
for that point, and other text for the point a target made of it (below). Qdrant refuses
NaN, but local mode keeps infinity (and stores a value beyond float32 as infinity), and a
server is not documented to refuse it; so :meth:`QdrantSource.check` reads every vector
once and refuses a non-finite one, naming its id, before anything is written.

The target (a new collection or named vector) is in :mod:`lead.migrate.qdrant_target`.

Local mode locks its storage folder, so every store of one folder in a process shares one
client (closed with the last store), its calls serialised by a lock. It commits each
point in its own SQLite transaction, so it writes about 120 points a second to a
disk that syncs (measured here): a server is the store for anything large.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lead.errors import (
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    StoreNotFoundError,
)
from lead.migrate._qdrant import (
    FIRST_UUID,
    LEAD_NAMESPACE,
    Collection,
    fetched,
    has_vector,
    pick_vector,
    source_point,
    vector_of,
)
from lead.migrate.stores import (
    Batch,
    SourceInfo,
    StoreURI,
    first_zero_row,
    ordered_texts,
    with_params,
    zero_row_error,
)

__all__ = ["LEAD_NAMESPACE", "QdrantSource"]


class QdrantSource(Collection):
    """One dense vector of a Qdrant collection, scrolled in point-id order (see the module
    docstring).

    Raises
    ------
    StoreError
        The server cannot be reached or refuses the API key; the local folder is locked.
    StoreNotFoundError
        No such storage folder, collection or named vector.
    InvalidInputError
        A bad URI; several named vectors and no ``?vector=``; a sparse or multivector.
    """

    def __init__(self, parsed: StoreURI) -> None:
        super().__init__(parsed, create=False)
        try:
            self._describe()
        except BaseException:
            self.close()
            raise

    def _describe(self) -> None:
        config = self._config()
        if config is None:
            raise self._missing()
        self.vector, params = pick_vector(config, self.address)
        self.name = f"{self.collection}.{self.vector}" if self.vector else self.collection
        rows = self.call(lambda c: c.count(self.collection, exact=True)).count
        nulls = self.call(
            lambda c: c.count(self.collection, count_filter=has_vector(self.vector, present=False))
        ).count
        first = self._first_id(None)
        first_uuid = self._first_id(FIRST_UUID) if isinstance(first, int) else None
        self._mixed = (first, first_uuid) if first_uuid is not None else None
        datatype = getattr(params.datatype, "value", params.datatype) or "float32"
        uri = with_params(self.address.uri, vector=self.vector or None)
        kind = "str" if isinstance(first, str) else "int"
        self.info = SourceInfo(uri, int(rows), int(params.size), kind, int(nulls), str(datatype))

    def _first_id(self, offset: str | None) -> Any:
        records, _ = self.scroll(limit=1, offset=offset, with_payload=False, with_vectors=False)
        return records[0].id if records else None

    def check(self, *, skip_null: bool = False, zero_rows: bool = False) -> None:
        """Refuse mixed integer / UUID ids, points without the vector (unless
        ``skip_null``), non-finite values and, with ``zero_rows``, all-zero vectors; point
        ids are unique in Qdrant. Reads every vector once (see the module docstring).

        Raises
        ------
        InvalidInputError
            Naming an offending id.
        NonFiniteError
            A vector holding infinity or NaN, naming its id.
        ZeroVectorError
            With ``zero_rows``: an all-zero vector, naming its id.
        """
        if self._mixed is not None:
            raise InvalidInputError(
                f"{self.info.uri} mixes integer point ids (such as {self._mixed[0]}) with "
                f"UUIDs (such as {self._mixed[1]}); LEAD migrates all-integer or all-UUID ids",
                param="id",
            )
        if self.info.null_rows and not skip_null:
            records, _ = self.scroll(
                scroll_filter=has_vector(self.vector, present=False), limit=1, with_payload=False
            )
            first = records[0].id if records else "?"
            raise InvalidInputError(
                f"{self.info.null_rows} points of {self.name} have no such vector (the "
                f"first: id {first}); pass --skip-null to leave them out of the target",
                param="vector",
            )
        read = 0
        for batch in self.batches(4096):  # each batch is checked as it is read
            zero = first_zero_row(batch.vectors) if zero_rows else None
            if zero is not None:
                raise zero_row_error(batch.ids[zero], self.name, "vector", read + zero)
            read += len(batch.ids)

    def batches(self, batch_size: int, after: Any = None) -> Iterator[Batch]:
        """Points with the vector in id order, after point id ``after``; one scroll request
        per batch.

        Raises
        ------
        NonFiniteError
            A vector holding infinity or NaN, naming its id.
        """
        offset, skip = after, after
        while True:
            limit = batch_size + (0 if skip is None else 1)
            records, following = self.scroll(
                scroll_filter=has_vector(self.vector, present=True),
                limit=limit,
                offset=offset,
                with_payload=False,
                with_vectors=[self.vector],
            )
            if skip is not None and records and records[0].id == skip:
                records = records[1:]
            skip = None
            if records:
                yield self._batch(records)
            if following is None:
                return
            offset = following

    def _batch(self, records: list[Any]) -> Batch:
        keys = [r.id for r in records]
        if self.info.id_kind == "int":
            if not all(isinstance(k, int) for k in keys):
                raise InvalidInputError(f"{self.info.uri}: a UUID among integer ids", param="id")
            ids = np.asarray(keys, dtype=np.int64)
        else:
            ids = np.empty(len(keys), dtype=object)
            ids[:] = [str(k) for k in keys]
        rows = [vector_of(r, self.vector) for r in records]
        if any(row is None for row in rows):
            bad = keys[[row is None for row in rows].index(True)]
            raise InvalidInputError(f"point {bad} of {self.name} lost its vector", param="id")
        vectors = np.asarray(rows, dtype=np.float32)
        if vectors.shape != (len(keys), self.info.dim):
            raise ShapeMismatchError(
                f"vectors of {self.name} are not of dimension {self.info.dim}",
                expected=self.info.dim,
                got=vectors.shape[-1],
                param="vector",
            )
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            bad = keys[int(np.argmin(finite))]
            raise NonFiniteError(
                f"the vector of id {bad} in {self.name} holds NaN or infinity", param="vector"
            )
        return Batch(ids, vectors, keys[-1])

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Vectors (len(ids), dim) float32 of the points ``ids``, in that order.

        Raises
        ------
        InvalidInputError
            An id that is not a point of the collection, or has no such vector.
        """
        ids = np.asarray(ids)
        keys = [source_point(k) for k in ids.tolist()]
        found = self._retrieve(keys, self.vector)
        return fetched(ids, found, keys, self.name)

    def sample_ids(self, n: int, seed: int) -> np.ndarray:
        """Up to ``n`` ids of points with the vector, a seeded random sample in id order
        (scrolls every id once, without vectors)."""
        keys = [k for page in self.point_ids() for k in page]
        rng = np.random.default_rng(seed)
        pick = np.sort(rng.choice(len(keys), size=min(int(n), len(keys)), replace=False))
        if self.info.id_kind == "int":
            return np.asarray([keys[i] for i in pick], dtype=np.int64)
        out = np.empty(len(pick), dtype=object)
        out[:] = [str(keys[i]) for i in pick]
        return out

    def point_ids(self, page: int = 10_000) -> Iterator[list[Any]]:
        """The ids of the points with the vector, in id order, ``page`` at a time (scrolled
        without vectors)."""
        offset: Any = None
        while True:
            records, offset = self.scroll(
                scroll_filter=has_vector(self.vector, present=True),
                limit=page,
                offset=offset,
                with_payload=False,
                with_vectors=False,
            )
            if records:
                yield [r.id for r in records]
            if offset is None:
                return

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """The payload field ``column`` of the points ``ids``, in that order.

        Raises
        ------
        StoreNotFoundError
            None of the points holds the payload field ``column``.
        InvalidInputError
            An id that is not a point of the collection, or whose point lacks the field
            (or holds something else than text), naming it.
        """
        ids = np.asarray(ids)
        keys = [source_point(k) for k in ids.tolist()]
        payloads: dict[Any, dict[str, Any]] = {}
        for start in range(0, len(keys), 1024):
            records = self._payload_page(keys[start : start + 1024], column)
            payloads.update((r.id, r.payload or {}) for r in records)
        if payloads and not any(column in p for p in payloads.values()):
            raise StoreNotFoundError(
                f"{self.info.uri}: no point of collection {self.collection!r} has the payload "
                f"field {column!r}",
                param="text_column",
            )
        found = {
            k: payloads[p].get(column)
            for k, p in zip(ids.tolist(), keys, strict=True)
            if p in payloads
        }
        return ordered_texts(ids, found, self.info.uri, column)

    def _payload_page(self, keys: list[Any], field: str) -> list[Any]:
        return self.call(
            lambda c: c.retrieve(self.collection, keys, with_payload=[field], with_vectors=False)
        )
