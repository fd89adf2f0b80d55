"""Plumbing of the Qdrant stores (:mod:`lead.migrate.qdrant`): URI parsing, one shared
client per local storage folder, and client errors mapped to LEAD's."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import numpy as np

from lead.errors import (
    ConflictError,
    InvalidInputError,
    StoreError,
    StoreNotFoundError,
)
from lead.migrate.stores import Closing, StoreURI, require

#: The namespace of the uuid5 point ids made from text ids that are not UUIDs.
LEAD_NAMESPACE = uuid.UUID("6f1b8c52-3e7d-5a4b-9c1e-2d7f0a9b4e63")
_CLIENT_PARAMS: dict[str, type] = {
    "api_key": str,
    "https": bool,
    "prefix": str,
    "timeout": int,
    "prefer_grpc": bool,
    "grpc_port": int,
    "pool_size": int,
    "check_compatibility": bool,
}
_DISTANCES = {"cosine": "Cosine", "dot": "Dot", "euclid": "Euclid", "manhattan": "Manhattan"}
FIRST_UUID = str(uuid.UUID(int=0))  # every UUID point id sorts after every integer one
_T = TypeVar("_T")


@dataclass
class _Shared:
    """One client, used by every store of a local storage folder (``users`` of them)."""

    client: Any
    key: str | None
    lock: threading.RLock = field(default_factory=threading.RLock)
    users: int = 1


_LOCAL: dict[str, _Shared] = {}
_LOCAL_GUARD = threading.Lock()


def _flag(name: str, text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise InvalidInputError(f"{name}={text!r}: use true or false", param=name)


@dataclass(frozen=True)
class Address:
    uri: str
    collection: str
    vector: str  # "" is the unnamed vector
    named: bool
    storage: str | None
    kwargs: dict[str, Any]
    distance: str | None

    def same_collection(self, other: Address) -> bool:
        """Whether ``other`` is the same collection of the same storage or server."""
        here = [os.path.realpath(a.storage) if a.storage else None for a in (self, other)]
        servers = [(a.kwargs.get("host"), a.kwargs.get("port")) for a in (self, other)]
        return (
            self.collection == other.collection and here[0] == here[1] and servers[0] == servers[1]
        )


def parse_address(parsed: StoreURI) -> Address:
    other = sorted(set(parsed.params) - {"vector"})
    if other:
        raise InvalidInputError(
            f"{parsed.uri}: {other[0]}= is not a Qdrant parameter; name a vector with ?vector=",
            param=other[0],
        )
    parts = urlsplit(parsed.connect)
    kwargs: dict[str, Any] = {"check_compatibility": False}
    distance = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "distance":
            if value.lower() not in _DISTANCES:
                raise InvalidInputError(
                    f"distance={value!r}: use {', '.join(_DISTANCES.values())}", param="distance"
                )
            distance = _DISTANCES[value.lower()]
        elif key in _CLIENT_PARAMS:
            kind = _CLIENT_PARAMS[key]
            try:
                kwargs[key] = _flag(key, value) if kind is bool else kind(value)
            except ValueError:
                raise InvalidInputError(f"{key}={value!r}: not an integer", param=key) from None
        else:
            raise InvalidInputError(
                f"{parsed.uri}: unknown parameter {key!r} (known: vector, distance, "
                f"{', '.join(_CLIENT_PARAMS)})",
                param=key,
            )
    vector = parsed.params.get("vector") or None
    path = unquote(parts.path)
    if parts.netloc == ":memory:":
        raise InvalidInputError(
            f"{parsed.uri}: an in-memory Qdrant keeps nothing after the run; use "
            "qdrant:///path/to/storage/collection",
            param="uri",
        )
    if parts.username or parts.password:
        raise InvalidInputError(f"{parsed.uri}: give the API key as ?api_key=", param="uri")
    if not parts.netloc:
        storage, _, name = path.rstrip("/").rpartition("/")
        if not storage or not name:
            raise InvalidInputError(
                f"{parsed.uri}: use qdrant:///path/to/storage/collection", param="uri"
            )
        if set(kwargs) - {"check_compatibility"}:
            raise InvalidInputError(
                f"{parsed.uri}: client parameters are for a Qdrant server", param="uri"
            )
        return Address(parsed.uri, name, vector or "", vector is not None, storage, {}, distance)
    name = path.strip("/")
    try:
        port = parts.port
    except ValueError:
        raise InvalidInputError(f"{parsed.uri}: the port is not a number", param="uri") from None
    if not name or "/" in name or not parts.hostname:
        raise InvalidInputError(f"{parsed.uri}: use qdrant://host:port/collection", param="uri")
    kwargs.update(host=parts.hostname, port=port or 6333)
    return Address(parsed.uri, name, vector or "", vector is not None, None, kwargs, distance)


def acquire(address: Address, *, create: bool) -> _Shared:
    qdrant_client = require("qdrant_client", "qdrant")
    if address.storage is None:
        return _Shared(qdrant_client.QdrantClient(**address.kwargs), None)
    key = os.path.realpath(address.storage)
    with _LOCAL_GUARD:
        shared = _LOCAL.get(key)
        if shared is not None:
            shared.users += 1
            return shared
        if not create and not os.path.isfile(os.path.join(key, "meta.json")):
            raise StoreNotFoundError(
                f"{address.uri}: {address.storage} is not a Qdrant local storage folder",
                param="uri",
            )
        _check_folder(address.uri, key)
        try:
            client = qdrant_client.QdrantClient(path=key, force_disable_check_same_thread=True)
        except RuntimeError as error:  # the folder is locked by another process
            raise StoreError(f"{address.uri}: {error}", param="uri") from None
        except OSError as error:  # cannot create the folder
            raise StoreError(
                f"{address.uri}: cannot create {error.filename or key}: {error.strerror}",
                param="uri",
            ) from None
        _LOCAL[key] = shared = _Shared(client, key)
        return shared


def _check_folder(uri: str, folder: str) -> None:
    """Refuse a storage folder that is, or lies below, a file (qdrant-client would raise
    FileExistsError or NotADirectoryError when it makes the folder)."""
    path = folder
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise InvalidInputError(
            f"{uri}: {path} is a file, not a folder; give a Qdrant storage folder",
            param="uri",
        )


def release(shared: _Shared) -> None:
    with _LOCAL_GUARD:
        shared.users -= 1
        if shared.users > 0:
            return
        if shared.key is not None:
            _LOCAL.pop(shared.key, None)
    with shared.lock:  # after a call in flight (the read-ahead thread's)
        shared.client.close()


def _reason(error: Any) -> str:
    try:
        return str(json.loads(error.content)["status"]["error"])
    except (ValueError, KeyError, TypeError):
        return str(error.reason_phrase or "no reason given")


class Collection(Closing):
    """One collection of one client; :meth:`call` maps client errors to LEAD's."""

    def __init__(self, parsed: StoreURI, *, create: bool) -> None:
        self.address = parse_address(parsed)
        self.collection = self.address.collection
        self._shared: _Shared | None = acquire(self.address, create=create)

    def call(self, action: Callable[[Any], _T]) -> _T:
        """``action(client)`` under the client's lock.

        Raises
        ------
        StoreError
            Qdrant cannot be reached, refuses the API key, or answers with an error.
        StoreNotFoundError
            Qdrant answers 404.
        ConflictError
            Qdrant answers 409.
        """
        import grpc
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        if self._shared is None:
            raise StoreError(f"{self.address.uri} is closed")
        uri = self.address.uri
        try:
            with self._shared.lock:
                return action(self._shared.client)
        except UnexpectedResponse as error:
            code = error.status_code
            if code in (401, 403):
                raise StoreError(f"{uri}: Qdrant refused the API key (HTTP {code})") from None
            if code == 404:
                raise StoreNotFoundError(f"{uri}: {_reason(error)}", param="uri") from None
            if code == 409:
                raise ConflictError(f"{uri}: {_reason(error)}", param="target") from None
            raise StoreError(f"{uri}: Qdrant answered HTTP {code}: {_reason(error)}") from None
        except ResponseHandlingException as error:
            cause = error.source if error.source is not None else error
            raise StoreError(f"cannot reach Qdrant at {uri}: {cause}") from None
        except grpc.RpcError as error:
            status = error.code() if hasattr(error, "code") else "?"
            raise StoreError(f"{uri}: Qdrant answered {status}") from None

    def scroll(self, **options: Any) -> tuple[list[Any], Any]:
        """One page of ``client.scroll`` on this collection: (records, next offset)."""
        page: tuple[list[Any], Any] = self.call(lambda c: c.scroll(self.collection, **options))
        return page

    def _config(self) -> Any | None:
        """The collection's config, None when there is no such collection."""
        if not self.call(lambda c: c.collection_exists(self.collection)):
            return None
        return self.call(lambda c: c.get_collection(self.collection)).config

    def _missing(self) -> StoreNotFoundError:
        names = sorted(c.name for c in self.call(lambda c: c.get_collections()).collections)
        known = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "") or "none"
        return StoreNotFoundError(
            f"{self.address.uri}: no collection {self.collection!r} (collections: {known})",
            param="uri",
        )

    def _retrieve(self, keys: list[Any], vector: str) -> dict[Any, Any]:
        """{point id: vector} of those of ``keys`` that are points with ``vector``."""
        found: dict[Any, Any] = {}
        for start in range(0, len(keys), 1024):
            for record in self._retrieve_page(keys[start : start + 1024], vector):
                value = vector_of(record, vector)
                if value is not None:
                    found[record.id] = value
        return found

    def _retrieve_page(self, keys: list[Any], vector: str) -> list[Any]:
        return self.call(
            lambda c: c.retrieve(self.collection, keys, with_payload=False, with_vectors=[vector])
        )

    def close(self) -> None:
        if self._shared is not None:
            shared, self._shared = self._shared, None
            release(shared)


