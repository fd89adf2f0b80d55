"""Vector stores a migration reads from and writes to, addressed by URI.

A store URI names the kind of store by its scheme:

* ``postgresql://user@host:port/db?table=T&column=C&id=ID`` — PostgreSQL with pgvector
  (:mod:`lead.migrate.pgvector`);
* ``qdrant://host:port/collection?vector=NAME``, or ``qdrant:///path/to/storage/collection``
  for qdrant-client's local (embedded) mode (:mod:`lead.migrate.qdrant`);
* a path (or ``file://`` URI) to a Parquet file or folder, a ``.npy`` file or a
  ``.safetensors[:tensor]`` file (:mod:`lead.migrate.files`).

LEAD's own query parameters (:data:`LEAD_PARAMS`) are taken out of the URI before
connecting; the others (``host=/path/to/socket``, ``sslmode=require``, ...) go to the
client library as they are. The values of :data:`SECRET_PARAMS` (``api_key``,
``password``, ...) are shown as ``***`` wherever a URI is printed or recorded.

A source yields :class:`Batch` es in a fixed order, each with the *position* to resume
after it; a target stores that position in the same atomic write as the rows
(:class:`Target.write`), or, in a store without transactions (Qdrant), right after rows
written idempotently by id, so a migration killed at any point resumes exactly after the
last batch that landed, and every row is in the target once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import numpy as np

from lead.data import parse_spec
from lead.errors import ConflictError, InvalidInputError, ZeroVectorError

__all__ = [
    "LEAD_PARAMS",
    "SECRET_PARAMS",
    "SOURCE_FILES",
    "Batch",
    "Closing",
    "MigrationSpec",
    "Progress",
    "Source",
    "SourceInfo",
    "StoreURI",
    "Target",
    "check_same_migration",
    "first_zero_row",
    "ordered_texts",
    "parse_store_uri",
    "source_identity",
    "unsplit",
    "with_params",
    "zero_row_error",
    "zero_rows",
]

#: Query parameters LEAD reads itself; the rest of a URI's query goes to the client library.
LEAD_PARAMS = ("table", "column", "id", "vector", "type")
#: Query parameters whose values are secrets: shown as ``***`` in :attr:`StoreURI.uri`.
SECRET_PARAMS = frozenset({"api_key", "apikey", "password", "sslpassword", "token"})
#: A parameter whose name holds one of these is treated as a secret too (``api-key``,
#: ``pasword``, ``x_auth``): a mistyped secret is still never printed.
_SECRET_HINTS = ("key", "pas", "pw", "secret", "token", "auth", "cred")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _is_secret(name: str) -> bool:
    lower = name.lower()
    return lower in SECRET_PARAMS or any(hint in lower for hint in _SECRET_HINTS)


@dataclass(frozen=True)
class StoreURI:
    """A parsed store URI.

    Attributes
    ----------
    scheme : str
        ``postgresql``, ``qdrant`` or ``file``.
    uri : str
        The URI without LEAD's parameters, its password and the values of
        :data:`SECRET_PARAMS` shown as ``***`` (safe to print and store).
    connect : str
        The URI without LEAD's parameters, password included: what the client library gets.
    params : dict of str to str
        LEAD's parameters (:data:`LEAD_PARAMS`) found in the query.
    path : str
        The URI's path (the database, the collection, or the file).
    """

    scheme: str
    uri: str
    connect: str
    params: dict[str, str]
    path: str


def parse_store_uri(uri: str) -> StoreURI:
    """Parse a store URI; a bare path is a ``file`` URI.

    Raises
    ------
    InvalidInputError
        An unknown scheme, a malformed URI, a password with a bad percent-encoding, or a
        LEAD parameter given twice (messages never repeat a password or a secret).
    """
    text = str(uri)
    try:
        parts = urlsplit(text)
    except ValueError as error:
        raise InvalidInputError(f"not a valid store URI: {error}", param="uri") from None
    scheme = parts.scheme.lower()
    if parse_spec(text.partition("?")[0])[1] is not None:  # file.safetensors:tensor
        scheme = ""  # (its file name read as a URI scheme)
    if scheme in ("", "file") or len(scheme) == 1:  # a bare path (or a Windows drive)
        path, _, query = (parts.path if scheme == "file" else text).partition("?")
        if scheme == "file" and parts.query:
            query = parts.query
        params = dict(parse_qsl(query, keep_blank_values=True))
        unknown = sorted(set(params) - set(LEAD_PARAMS))
        if unknown:
            raise InvalidInputError(
                f"{text}: unknown parameter {unknown[0]!r} for a file store "
                f"(known: {', '.join(LEAD_PARAMS)})",
                param="uri",
            )
        return StoreURI("file", path, path, params, path)
    if scheme in ("postgres", "postgresql"):
        scheme = "postgresql"
    elif scheme != "qdrant":
        raise InvalidInputError(
            f"unknown store scheme {parts.scheme!r}; use postgresql://, qdrant:// or a path "
            "to a Parquet, .npy or .safetensors file",
            param="uri",
        )
    if parts.password and _BAD_PERCENT.search(parts.password):
        raise InvalidInputError(
            f"{_redact(parts)}: the password has a '%' that is not a percent-encoding "
            "(write % as %25)",
            param="uri",
        )
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = [(k, v) for k, v in pairs if k in LEAD_PARAMS]
    names = [k for k, _ in ours]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"{_redact(parts)}: a parameter is given twice", param="uri")
    others = [(k, v) for k, v in pairs if k not in LEAD_PARAMS]
    # quote (not quote_plus): libpq reads %20 as a space but takes "+" literally
    rest = urlencode(others, safe="/", quote_via=quote)
    hidden = [(k, "***" if _is_secret(k) else v) for k, v in others]
    shown = urlencode(hidden, safe="/*", quote_via=quote)
    connect = unsplit(parts.scheme, parts.netloc, parts.path, rest)
    safe = unsplit(parts.scheme, _netloc_without_password(parts), parts.path, shown)
    return StoreURI(scheme, safe, connect, dict(ours), parts.path)


def unsplit(scheme: str, netloc: str, path: str, query: str) -> str:
    """``urlunsplit`` that keeps ``//`` before an empty host (``qdrant:///path``)."""
    text = urlunsplit((scheme, netloc, path, query, ""))
    if not netloc and path.startswith("/"):
        text = f"{scheme}://{text[len(scheme) + 1 :]}"
    return text


