"""Qdrant as the target of a migration: a new collection, or a new named vector.

A target is a new collection, or a new named vector of an existing collection (Qdrant's
create-named-vector API, which older servers lack), filled by ``update_vectors`` so its
points keep their other vectors and payload. Integer ids become integer point ids; a text
id in the canonical spelling of a UUID becomes that UUID; any other text id, another
spelling of a UUID included (upper case, braces, no hyphens, ``urn:uuid:``), becomes
``uuid5(LEAD_NAMESPACE, id)`` with the id kept in the payload key ``lead_id``, so distinct
ids are distinct points; :meth:`QdrantTarget.fetch` maps ids the same way. The collection
or vector is made with the first batch, after its ids passed, so a negative integer id
(Qdrant ids are unsigned) leaves nothing behind when it is in the first batch, as in a
source read in id order (PostgreSQL); in a Parquet file out of id order it is refused when
its batch is reached. Before a new vector is added to an existing collection,
:meth:`QdrantTarget.check_source` reads the source's ids once and refuses one that is not
a point of it. Each batch is upserted with ``wait=True``, then the checkpoint written to
the collection's metadata (key ``lead_migration``, or ``lead_migration:NAME`` for a named
vector): a run killed in between writes that batch again, and as point ids are fixed every
row is still there exactly once. With Cosine distance Qdrant stores vectors L2-normalised
(cosine similarities are unchanged); use ``distance=Dot`` to keep the values as
translated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lead.errors import (
    ConflictError,
    InvalidInputError,
    StoreError,
    StoreNotFoundError,
)
from lead.migrate._qdrant import (
    ID_FIELD,
    Collection,
    fetched,
    point_key,
)
from lead.migrate.qdrant import QdrantSource
from lead.migrate.stores import (
    MigrationSpec,
    Progress,
    Source,
    SourceInfo,
    StoreURI,
    check_same_migration,
    with_params,
)

__all__ = ["QdrantTarget"]


class QdrantTarget(Collection):
    """A new collection, or a new named vector of an existing one (see the module docstring).

    Raises
    ------
    StoreError
        The server cannot be reached or refuses the API key; the local folder is locked.
    InvalidInputError
        A bad URI.
    """

    def __init__(self, parsed: StoreURI) -> None:
        super().__init__(parsed, create=True)
        self.vector = self.address.vector
        self.distance = self.address.distance or "Cosine"
        self.key = f"lead_migration:{self.vector}" if self.address.named else "lead_migration"
        self.uri = with_params(self.address.uri, vector=self.vector if self.address.named else None)
        self.spec: dict[str, Any] = {}
        self.new_collection = True
        self._pending: int | None = None  # the dimension of what the first write makes
        #: a payload field for each point's confidence (``--confidence-column``), or None
        self.confidence_column: str | None = None

    def _params(self, dim: int) -> Any:
        from qdrant_client import models

        return models.VectorParams(size=dim, distance=models.Distance(self.distance))

    def _vector_size(self, config: Any) -> int | None:
        vectors = config.params.vectors
        if not isinstance(vectors, dict):
            vectors = {"": vectors} if vectors is not None else {}
        params = vectors.get(self.vector)
        return None if params is None else int(params.size)

    def _save(self, progress: Progress) -> None:
        entry = {
            "spec": self.spec,
            "position": progress.position,
            "rows_written": progress.rows_written,
            "done": progress.done,
        }
        self.call(lambda c: c.update_collection(self.collection, metadata={self.key: entry}))

    def open(self, spec: MigrationSpec, source: SourceInfo) -> Progress:
        """Resume the same migration, or check that the collection or vector is free: the
        first :meth:`write` (or :meth:`finish`) makes it with its checkpoint.

        Raises
        ------
        ConflictError
            The collection (without ``?vector=``) or the named vector exists without this
            migration's checkpoint, or with another migration's (naming the setting that
            differs).
        StoreError
            The checkpoint's vector is gone and cannot be added again.
        """
        want = {**spec.as_dict(), "vector": self.vector, "distance": self.distance}
        config = self._config()
        entry = None if config is None else (config.metadata or {}).get(self.key)
        if entry is not None:
            have = dict(entry.get("spec") or {})
            check_same_migration(self.uri, want, have, ignore=("new_collection",))
            self.spec, self.new_collection = have, bool(have.get("new_collection", True))
            progress = Progress(
                entry.get("position"), int(entry.get("rows_written", 0)), bool(entry.get("done"))
            )
            if self._vector_size(config) is None:
                if self.new_collection or progress.rows_written:
                    raise ConflictError(
                        f"{self.uri}: the checkpoint says LEAD made this vector, but it is "
                        f"gone; delete {self.key!r} from the collection's metadata to start "
                        "again",
                        param="target",
                    )
                self._add_vector(spec.dim)  # a run killed between the checkpoint and this
            return progress
        if config is not None and (not self.address.named or self._vector_size(config) is not None):
            what = f"vector {self.vector!r} of " if self.address.named else ""
            raise ConflictError(
                f"{what}{self.uri} exists already and was not made by a LEAD migration; "
                "choose a new collection (or a new ?vector=NAME to add to this one)",
                param="target",
            )
        self._check_confidence_field(config)
        self.new_collection = config is None
        self.spec = {**want, "new_collection": self.new_collection}
        self._pending = spec.dim  # made by the first write (or finish): after its ids passed
        return Progress()

    def _check_confidence_field(self, config: Any | None) -> None:
        """Refuse a confidence field that would overwrite a payload: ``lead_id`` (where text
        ids are kept), or, in an existing collection, a field some point has already."""
        field = self.confidence_column
        if field is None:
            return
        if field == ID_FIELD:
            raise InvalidInputError(
                f"{self.uri}: the confidence field cannot be named {ID_FIELD!r}, where LEAD "
                "keeps text ids; choose another --confidence-column",
                param="confidence_column",
            )
        if config is None:
            return
        from qdrant_client import models

        present = models.Filter(
            must_not=models.IsEmptyCondition(is_empty=models.PayloadField(key=field))
        )
        taken = self.call(lambda c: c.count(self.collection, count_filter=present, exact=True))
        if taken.count:
            raise ConflictError(
                f"{self.uri}: {taken.count} points of {self.collection!r} have a payload field "
                f"{field!r} already; choose another --confidence-column",
                param="confidence_column",
            )

    def check_source(self, source: Source) -> None:
        """Before :meth:`open`: when this run adds a vector to an existing collection,
        refuse a source id that is not a point of it. Reads the source's ids once (a Qdrant
        source's without vectors, any other's with them); not for a source that is this
        collection, a new collection, or a resumed run (checked when it started).

        Raises
        ------
        InvalidInputError
            Naming the first source id that is not a point, or a negative one.
        """
        if not self.address.named:
            return
        config = self._config()
        if config is None or self.key in (config.metadata or {}):
            return
        if self._vector_size(config) is not None:
            return  # open() refuses it
        if isinstance(source, QdrantSource):
            if source.address.same_collection(self.address):
                return
            pages: Iterator[Any] = (np.asarray(p, dtype=object) for p in source.point_ids(1024))
        else:
            pages = (batch.ids for batch in source.batches(8192))
        for ids in pages:
            self._require_points(ids, [point_key(k)[0] for k in ids.tolist()])

    def _require_points(self, ids: np.ndarray, keys: list[Any]) -> None:
        """Refuse the first of ``ids`` (point ids ``keys``) that is not a point."""
        for start in range(0, len(keys), 1024):
            page = keys[start : start + 1024]
            found = {r.id for r in self._points(page)}
            for key, point in zip(ids[start : start + 1024].tolist(), page, strict=True):
                if point not in found:
                    raise InvalidInputError(
                        f"{self.uri}: id {key!r} of the source is not a point of collection "
                        f"{self.collection!r}; a new vector is added to the points of the "
                        "same ids",
                        param="ids",
                    )

    def _points(self, keys: list[Any]) -> list[Any]:
        return self.call(
            lambda c: c.retrieve(self.collection, keys, with_payload=False, with_vectors=False)
        )

    def _start(self) -> None:
        """Make the collection, or the checkpoint and then the vector (a kill between the
        two resumes), if :meth:`open` left them to the first write."""
        if self._pending is None:
            return
        dim, self._pending = self._pending, None
        if not self.new_collection:
            self._save(Progress())
            self._add_vector(dim)
            return
        vectors = {self.vector: self._params(dim)} if self.address.named else None
        self.call(
            lambda c: c.create_collection(
                self.collection,
                vectors_config=vectors or self._params(dim),
                metadata={self.key: {"spec": self.spec, "position": None, "rows_written": 0}},
            )
        )
        made = self._config()
        if made is None or self.key not in (made.metadata or {}):
            self.call(lambda c: c.delete_collection(self.collection))  # empty, just made by us
            raise StoreError(
                f"{self.uri}: this Qdrant server keeps no collection metadata, where LEAD "
                "keeps its checkpoint; upgrade Qdrant",
            )

    def _add_vector(self, dim: int) -> None:
        from qdrant_client import models

        params = self._params(dim)
        config = models.DenseVectorNameConfig(
            dense=models.DenseVectorConfig(size=params.size, distance=params.distance)
        )
        try:
            self.call(
                lambda c: c.create_vector_name(self.collection, self.vector, config, wait=True)
            )
        except StoreError as error:
            raise StoreError(
                f"{self.uri}: Qdrant could not add vector {self.vector!r} to the collection "
                f"({error}); older servers cannot add a named vector: choose a new collection",
            ) from None

    def write(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        progress: Progress,
        confidence: np.ndarray | None = None,
    ) -> None:
        """Upsert the points (or update their new vector), wait, then move the checkpoint.
        The first write makes the collection or vector, after its ids passed. With
        :attr:`confidence_column`, each point's ``confidence`` goes in that payload field,
        written (idempotently, by id) before the checkpoint moves.

        Raises
        ------
        InvalidInputError
            A negative integer id; an id that is not a point of an existing collection this
            run adds a vector to.
        StoreError
            The server keeps no collection metadata, or cannot add a named vector.
        """
        from qdrant_client import models

        if (confidence is None) != (self.confidence_column is None):
            raise InvalidInputError(
                f"{self.uri}: confidences go with --confidence-column, and only with it",
                param="confidence_column",
            )
        scores = None if confidence is None else np.asarray(confidence, np.float32).tolist()
        pairs = [point_key(k) for k in ids.tolist()]
        keys = [p for p, _ in pairs]
        if not self.new_collection:
            self._require_points(np.asarray(ids), keys)
        self._start()
        rows = np.asarray(vectors, dtype=np.float32).tolist()
        if self.new_collection:
            payloads: list[dict[str, Any]] = [
                {ID_FIELD: t} if t is not None else {} for _, t in pairs
            ]
            if scores is not None:
                for payload, score in zip(payloads, scores, strict=True):
                    payload[str(self.confidence_column)] = score
            batch = models.Batch(
                ids=keys,
                vectors={self.vector: rows} if self.address.named else rows,
                payloads=payloads if any(payloads) else None,
            )
            self.call(lambda c: c.upsert(self.collection, points=batch, wait=True))
        else:
            points = [
                models.PointVectors(id=k, vector={self.vector: v})
                for k, v in zip(keys, rows, strict=True)
            ]
            try:
                self.call(lambda c: c.update_vectors(self.collection, points=points, wait=True))
            except (KeyError, StoreNotFoundError) as error:  # local mode: KeyError(id)
                raise StoreError(
                    f"{self.uri}: an id of this batch is not a point of {self.collection!r} "
                    f"({error}); a vector is added to the points of the same ids",
                ) from None
            if scores is not None:
                field = str(self.confidence_column)
                operations = [
                    models.SetPayloadOperation(
                        set_payload=models.SetPayload(payload={field: score}, points=[k])
                    )
                    for k, score in zip(keys, scores, strict=True)
                ]
                self.call(lambda c: c.batch_update_points(self.collection, operations, wait=True))
        self._save(progress)

    def finish(self, progress: Progress) -> None:
        self._start()  # a source without rows
        self._save(Progress(progress.position, progress.rows_written, True))

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Translated vectors of ``ids`` (float32, in that order; L2-normalised by Qdrant
        for Cosine distance).

        Raises
        ------
        StoreNotFoundError
            No such collection or vector.
        InvalidInputError
            An id without a translated vector.
        """
        config = self._config()
        if config is None:
            raise self._missing()
        if self._vector_size(config) is None:
            raise StoreNotFoundError(f"{self.uri}: no vector {self.vector!r}", param="vector")
        ids = np.asarray(ids)
        keys = [point_key(k)[0] for k in ids.tolist()]
        return fetched(ids, self._retrieve(keys, self.vector), keys, self.uri)
