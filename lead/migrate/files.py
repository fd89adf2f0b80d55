"""File stores, the embedded default that needs no server: Parquet in and out, ``.npy`` and
``.safetensors`` in.

A Parquet source is a file or a folder of ``*.parquet`` files (read in name order, row
group by row group, each in slices of about the batch size through pyarrow, so memory
follows the batch size, not the row group): ``?column=NAME`` names the vector column
(default: the only list-of-floats column), ``?id=NAME`` the id column (default ``id`` when
there is one, else the row number). Every file of a folder needs the vector and id columns
of the first, of the same kinds. Integer ids must fit in int64. ``.npy`` and
``.safetensors[:tensor]`` sources are read by row range (:class:`lead.data.EmbeddingReader`);
their ids are row numbers. A position is the number of source rows read.

The Parquet target (a folder of parts) is in :mod:`lead.migrate.parquet_target`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lead.data import EmbeddingReader, parse_spec
from lead.errors import (
    DecodeError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    StoreNotFoundError,
)
from lead.migrate.stores import (
    Batch,
    Closing,
    SourceInfo,
    StoreURI,
    first_zero_row,
    ordered_texts,
    require,
    with_params,
    zero_row_error,
)

__all__ = ["ArraySource", "ParquetSource", "open_file_source"]

#: vectors read at once by a scan (check, fetch, sample): about this many bytes
_READ_BYTES = 2 << 20
#: the fewest rows read at once; the read buffer of a Parquet file (a page or so)
_MIN_SLICE, _READ_BUFFER = 1024, 1 << 20
_INT64_MAX = np.iinfo(np.int64).max


def open_file_source(parsed: StoreURI) -> ArraySource | ParquetSource:
    """A Parquet file or folder, or a ``.npy`` / ``.safetensors`` file.

    Raises
    ------
    StoreNotFoundError
        No such file or folder.
    InvalidInputError
        An unknown file kind.
    """
    path, _ = parse_spec(parsed.path)
    if not path.exists():
        raise StoreNotFoundError(f"no such file or folder: {parsed.path}", param="source")
    if path.is_dir() or path.suffix.lower() == ".parquet":
        return ParquetSource(path, parsed.params)
    if path.suffix.lower() in (".npy", ".safetensors"):
        if parsed.params:  # they were ignored
            raise InvalidInputError(
                f"{path}: a .npy or .safetensors source takes no parameters, not "
                f"{', '.join(sorted(parsed.params))} (name a safetensors tensor as FILE:TENSOR)",
                param="source",
            )
        return ArraySource(parsed.path)
    raise InvalidInputError(
        f"{parsed.path}: use a Parquet file or folder, a .npy or a .safetensors file",
        param="source",
    )


def _first_bad_row(vectors: np.ndarray) -> int | None:
    bad = ~np.isfinite(vectors).all(axis=1)
    return int(np.argmax(bad)) if bad.any() else None


class ArraySource(Closing):
    """A ``.npy`` or ``.safetensors[:tensor]`` matrix; ids are row numbers (int64)."""

    def __init__(self, spec: str) -> None:
        self.reader = EmbeddingReader(spec)
        #: rows are read by position: :func:`files_fingerprint` of the file
        self.fingerprint = files_fingerprint([self.reader.path])
        #: for ``plan``: what a user may not expect
        self.notes = [f"{spec} holds no ids: the target's ids are row numbers 0, 1, ..."]
        self.info = SourceInfo(
            uri=str(spec),
            rows=len(self.reader),
            dim=int(self.reader.shape[1]),
            id_kind="int",
            null_rows=0,
            vector_type=self.reader.dtype,
        )

    def check(self, *, skip_null: bool = False, zero_rows: bool = False) -> None:
        """Read every row once: NaN, infinity or values beyond float32 are refused, and
        with ``zero_rows`` an all-zero row.

        Raises
        ------
        NonFiniteError
            Naming the row.
        ZeroVectorError
            Naming the row (its id).
        """
        for start, rows in self.reader.iter_batches(65536):  # the reader checks each batch
            zero = first_zero_row(rows) if zero_rows else None
            if zero is not None:
                raise zero_row_error(start + zero, self.info.uri, "source", start + zero)

    def batches(self, batch_size: int, after: Any = None) -> Iterator[Batch]:
        start = int(after or 0)
        for begin in range(start, len(self.reader), batch_size):
            stop = min(begin + batch_size, len(self.reader))
            rows = self.reader.read(begin, stop).astype(np.float32, copy=False)
            yield Batch(np.arange(begin, stop, dtype=np.int64), rows, stop)

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        index = np.asarray(ids, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= len(self.reader)):
            raise InvalidInputError(
                f"row ids must be in [0, {len(self.reader)}) for {self.info.uri}", param="ids"
            )
        return (
            np.stack([self.reader.read(int(i), int(i) + 1)[0] for i in index]).astype(np.float32)
            if index.size
            else np.empty((0, self.info.dim), np.float32)
        )

    def sample_ids(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        count = min(int(n), len(self.reader))
        return np.sort(rng.choice(len(self.reader), size=count, replace=False)).astype(np.int64)

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """A matrix holds no text.

        Raises
        ------
        InvalidInputError
            Always.
        """
        raise InvalidInputError(
            f"{self.info.uri} holds vectors only, no text to embed; give a store with a text "
            "column (Parquet, PostgreSQL, Qdrant), or the new model's vectors as NATIVE_URI",
            param="source",
        )


def files_fingerprint(files: list[Path]) -> str:
    """SHA-256 over each file's name, size and modification time (ns): what a migration
    that reads ``files`` by row position records, so that a resume refuses a source that
    was rewritten, reordered, extended or shrunk since (without reading it again). A link
    counts as the file it leads to."""
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        name = file.resolve().name
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith(("_", ".")))
    if not files:
        raise StoreNotFoundError(f"{path} holds no .parquet files", param="source")
    return files


def _read_footer(file: Path) -> Any:
    """The Parquet metadata of ``file``.

    Raises
    ------
    DecodeError
        Not a Parquet file, or a damaged one.
    """
    pa = require("pyarrow", "arrow")
    pq = require("pyarrow.parquet", "arrow")
    try:
        return pq.read_metadata(file)
    except (pa.ArrowException, OSError) as error:
        raise DecodeError(
            f"{file} is not a readable Parquet file ({error})", param="source"
        ) from None


def _is_vector_type(kind: Any) -> bool:
    """A list, large list or fixed-size list of numbers: one vector per row."""
    pa = require("pyarrow", "arrow")
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not (listed or pa.types.is_fixed_size_list(kind)):
        return False
    return bool(pa.types.is_floating(kind.value_type) or pa.types.is_integer(kind.value_type))


def _id_kind(kind: Any) -> str | None:
    """``int`` or ``str`` for an id column of this type, None for another type."""
    pa = require("pyarrow", "arrow")
    if pa.types.is_integer(kind):
        return "int"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    return None


def _vector_column(schema: Any, wanted: str | None, where: str) -> str:
    pa = require("pyarrow", "arrow")
    if wanted:
        if wanted not in schema.names:
            raise StoreNotFoundError(f"{where} has no column {wanted!r}", param="column")
        kind = schema.field(wanted).type
        if not _is_vector_type(kind):
            raise InvalidInputError(
                f"column {wanted!r} of {where} is {kind}, not a list of numbers (one vector "
                "per row); name the vector column with ?column=NAME",
                param="column",
            )
        return wanted
    lists = [
        f.name
        for f in schema
        if _is_vector_type(f.type) and pa.types.is_floating(f.type.value_type)
    ]
    if len(lists) != 1:
        # lists of integers are vectors too, when named (read as float32)
        others = [f"{f.name!r} ({f.type})" for f in schema if _is_vector_type(f.type)]
        found = f"{len(lists)} list-of-floats columns ({', '.join(lists) or 'none'})"
        if not lists and others:
            found = f"no list-of-floats column, but lists of other numbers: {', '.join(others)}"
        raise InvalidInputError(
            f"{where} has {found}; name the vector column with ?column=NAME",
            param="column",
        )
    return str(lists[0])


def _check_same_columns(
    files: list[Path], metas: list[Any], columns: dict[str, Callable[[Any], object]]
) -> None:
    """Refuse a file without one of ``columns`` ({name: kind of its type in the first
    file}), or with another kind of type there.

    Raises
    ------
    InvalidInputError
        Naming the file, the column and both types.
    """
    first = metas[0].schema.to_arrow_schema()
    for file, meta in zip(files[1:], metas[1:], strict=True):
        schema = meta.schema.to_arrow_schema()
        for name, kind_of in columns.items():
            if name not in schema.names:
                raise InvalidInputError(
                    f"{file} has no column {name!r}, which {files[0]} has; every file of a "
                    "folder needs the same vector and id columns",
                    param="source",
                )
            kind, want = schema.field(name).type, first.field(name).type
            if kind_of(kind) != kind_of(want):
                raise InvalidInputError(
                    f"column {name!r} is {kind} in {file} but {want} in {files[0]}; every "
                    "file of a folder needs the same kinds of vector and id columns",
                    param="source",
                )


def _leaf_index(meta: Any, column: str) -> int:
    """The index of the Parquet leaf column under top-level column ``column``."""
    for index in range(meta.num_columns):
        path = meta.schema.column(index).path
        if path == column or path.startswith(f"{column}."):
            return index
    return -1


def _vectors(column: Any, dim: int | None, ids: np.ndarray, where: str) -> np.ndarray:
    """A list / fixed_size_list column (no nulls) as (m, d) float32."""
    pa = require("pyarrow", "arrow")
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
    else:
        lengths = np.asarray(column.value_lengths())
        width = int(lengths[0]) if len(lengths) else int(dim or 0)
        if len(lengths) and (lengths != width).any():
            bad = int(np.argmax(lengths != width))
            raise ShapeMismatchError(
                f"the vector of id {ids[bad]} in {where} has {lengths[bad]} values, the "
                f"others {width}",
                expected=width,
                got=int(lengths[bad]),
                param="column",
            )
    if dim is not None and width != dim:
        raise ShapeMismatchError(
            f"vectors in {where} have {width} values, the first ones {dim}",
            expected=dim,
            got=width,
            param="column",
        )
    flat = column.flatten()
    if flat.null_count:  # it would read as NaN, and be named so
        first = int(np.argmin(np.asarray(flat.is_valid(), dtype=bool))) // max(width, 1)
        raise InvalidInputError(
            f"the vector of id {ids[first]} in {where} has a NULL value among its numbers; "
            "a vector is all numbers (or NULL as a whole, with --skip-null)",
            param="column",
        )
    values = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32)
    return values.reshape(len(column), width)


class ParquetSource(Closing):
    """Parquet file or folder, read in slices of its row groups (see the module docstring).

    Raises
    ------
    InvalidInputError
        A parameter other than ``column`` and ``id``; a vector column that is not a list of
        numbers, an id column neither integer nor string; files of a folder without the
        first one's columns, or with other kinds of them.
    StoreNotFoundError
        No such column.
    DecodeError
        A file that is not Parquet.
    """

    def __init__(self, path: Path, params: dict[str, str]) -> None:
        unused = sorted(set(params) - {"column", "id"})
        if unused:
            raise InvalidInputError(
                f"{path}: a Parquet source takes ?column= and ?id=, not {', '.join(unused)}",
                param="source",
            )
        self.path, self.files = path, _parquet_files(path)
        #: rows are read by position: :func:`files_fingerprint` of the files
        self.fingerprint = files_fingerprint(self.files)
        self._meta = [_read_footer(f) for f in self.files]
        schema = self._meta[0].schema.to_arrow_schema()
        self.column = _vector_column(schema, params.get("column"), str(self.files[0]))
        wanted_id = params.get("id")
        if wanted_id and wanted_id not in schema.names:
            raise StoreNotFoundError(f"{path} has no id column {wanted_id!r}", param="id")
        self.id_column = wanted_id or ("id" if "id" in schema.names else None)
        #: for ``plan``: what a user may not expect
        self.notes = (
            []
            if self.id_column is not None
            else [
                f"{path} has no column 'id' and ?id= names none: the target's ids are row "
                f"numbers 0, 1, ... (name the id column with ?id=COLUMN; columns: "
                f"{', '.join(schema.names)[:200]})"
            ]
        )
        id_kind = "int"
        if self.id_column is not None:
            kind = schema.field(self.id_column).type
            id_kind = _id_kind(kind) or ""
            if not id_kind:
                raise InvalidInputError(
                    f"id column {self.id_column!r} of {path} is {kind}; ids must be integers "
                    "or strings",
                    param="id",
                )
        kinds: dict[str, Callable[[Any], object]] = {self.column: _is_vector_type}
        if self.id_column is not None:
            kinds[self.id_column] = _id_kind
        _check_same_columns(self.files, self._meta, kinds)
        rows = sum(m.num_rows for m in self._meta)
        nulls = self._null_count()
        column_type = schema.field(self.column).type
        self._dim: int | None = getattr(column_type, "list_size", None)
        if self._dim is None:  # a list column: the length of the first vector
            for _ in self._slices(0, size=_MIN_SLICE):
                if self._dim is not None:
                    break
        dim = self._dim or 0
        self._read_rows = max(64, _READ_BYTES // (4 * max(dim, 1)))
        uri = with_params(str(path), column=self.column, id=self.id_column)
        stored = np.dtype(column_type.value_type.to_pandas_dtype()).name  # float64, int8, ...
        self.info = SourceInfo(uri, rows, dim, id_kind, nulls, stored)

    def _null_count(self) -> int | None:
        total = 0
        for meta in self._meta:
            index = _leaf_index(meta, self.column)
            for g in range(meta.num_row_groups):
                # the leaf column of a list: its statistics count null lists and null values
                stats = meta.row_group(g).column(index).statistics if index >= 0 else None
                if stats is None or not stats.has_null_count:
                    return None
                total += stats.null_count
        return total

    def row_groups(self) -> list[list[int]]:
        """Rows of each row group of each file, in reading order (files in name order)."""
        return [
            [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] for meta in self._meta
        ]

    def _record_batches(
        self, columns: list[str], start: int, stop: int | None, size: int
    ) -> Iterator[tuple[int, Any]]:
        """(first row, record batch of at most ``size`` rows) for rows ``start`` to ``stop``
        (excluded; None: the end), reading each row group in slices.

        Raises
        ------
        DecodeError
            A damaged file.
        """
        pa = require("pyarrow", "arrow")
        pq = require("pyarrow.parquet", "arrow")
        offset = 0
        for file, meta in zip(self.files, self._meta, strict=True):
            if stop is not None and offset >= stop:
                return
            if offset + meta.num_rows <= start:
                offset += meta.num_rows
                continue
            try:
                # pages read as needed through a small buffer, not whole column chunks
                with pq.ParquetFile(
                    file, metadata=meta, buffer_size=_READ_BUFFER, pre_buffer=False
                ) as reader:
                    for g in range(meta.num_row_groups):
                        at, offset = offset, offset + meta.row_group(g).num_rows
                        if offset <= start or (stop is not None and at >= stop):
                            continue
                        for batch in reader.iter_batches(size, row_groups=[g], columns=columns):
                            lo, hi = max(at, start), at + batch.num_rows
                            hi = hi if stop is None else min(hi, stop)
                            if hi > lo:
                                yield lo, batch.slice(lo - at, hi - lo)
                            at += batch.num_rows
                            if stop is not None and at >= stop:
                                break
            except (pa.ArrowException, OSError) as error:
                raise DecodeError(f"{file} is damaged: {error}", param="source") from None

    def _slices(
        self, start: int, stop: int | None = None, size: int | None = None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(first row, ids, vectors, valid) per slice of at most ``size`` rows (default:
        about 2 MiB of vectors) for rows ``start`` to ``stop`` (excluded; None: the end);
        the rows of NULL vectors are zeros with ``valid`` false."""
        pa = require("pyarrow", "arrow")
        columns = [self.column] + ([self.id_column] if self.id_column else [])
        for first, batch in self._record_batches(columns, start, stop, size or self._read_rows):
            ids = self._ids(batch, first)
            column = batch.column(self.column)
            if column.null_count:
                valid = np.asarray(column.is_valid(), dtype=bool)
                column = column.filter(pa.array(valid))
            else:
                valid = np.ones(batch.num_rows, dtype=bool)
            good = _vectors(column, self._dim, ids[valid], str(self.path))
            if self._dim is None and len(good):
                self._dim = good.shape[1]
            if len(good) == batch.num_rows:
                yield first, ids, good, valid
                continue
            vectors = np.zeros((batch.num_rows, self._dim or 0), np.float32)
            vectors[valid] = good
            yield first, ids, vectors, valid

    def check(self, *, skip_null: bool = False, zero_rows: bool = False) -> None:
        """Read every row once: NULL vectors (unless ``skip_null``), NaN / infinity, mixed
        dimensions, duplicate ids and, with ``zero_rows``, all-zero vectors are refused,
        naming the id.

        Raises
        ------
        InvalidInputError, NonFiniteError, ShapeMismatchError, ZeroVectorError
        """
        seen: list[np.ndarray] = []
        for first, ids, vectors, valid in self._slices(0):
            seen.append(ids)
            if not valid.all() and not skip_null:
                raise InvalidInputError(
                    f"the vector of id {ids[int(np.argmin(valid))]} in {self.column!r} of "
                    f"{self.path} is NULL; fill it, or pass --skip-null to leave such rows out",
                    param=self.column,
                )
            bad = _first_bad_row(vectors)
            if bad is not None:
                raise NonFiniteError(
                    f"the vector of id {ids[bad]} in {self.column!r} of {self.path} holds "
                    "NaN or infinity",
                    param=self.column,
                )
            zero = first_zero_row(vectors[valid]) if zero_rows else None
            if zero is not None:
                at = int(np.flatnonzero(valid)[zero])
                where = f"{self.column!r} of {self.path}"
                raise zero_row_error(ids[at], where, self.column, first + at)
        if self.id_column and seen:
            every = np.concatenate(seen)
            uniq, counts = np.unique(every, return_counts=True)
            if (counts > 1).any():
                raise InvalidInputError(
                    f"id {uniq[int(np.argmax(counts > 1))]} appears more than once in "
                    f"{self.id_column!r} of {self.path}; ids must be unique",
                    param=self.id_column,
                )

    def _ids(self, table: Any, first: int) -> np.ndarray:
        if not self.id_column:
            return np.arange(first, first + table.num_rows, dtype=np.int64)
        column = table.column(self.id_column)
        if column.null_count:
            raise InvalidInputError(
                f"{self.path} holds NULL ids in {self.id_column!r}; every row needs an id",
                param="id",
            )
        ids = np.asarray(column.to_numpy(zero_copy_only=False))
        if ids.dtype.kind == "u" and len(ids) and ids.max() > _INT64_MAX:
            raise InvalidInputError(
                f"id {ids[int(np.argmax(ids > _INT64_MAX))]} in {self.id_column!r} of "
                f"{self.path} is beyond the int64 range (up to 2**63 - 1) that LEAD keeps "
                "integer ids in",
                param="id",
            )
        return ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(object)

    def batches(self, batch_size: int, after: Any = None, until: Any = None) -> Iterator[Batch]:
        """Rows with a vector, in file and row order, after ``after`` source rows and up to
        row ``until`` (None: the end): batches of ``batch_size`` rows (the last one
        fewer), read in slices of about that many rows."""
        pending_ids: list[np.ndarray] = []
        pending_vectors: list[np.ndarray] = []
        count, position = 0, int(after or 0)
        stop = None if until is None else int(until)
        size = max(batch_size, _MIN_SLICE)
        for first, ids, vectors, keep in self._slices(position, stop, size):
            kept, lo = np.cumsum(keep), 0
            while lo < len(ids):
                # up to the row that completes the batch (NULL rows are not counted)
                need = (kept[lo - 1] if lo else 0) + batch_size - count
                hi = min(int(np.searchsorted(kept, need)) + 1, len(ids))
                part = keep[lo:hi]
                pending_ids.append(ids[lo:hi][part])
                pending_vectors.append(vectors[lo:hi][part])
                count += int(part.sum())
                position = first + hi
                if count >= batch_size:
                    yield Batch(
                        np.concatenate(pending_ids), np.concatenate(pending_vectors), position
                    )
                    pending_ids, pending_vectors, count = [], [], 0
                lo = hi
        if pending_ids and count:
            yield Batch(np.concatenate(pending_ids), np.concatenate(pending_vectors), position)

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        wanted = {k: i for i, k in enumerate(np.asarray(ids).tolist())}
        out = np.full((len(wanted), self.info.dim), np.nan, np.float32)
        found = np.zeros(len(wanted), bool)
        for _, group_ids, vectors, valid in self._slices(0):
            for j, key in enumerate(group_ids.tolist()):
                i = wanted.get(key)
                if i is not None and valid[j]:
                    out[i], found[i] = vectors[j], True
        if not found.all():
            missing = np.asarray(ids)[~found][0]
            raise InvalidInputError(
                f"{int((~found).sum())} ids have no vector in {self.path} (the first: {missing!r})",
                param="ids",
            )
        return out

    def sample_ids(self, n: int, seed: int) -> np.ndarray:
        every = [ids[valid] for _, ids, _, valid in self._slices(0)]
        pool = np.concatenate(every) if every else np.empty(0, np.int64)
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(pool), size=min(int(n), len(pool)), replace=False)
        return pool[np.sort(pick)]

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """The string column ``column`` of these ids, in that order (reads the id and text
        columns of every row group once, in slices).

        Raises
        ------
        StoreNotFoundError
            A file without ``column``.
        InvalidInputError
            ``column`` is not a string column; an id not in the files, or whose text is
            NULL, naming it.
        """
        pa = require("pyarrow", "arrow")
        for file, meta in zip(self.files, self._meta, strict=True):
            schema = meta.schema.to_arrow_schema()
            if column not in schema.names:
                raise StoreNotFoundError(f"{file} has no column {column!r}", param="text_column")
            kind = schema.field(column).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise InvalidInputError(
                    f"column {column!r} of {file} is {kind}, not a string column",
                    param="text_column",
                )
        wanted = set(np.asarray(ids).tolist())
        found: dict[Any, Any] = {}
        columns = [column] + ([self.id_column] if self.id_column else [])
        for first, batch in self._record_batches(columns, 0, None, _MIN_SLICE * 8):
            keys = self._ids(batch, first).tolist()
            values = batch.column(column).to_pylist()
            found.update((k, v) for k, v in zip(keys, values, strict=True) if k in wanted)
        return ordered_texts(ids, found, str(self.path), column)