def source_identity(uri: str) -> str:
    """The source as a migration records it, so that one source named two ways resumes one
    migration: a file's absolute path, its links resolved (``src.parquet``,
    ``./src.parquet`` and ``$PWD/src.parquet`` are one source; the LEAD parameters kept as
    written); a store's URI without the user name and password (the same table reached as
    another user, or with the password now in the URI). A URI that does not parse is kept
    as it is."""
    try:
        parsed = parse_store_uri(uri)
    except InvalidInputError:
        return uri
    if parsed.scheme == "file":
        path, tensor = parse_spec(parsed.path)
        query = uri.partition("?")[2]
        return f"{path.resolve()}{f':{tensor}' if tensor else ''}{f'?{query}' if query else ''}"
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return unsplit(parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query)


def with_params(uri: str, **params: str | None) -> str:
    """``uri`` with LEAD's ``params`` appended to its query (those that are not None)."""
    extra = urlencode({k: v for k, v in params.items() if v is not None}, safe="/.")
    if not extra:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}{extra}"


def _netloc_without_password(parts: Any) -> str:
    if not parts.password:
        return str(parts.netloc)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return f"{user}:***@{host}"


def _redact(parts: Any) -> str:
    return unsplit(parts.scheme, _netloc_without_password(parts), parts.path, "")


@dataclass
class Batch:
    """Rows read from a source, in order.

    Attributes
    ----------
    ids : ndarray of shape (m,)
        int64, or object (str) for stores with text ids.
    vectors : ndarray of shape (m, d), float32
    position : Any
        JSON-serialisable: where to resume after this batch (:meth:`Source.batches`).
    """

    ids: np.ndarray
    vectors: np.ndarray
    position: Any = None


@dataclass(frozen=True)
class SourceInfo:
    """What :meth:`Source.describe` finds without reading every vector.

    Attributes
    ----------
    uri : str
        The store URI without a password.
    rows : int
        Rows in the source (NULL vectors included).
    dim : int
        Vector dimension.
    id_kind : {"int", "str"}
        Whether ids are integers or text.
    null_rows : int or None
        Rows whose vector is NULL / missing (None: not known without a full scan).
    vector_type : str
        How the source stores its values: a file's NumPy dtype name (``float32``,
        ``float64``, ``float16``, ...), pgvector's ``vector`` or ``halfvec``, Qdrant's
        datatype. Read as float32 whatever it is.
    """

    uri: str
    rows: int
    dim: int
    id_kind: str
    null_rows: int | None
    vector_type: str = "float32"


#: The :class:`MigrationSpec` extra of a source read by row position (files): the
#: fingerprint of its files (:func:`lead.migrate.files.files_fingerprint`).
SOURCE_FILES = "source_files"