def vector_of(record: Any, name: str) -> Any:
    value = record.vector
    if isinstance(value, dict):
        return value.get(name)
    return value if name == "" else None


def pick_vector(config: Any, address: Address) -> tuple[str, Any]:
    """(name, VectorParams) of the vector a source URI means."""
    vectors = config.params.vectors
    table = {"": vectors} if not isinstance(vectors, dict) and vectors is not None else vectors
    table = dict(table or {})
    names = ", ".join(repr(k) if k else "the unnamed one" for k in sorted(table)) or "none"
    where = f"{address.uri}: collection {address.collection!r}"
    if address.named:
        if address.vector not in table:
            sparse = config.params.sparse_vectors or {}
            if address.vector in sparse:
                raise InvalidInputError(
                    f"{where}: {address.vector!r} is a sparse vector; LEAD migrates dense ones",
                    param="vector",
                )
            raise StoreNotFoundError(
                f"{where} has no vector {address.vector!r} (its vectors: {names})", param="vector"
            )
        name = address.vector
    elif "" in table or len(table) == 1:
        name = "" if "" in table else next(iter(table))
    else:
        raise InvalidInputError(
            f"{where} has {len(table)} named vectors ({names}); name one with ?vector=NAME",
            param="vector",
        )
    if table[name].multivector_config is not None:
        raise InvalidInputError(
            f"{where}: vector {name!r} is a multivector; LEAD migrates one vector per point",
            param="vector",
        )
    return name, table[name]


