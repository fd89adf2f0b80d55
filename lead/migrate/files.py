"""File stores, the embedded default that needs no server: Parquet in and out, ``.npy`` and
``.safetensors`` in.

A Parquet source is a file or a folder of ``*.parquet`` files (read in name order, row
group by row group, through pyarrow): ``?column=NAME`` names the vector column (default:
the only list-of-floats column), ``?id=NAME`` the id column (default ``id`` when there is
one, else the row number). ``.npy`` and ``.safetensors[:tensor]`` sources are read by row
range (:class:`lead.data.EmbeddingReader`); their ids are row numbers. A position is the
number of source rows read.

A Parquet target is a folder: ``_lead_migration.json`` (what fills it), one
``part-NNNNNN.parquet`` per batch (written to a temporary name, fsynced, renamed, so a
part is whole or absent), each carrying the source position after it in its key-value
metadata, and ``_SUCCESS`` when done. A run killed at any point resumes after the last
part; pyarrow and every Parquet reader read the folder as one table (the dotted and
underscored files are skipped). A run of ``--engine ray`` writes one part per partition
instead (N is the partition's index) and its plan in ``_lead_partitions.json``
(:mod:`lead.migrate.partitions`).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lead.data import EmbeddingReader, parse_spec
from lead.errors import (
    ConflictError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    StoreNotFoundError,
)
from lead.migrate.stores import (
    Batch,
    Closing,
    MigrationSpec,
    Progress,
    SourceInfo,
    StoreURI,
    check_same_migration,
    ordered_texts,
    require,
    with_params,
)

__all__ = ["ArraySource", "ParquetSource", "ParquetTarget", "open_file_source"]

MANIFEST, SUCCESS = "_lead_migration.json", "_SUCCESS"
#: the partition plan of a run that fills the folder in partitions (``--engine ray``)
PARTITIONS = "_lead_partitions.json"
_POSITION_KEY = b"lead.position"


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
        self.info = SourceInfo(
            uri=str(spec),
            rows=len(self.reader),
            dim=int(self.reader.shape[1]),
            id_kind="int",
            null_rows=0,
        )

    def check(self, *, skip_null: bool = False) -> None:
        """Read every row once: NaN, infinity or values beyond float32 are refused.

        Raises
        ------
        NonFiniteError
            Naming the row.
        """
        for _ in self.reader.iter_batches(65536):  # the reader checks each batch
            pass

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


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith(("_", ".")))
    if not files:
        raise StoreNotFoundError(f"{path} holds no .parquet files", param="source")
    return files


def _vector_column(schema: Any, wanted: str | None, where: str) -> str:
    pa = require("pyarrow", "arrow")
    if wanted:
        if wanted not in schema.names:
            raise StoreNotFoundError(f"{where} has no column {wanted!r}", param="column")
        return wanted
    lists = [
        f.name
        for f in schema
        if (
            pa.types.is_list(f.type)
            or pa.types.is_fixed_size_list(f.type)
            or pa.types.is_large_list(f.type)
        )
        and pa.types.is_floating(f.type.value_type)
    ]
    if len(lists) != 1:
        raise InvalidInputError(
            f"{where} has {len(lists)} list-of-floats columns ({', '.join(lists) or 'none'}); "
            "name the vector column with ?column=NAME",
            param="column",
        )
    return str(lists[0])


def _vectors(column: Any, dim: int | None, ids: np.ndarray, where: str) -> np.ndarray:
    """A list / fixed_size_list column (no nulls) as (m, d) float32."""
    pa = require("pyarrow", "arrow")
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
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
    values = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32)
    return values.reshape(len(column), width)


class ParquetSource(Closing):
    """Parquet file or folder, read row group by row group (see the module docstring)."""

    def __init__(self, path: Path, params: dict[str, str]) -> None:
        pq = require("pyarrow.parquet", "arrow")
        self.path, self.files = path, _parquet_files(path)
        self._meta = [pq.ParquetFile(f) for f in self.files]
        schema = self._meta[0].schema_arrow
        self.column = _vector_column(schema, params.get("column"), str(path))
        wanted_id = params.get("id")
        if wanted_id and wanted_id not in schema.names:
            raise StoreNotFoundError(f"{path} has no id column {wanted_id!r}", param="id")
        self.id_column = wanted_id or ("id" if "id" in schema.names else None)
        rows = sum(m.metadata.num_rows for m in self._meta)
        nulls = self._null_count()
        id_kind = "int"
        if self.id_column is not None:
            pa = require("pyarrow", "arrow")
            kind = schema.field(self.id_column).type
            if pa.types.is_integer(kind):
                id_kind = "int"
            elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
                id_kind = "str"
            else:
                raise InvalidInputError(
                    f"id column {self.id_column!r} of {path} is {kind}; ids must be integers "
                    "or strings",
                    param="id",
                )
        self._dim: int | None = None
        first = next(self._groups(0), None)
        dim = 0 if first is None else first[2].shape[1]
        uri = with_params(str(path), column=self.column, id=self.id_column)
        self.info = SourceInfo(uri, rows, dim, id_kind, nulls)

    def _null_count(self) -> int | None:
        total = 0
        for meta in self._meta:
            index = meta.schema_arrow.get_field_index(self.column)
            for g in range(meta.metadata.num_row_groups):
                # the leaf column of a list: its statistics count null lists and null values
                stats = meta.metadata.row_group(g).column(index).statistics
                if stats is None or not stats.has_null_count:
                    return None
                total += stats.null_count
        return total

    def row_groups(self) -> list[list[int]]:
        """Rows of each row group of each file, in reading order (files in name order)."""
        return [
            [meta.metadata.row_group(g).num_rows for g in range(meta.metadata.num_row_groups)]
            for meta in self._meta
        ]

    def _groups(
        self, start: int, stop: int | None = None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(first row, ids, vectors, valid) per row group for rows ``start`` to ``stop``
        (excluded; None: the end); the rows of NULL vectors are zeros with ``valid`` false."""
        pa = require("pyarrow", "arrow")
        offset = 0
        columns = [self.column] + ([self.id_column] if self.id_column else [])
        for meta in self._meta:
            for g in range(meta.metadata.num_row_groups):
                n = meta.metadata.row_group(g).num_rows
                if stop is not None and offset >= stop:
                    return
                if offset + n <= start:
                    offset += n
                    continue
                skip = max(0, start - offset)
                end = n if stop is None else min(n, stop - offset)
                table = meta.read_row_group(g, columns=columns).slice(skip, end - skip)
                first = offset + skip
                ids = self._ids(table, first)
                column = table.column(self.column).combine_chunks()
                valid = np.asarray(column.is_valid(), dtype=bool)
                good = _vectors(
                    column.filter(pa.array(valid)), self._dim, ids[valid], str(self.path)
                )
                if self._dim is None:
                    self._dim = good.shape[1]
                vectors = np.zeros((table.num_rows, good.shape[1]), np.float32)
                vectors[valid] = good
                yield first, ids, vectors, valid
                offset += n

    def check(self, *, skip_null: bool = False) -> None:
        """Read every row once: NULL vectors (unless ``skip_null``), NaN / infinity, mixed
        dimensions and duplicate ids are refused, naming the id.

        Raises
        ------
        InvalidInputError, NonFiniteError, ShapeMismatchError
        """
        seen: list[np.ndarray] = []
        for _, ids, vectors, valid in self._groups(0):
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
        if table.column(self.id_column).null_count:
            raise InvalidInputError(
                f"{self.path} holds NULL ids in {self.id_column!r}; every row needs an id",
                param="id",
            )
        ids = np.asarray(table.column(self.id_column).to_numpy(zero_copy_only=False))
        return ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(object)

    def batches(self, batch_size: int, after: Any = None, until: Any = None) -> Iterator[Batch]:
        """Rows with a vector, in file and row order, after ``after`` source rows and up to
        row ``until`` (None: the end)."""
        pending_ids: list[np.ndarray] = []
        pending_vectors: list[np.ndarray] = []
        count, position = 0, int(after or 0)
        stop = None if until is None else int(until)
        for first, ids, vectors, keep in self._groups(position, stop):
            for lo in range(0, len(ids), batch_size):
                hi = min(lo + batch_size, len(ids))
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
        if pending_ids and count:
            yield Batch(np.concatenate(pending_ids), np.concatenate(pending_vectors), position)

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        wanted = {k: i for i, k in enumerate(np.asarray(ids).tolist())}
        out = np.full((len(wanted), self.info.dim), np.nan, np.float32)
        found = np.zeros(len(wanted), bool)
        for _, group_ids, vectors, valid in self._groups(0):
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
        every = [ids[valid] for _, ids, _, valid in self._groups(0)]
        pool = np.concatenate(every) if every else np.empty(0, np.int64)
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(pool), size=min(int(n), len(pool)), replace=False)
        return pool[np.sort(pick)]

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """The string column ``column`` of these ids, in that order (reads the id and text
        columns of every row group once).

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
            schema = meta.schema_arrow
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
        offset = 0
        for meta in self._meta:
            for g in range(meta.metadata.num_row_groups):
                table = meta.read_row_group(g, columns=columns)
                keys = self._ids(table, offset).tolist()
                values = table.column(column).to_pylist()
                found.update((k, v) for k, v in zip(keys, values, strict=True) if k in wanted)
                offset += table.num_rows
        return ordered_texts(ids, found, str(self.path), column)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class ParquetTarget(Closing):
    """A folder of Parquet parts, one per batch (see the module docstring).

    ``?column=NAME`` names the vector column (default ``embedding``); ids go in ``id``.
    """

    def __init__(self, path: Path, params: dict[str, str]) -> None:
        require("pyarrow", "arrow")
        self.path = path
        self.column = params.get("column", "embedding")
        self.uri = str(path)
        self.dim, self.id_kind, self.parts = 0, "int", 0

    def open(
        self, spec: MigrationSpec, source: SourceInfo, *, partitioned: bool = False
    ) -> Progress:
        """Create the folder and its manifest, or resume the migration it holds.

        ``partitioned``: the caller fills the folder partition by partition
        (:mod:`lead.migrate.partitions`); without it, a folder that such a run left
        unfinished is refused.

        Raises
        ------
        ConflictError
            A file (not a folder), a folder with other content, or another migration's;
            an unfinished partitioned run opened without ``partitioned``.
        """
        self.dim, self.id_kind = spec.dim, spec.id_kind
        want = {**spec.as_dict(), "column": self.column}
        manifest = self.path / MANIFEST
        if self.path.exists() and not self.path.is_dir():
            raise ConflictError(f"{self.path} exists and is not a folder", param="target")
        if manifest.is_file():
            have = json.loads(manifest.read_text())
            check_same_migration(str(self.path), want, have)
            # a partitioned run's workers open the folder while others write their parts
            progress = self._progress(clean=not partitioned)
            if not partitioned and not progress.done and (self.path / PARTITIONS).is_file():
                raise ConflictError(
                    f"{self.path} is being filled in partitions by `--engine ray`; resume it "
                    "with --engine ray",
                    param="target",
                )
            return progress
        if self.path.is_dir() and any(self.path.iterdir()):
            raise ConflictError(
                f"{self.path} exists with other content; choose a new or empty folder",
                param="target",
            )
        self.path.mkdir(parents=True, exist_ok=True)
        _write_json(manifest, want)
        return Progress()

    def _part_files(self) -> list[Path]:
        return sorted(self.path.glob("part-*.parquet"))

    def _progress(self, *, clean: bool = True) -> Progress:
        pq = require("pyarrow.parquet", "arrow")
        if clean:
            self.remove_unfinished_parts()
        parts = self._part_files()
        self.parts = len(parts)
        done = (self.path / SUCCESS).is_file()
        if not parts:
            return Progress(done=done)
        metas = [pq.read_metadata(part) for part in parts]
        state = json.loads((metas[-1].metadata or {})[_POSITION_KEY])
        return Progress(state["position"], sum(m.num_rows for m in metas), done)

    def remove_unfinished_parts(self) -> None:
        """Delete the temporary files of parts that a killed run did not finish."""
        for stale in self.path.glob(".part-*.tmp"):
            stale.unlink(missing_ok=True)

    def write(self, ids: np.ndarray, vectors: np.ndarray, progress: Progress) -> None:
        """Write one part (temporary name, fsync, rename) carrying the checkpoint."""
        state = {"position": progress.position, "rows_written": progress.rows_written}
        self.write_part(f"part-{self.parts:06d}.parquet", state, [(ids, vectors)])
        self.parts += 1

    def write_part(
        self, name: str, state: dict[str, Any], batches: Iterable[tuple[np.ndarray, np.ndarray]]
    ) -> int:
        """Write the rows of ``batches`` as part ``name`` (one row group per batch), whole
        or not at all: to a temporary name, fsynced, renamed. ``state`` goes in its
        key-value metadata. Returns the rows written.

        Parameters
        ----------
        batches : iterable of (ids, vectors)
            ids of shape (m,), int64 or str; vectors of shape (m, dim), float32.
        """
        pa = require("pyarrow", "arrow")
        pq = require("pyarrow.parquet", "arrow")
        schema = pa.schema(
            [
                ("id", pa.int64() if self.id_kind == "int" else pa.string()),
                (self.column, pa.list_(pa.float32(), self.dim)),
            ],
            metadata={_POSITION_KEY: json.dumps(state).encode()},
        )
        tmp = self.path / f".{name}.{uuid.uuid4().hex}.tmp"
        rows = 0
        try:
            with tmp.open("wb") as handle:
                with pq.ParquetWriter(handle, schema) as writer:
                    for ids, vectors in batches:
                        values = pa.array(np.ascontiguousarray(vectors, np.float32).reshape(-1))
                        column = pa.FixedSizeListArray.from_arrays(values, self.dim)
                        id_array = pa.array(ids.tolist() if ids.dtype == object else ids)
                        writer.write_table(pa.Table.from_arrays([id_array, column], schema=schema))
                        rows += len(ids)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path / name)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.path)
        return rows

    def finish(self, progress: Progress) -> None:
        _write_json(self.path / SUCCESS, {"rows": progress.rows_written})

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Translated vectors of ``ids`` in that order (reads every part)."""
        source = ParquetSource(self.path, {"column": self.column, "id": "id"})
        return source.fetch(ids)