@dataclass(frozen=True)
class MigrationSpec:
    """What a target records about the migration that fills it; a resumed run must match.

    Attributes
    ----------
    source : str
        The source URI (without a password).
    stitch : str
        The stitch as named by the user.
    stitch_sha256 : str
        SHA-256 of the stitch's weights: a resumed run with other weights is refused.
    inverse : bool
    dim : int
        Output dimension.
    id_kind : {"int", "str"}
    normalize : bool
        Output rows L2-normalised.
    """

    source: str
    stitch: str
    stitch_sha256: str
    inverse: bool
    dim: int
    id_kind: str
    normalize: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "stitch": self.stitch,
            "stitch_sha256": self.stitch_sha256,
            "inverse": self.inverse,
            "dim": self.dim,
            "id_kind": self.id_kind,
            "normalize": self.normalize,
            **self.extra,
        }


def check_same_migration(
    where: str, want: dict[str, Any], have: dict[str, Any], *, ignore: tuple[str, ...] = ()
) -> None:
    """Refuse to resume a target that holds another migration.

    Parameters
    ----------
    where : str
        The target, as error messages name it.
    want, have : dict
        This run's :meth:`MigrationSpec.as_dict` (plus the target's own settings) and the
        one recorded in the target.
    ignore : tuple of str
        Recorded keys that are the target's own bookkeeping.

    Raises
    ------
    ConflictError
        Naming every setting that differs, with both values.
    """
    # the stitch as named ("minilm-to-mpnet", a folder, a server's id) may differ between
    # runs: its stitch_sha256 (config and weights) says whether it is the same stitch
    recorded = have.get("source")
    if isinstance(recorded, str):  # recorded as typed before (a relative path: from here)
        have = {**have, "source": source_identity(recorded)}
    keys = (set(want) | set(have)) - {"stitch", *ignore}
    if SOURCE_FILES not in have:  # a target of an earlier version: resumes as it did
        keys.discard(SOURCE_FILES)
    differ = sorted(k for k in keys if want.get(k) != have.get(k))
    if SOURCE_FILES in differ and want.get("source") == have.get("source"):
        raise ConflictError(
            f"{where} holds a migration of {want.get('source')}, whose files changed since "
            "it started (rewritten, reordered, added or removed): the checkpoint counts rows "
            "by position, so going on would write some rows twice and miss others; write to "
            "a new target, or remove this one first",
            param="target",
        )
    if differ and set(differ) <= set(_OPTIONS):  # the same migration, other options
        same = ", ".join(_OPTIONS[key](have.get(key)) for key in differ)
        raise ConflictError(
            f"{where} holds this migration, begun with other options; resume it with the "
            f"same ones ({same}), or write to a new target",
            param="target",
        )
    if differ:
        shown = "; ".join(
            f"{key}: {_short(have.get(key))}, this run: {_short(want.get(key))}" for key in differ
        )
        raise ConflictError(
            f"{where} holds another migration ({shown}); choose a new target, or remove this "
            "one first",
            param="target",
        )


def _flag(name: str) -> Callable[[Any], str]:
    return lambda value: f"--{name}" if value else f"without --{name}"


#: Recorded settings that are options of the same migration: how to give them again.
_OPTIONS: dict[str, Callable[[Any], str]] = {
    "confidence_column": lambda value: (
        f"--confidence-column {value}" if value else "without --confidence-column"
    ),
    "normalize": _flag("normalize"),
    "inverse": _flag("inverse"),
}


def _short(value: Any, most: int = 120) -> str:
    """``repr(value)``, cut to ``most`` characters."""
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 3]}..."


@dataclass(frozen=True)
class Progress:
    """A target's checkpoint: where the last landed batch ended.

    Attributes
    ----------
    position : Any
        The source position after the last written batch (None: nothing written yet).
    rows_written : int
    done : bool
        The migration finished; running it again writes nothing.
    """

    position: Any = None
    rows_written: int = 0
    done: bool = False