def has_vector(name: str, *, present: bool) -> Any:
    from qdrant_client import models

    condition = models.HasVectorCondition(has_vector=name)
    return models.Filter(must=condition) if present else models.Filter(must_not=condition)


#: The payload field where a target keeps a text id that is not its point id.
ID_FIELD = "lead_id"


def point_key(key: Any) -> tuple[Any, str | None]:
    """The Qdrant point id a target writes a LEAD id to, and the text id to keep in
    :data:`ID_FIELD` (or None).

    Only the canonical spelling of a UUID (lowercase, hyphenated: as Qdrant answers it)
    is its own point id; any other text, another spelling of a UUID included, becomes
    ``uuid5(LEAD_NAMESPACE, text)``, so distinct ids are distinct points.

    Raises
    ------
    InvalidInputError
        A negative integer id.
    """
    if isinstance(key, int | np.integer):
        if int(key) < 0:
            raise InvalidInputError(
                f"id {int(key)}: Qdrant point ids are unsigned integers or UUIDs", param="id"
            )
        return int(key), None
    text = str(key)
    if _canonical(text) == text:
        return text, None
    return str(uuid.uuid5(LEAD_NAMESPACE, text)), text


def source_point(key: Any) -> Any:
    """The point id a source reads for a LEAD id: any spelling of a UUID names that point
    (a source's own ids are Qdrant's canonical spelling); other text the uuid5 point a
    LEAD target made of it.

    Raises
    ------
    InvalidInputError
        A negative integer id.
    """
    if isinstance(key, int | np.integer):
        return point_key(key)[0]
    return _canonical(str(key)) or point_key(key)[0]


def _canonical(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def fetched(ids: np.ndarray, found: dict[Any, Any], keys: list[Any], where: str) -> np.ndarray:
    missing = [k for k, p in zip(ids.tolist(), keys, strict=True) if p not in found]
    if missing:
        raise InvalidInputError(
            f"{len(missing)} ids have no vector in {where} (the first: {missing[0]!r})",
            param="ids",
        )
    return np.asarray([found[p] for p in keys], dtype=np.float32).reshape(len(keys), -1)