class Closing:
    """``with store:`` closes it; every store class derives from this."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def zero_rows(vectors: np.ndarray) -> np.ndarray:
    """(m,) bool: the rows of ``vectors`` (shape (m, d)) without a direction: all zeros, or
    only subnormal values (the rows :func:`lead.unit_input.normalize_input` refuses)."""
    tiny = np.finfo(np.float32).tiny
    return np.asarray(np.abs(vectors).max(axis=1, initial=0.0) < tiny)


def first_zero_row(vectors: np.ndarray) -> int | None:
    """The first of :func:`zero_rows`, or None."""
    zero = zero_rows(vectors)
    return int(np.argmax(zero)) if zero.any() else None


def zero_row_error(key: Any, where: str, param: str, row: int = -1) -> ZeroVectorError:
    """The error for the all-zero vector of id ``key`` in ``where`` (``row``: its position
    in the source's order, -1 when not counted), met before anything was written."""
    return ZeroVectorError(
        f"the vector of id {key} in {where} is all zeros (or holds only values below "
        "float32's smallest normal, 1.2e-38): the stitch was fitted on unit-length vectors "
        "and cannot translate a vector without a direction; fix or "
        "delete that row (or, in a table or collection, set it to NULL and pass --skip-null)",
        param=param,
        row=row,
    )


class Source(Protocol):
    """A store read by a migration (never modified)."""

    info: SourceInfo

    def check(self, *, skip_null: bool = False, zero_rows: bool = False) -> None:
        """Refuse what a migration cannot translate, before anything is written.

        ``zero_rows``: also refuse a vector without a direction (:func:`first_zero_row`),
        for a stitch fitted on unit-length vectors.

        Raises
        ------
        InvalidInputError
            A NULL vector (unless ``skip_null``), a non-finite value or a duplicate id,
            naming the id and the column.
        ZeroVectorError
            With ``zero_rows``: an all-zero vector, naming its id (:func:`zero_row_error`).
        """

    def batches(self, batch_size: int, after: Any = None) -> Iterator[Batch]:
        """Rows with a vector, in a fixed order, from just after position ``after``."""

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Vectors (len(ids), dim) float32 of these ids, in the same order.

        Raises
        ------
        InvalidInputError
            An id that is not in the store, or whose vector is NULL.
        """

    def sample_ids(self, n: int, seed: int) -> np.ndarray:
        """Up to ``n`` ids of rows with a vector, drawn at random with ``seed``."""

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """The text of these ids in ``column`` (a text column of the same table, a string
        column of the Parquet file, a payload field of the Qdrant points), in the same
        order: what ``calibrate --embed`` embeds with the new model.

        Raises
        ------
        StoreNotFoundError
            No such column (no point holds the payload field).
        InvalidInputError
            An id that is not in the store, or whose text is NULL / missing, naming it; a
            column that is not text; a store without text (``.npy``, ``.safetensors``).
        """

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class Target(Protocol):
    """A new table, column, collection or folder that a migration fills."""

    uri: str
    #: Where each row's confidence goes (a column, a payload field), or None; set before
    #: :meth:`open` (``lead migrate apply --confidence-column``).
    confidence_column: str | None

    def open(self, spec: MigrationSpec, source: SourceInfo) -> Progress:
        """Create the target, or find the checkpoint of the same migration in it.

        Raises
        ------
        ConflictError
            The target exists with other content, or was filled by another migration
            (another source, stitch or dimension).
        """

    def write(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        progress: Progress,
        confidence: np.ndarray | None = None,
    ) -> None:
        """Write rows (and their float32 ``confidence`` in :attr:`confidence_column`,
        when set) and the checkpoint ``progress`` in one atomic step."""

    def finish(self, progress: Progress) -> None:
        """Mark the migration done (indexes, the final rename, ...)."""

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Translated vectors (len(ids), dim) of these ids (for ``verify``)."""

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def require(module: str, extra: str) -> Any:
    """Import an optional client library, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise InvalidInputError(
            f"this store needs {module!r}: pip install 'lead-stitch[{extra}]'", param="uri"
        ) from None


def ordered_texts(ids: np.ndarray, found: dict[Any, Any], where: str, column: str) -> list[str]:
    """The texts of ``ids`` in that order, from ``found`` ({id: text, or None for NULL}),
    for :meth:`Source.texts`.

    Raises
    ------
    InvalidInputError
        An id not in ``found`` (not in the store), or whose text is None or not a string,
        naming the id.
    """
    out = []
    for key in np.asarray(ids).tolist():
        if key not in found:
            raise InvalidInputError(f"id {key!r} is not in {where}", param="ids")
        value = found[key]
        if value is None:
            raise InvalidInputError(
                f"the text of id {key!r} in {column!r} of {where} is NULL or missing; fill "
                "it, or give the new model's vectors instead",
                param="text_column",
            )
        if not isinstance(value, str):
            raise InvalidInputError(
                f"the {column!r} of id {key!r} in {where} is {type(value).__name__}, not text",
                param="text_column",
            )
        out.append(value)
    return out
