"""A Parquet folder as the target of a migration.

A Parquet target is a folder, outside the source folder: ``_lead_migration.json`` (what
fills it), one ``part-NNNNNN.parquet`` per batch (numbered from 0, in order; written to a
temporary name, fsynced, renamed, so a part is whole or absent), each carrying the source
position after it in its key-value metadata, and ``_SUCCESS`` when done. A run holds a lock
on ``_lead.lock`` (``flock``) while it writes, so a second run into the same folder is
refused; the kernel drops the lock of a killed run. A run killed at any point resumes after
the last part; pyarrow and every Parquet reader read the folder as one table (the dotted
and underscored files are skipped). A run of ``--engine ray`` writes one part per partition
instead (N is the partition's index) and its plan in ``_lead_partitions.json``
(:mod:`lead.migrate.partitions`); its driver holds the lock, its workers write their parts
under it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np

from lead._arrow import vector_column
from lead._durable import atomic_write
from lead.data import parse_spec
from lead.errors import ConflictError, DecodeError, InvalidInputError
from lead.migrate.files import ParquetSource
from lead.migrate.stores import (
    Closing,
    MigrationSpec,
    Progress,
    SourceInfo,
    check_same_migration,
    parse_store_uri,
    require,
)

__all__ = ["LOCK", "MANIFEST", "PARTITIONS", "SUCCESS", "ParquetTarget"]

MANIFEST, SUCCESS = "_lead_migration.json", "_SUCCESS"
#: the partition plan of a run that fills the folder in partitions (``--engine ray``)
PARTITIONS = "_lead_partitions.json"
_POSITION_KEY = b"lead.position"
#: the folder's lock file, held (``flock``) by the run that writes the folder
LOCK = "_lead.lock"


def _write_json(path: Path, value: dict[str, Any]) -> None:
    text = json.dumps(value, indent=2, sort_keys=True)
    atomic_write(path, lambda handle: handle.write(text.encode()))


def _own_temporary(name: str) -> bool:
    """A temporary file LEAD writes in a target folder (a part or the manifest, before
    their rename)."""
    return name.startswith((".part-", f".{MANIFEST}.")) and name.endswith(".tmp")


def _part_number(part: Path) -> int | None:
    """N of ``part-N.parquet``; None for another name."""
    digits = part.name[len("part-") : -len(".parquet")]
    return int(digits) if digits.isdigit() else None


def _read_manifest(manifest: Path) -> dict[str, Any]:
    try:
        value = json.loads(manifest.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise DecodeError(
            f"{manifest} is damaged ({error}); remove the folder {manifest.parent} to start "
            "the migration over",
            param="target",
        ) from None
    if not isinstance(value, dict):
        raise DecodeError(f"{manifest} is not a LEAD migration manifest", param="target")
    return value


class ParquetTarget(Closing):
    """A folder of Parquet parts, one per batch (see the module docstring).

    ``?column=NAME`` names the vector column (default ``embedding``); ids go in ``id``.

    Raises
    ------
    InvalidInputError
        Another parameter, or ``?column=id``.
    """

    def __init__(self, path: Path, params: dict[str, str]) -> None:
        require("pyarrow", "arrow")
        unused = sorted(set(params) - {"column"})
        if unused:
            raise InvalidInputError(
                f"{path}: a Parquet target takes only ?column=NAME (the vector column), not "
                f"{', '.join(unused)}",
                param="target",
            )
        self.path = path
        self.column = params.get("column", "embedding")
        if self.column in ("", "id"):
            raise InvalidInputError(
                f"{path}: the ids go in column 'id'; name the vector column otherwise "
                "(?column=embedding)",
                param="column",
            )
        self.uri = str(path)
        self.confidence_column: str | None = None
        self.dim, self.id_kind, self.parts = 0, "int", 0
        self._lock_fd: int | None = None

    def open(
        self, spec: MigrationSpec, source: SourceInfo, *, partitioned: bool = False
    ) -> Progress:
        """Create the folder and its manifest, or resume the migration it holds; take the
        folder's lock until :meth:`close`.

        ``partitioned``: the caller fills the folder partition by partition
        (:mod:`lead.migrate.partitions`); without it, a folder that such a run left
        unfinished is refused. A partitioned run's workers open the folder while its driver
        holds the lock (the driver takes it again in
        :meth:`~lead.migrate.partitions.ParquetPartitions.claim`).

        Raises
        ------
        InvalidInputError
            The folder is (inside) the source folder, or cannot be created or written.
        ConflictError
            A file (not a folder), a folder with other content, or another migration's;
            another run writing the folder; an unfinished partitioned run opened without
            ``partitioned``.
        DecodeError
            A damaged manifest or part.
        """
        self.dim, self.id_kind = spec.dim, spec.id_kind
        self._refuse_inside(source)
        for folder in (self.path, *self.path.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ConflictError(
                        f"{folder} exists and is not a folder; a Parquet target is a folder",
                        param="target",
                    )
                break
        had_lock = (self.path / LOCK).exists()
        made = [f for f in (self.path, *self.path.parents) if not f.exists()]  # deepest first
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            locked = self._lock()
        except OSError as error:
            raise InvalidInputError(
                f"cannot create or lock the target folder {self.path}: "
                f"{error.strerror or error}; choose a folder you can write to",
                param="target",
            ) from None
        if not locked and not (partitioned and (self.path / PARTITIONS).is_file()):
            raise self._busy()
        try:
            return self._open(spec, partitioned)
        except BaseException:
            # a refused run leaves nothing behind: no lock file in a folder that is not a
            # LEAD target (a user's own folder), no folders it made (parents included)
            if not had_lock and not (self.path / MANIFEST).exists():
                with contextlib.suppress(OSError):
                    (self.path / LOCK).unlink()
                for folder in made:  # the folders mkdir made, if still empty
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            self.close()
            raise

    def _open(self, spec: MigrationSpec, partitioned: bool) -> Progress:
        if self.confidence_column in ("id", self.column):
            raise InvalidInputError(
                f"{self.path}: the confidence column must not be named like the id or the "
                f"vector column ({self.confidence_column!r})",
                param="confidence_column",
            )
        want = {**spec.as_dict(), "column": self.column}
        manifest = self.path / MANIFEST
        if manifest.is_file():
            check_same_migration(str(self.path), want, _read_manifest(manifest))
            # a partitioned run's workers open the folder while others write their parts
            progress = self._progress(clean=not partitioned)
            if not partitioned and not progress.done and (self.path / PARTITIONS).is_file():
                raise ConflictError(
                    f"{self.path} is being filled in partitions by `--engine ray`; resume it "
                    "with --engine ray",
                    param="target",
                )
            return progress
        # a run killed before its manifest landed leaves LEAD's own files only
        left = [p for p in self.path.iterdir() if p.name != LOCK]
        if not all(_own_temporary(p.name) for p in left):
            raise ConflictError(
                f"{self.path} exists with other content; choose a new or empty folder",
                param="target",
            )
        for stale in left:
            stale.unlink(missing_ok=True)
        try:
            _write_json(manifest, want)
        except OSError as error:
            raise InvalidInputError(
                f"cannot write to the target folder {self.path}: {error.strerror or error}",
                param="target",
            ) from None
        return Progress()

    def _refuse_inside(self, source: SourceInfo) -> None:
        """Refuse a folder that is the source folder or inside it (its parts would be read
        as source rows), before anything is written."""
        try:
            parsed = parse_store_uri(source.uri)
        except InvalidInputError:
            return
        origin = parse_spec(parsed.path)[0] if parsed.scheme == "file" else None
        if origin is None or not origin.is_dir():
            return
        here, origin = self.path.resolve(), origin.resolve()
        if here == origin or origin in here.parents:
            raise InvalidInputError(
                f"the target {self.path} is inside the source folder {origin}; its parts "
                "would be read as source rows: choose a target outside the source folder",
                param="target",
            )

    def _busy(self) -> ConflictError:
        return ConflictError(
            f"{self.path} is being written: another apply is writing it; wait until it "
            "ends, or choose another target",
            param="target",
        )

    def _lock(self) -> bool:
        """Take the folder's lock (held until :meth:`close`); False when another run
        holds it."""

        if self._lock_fd is not None:
            return True
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd
        return True

    def lock(self) -> None:
        """Hold the folder's lock until :meth:`close` (what a partitioned run's driver
        does before it records its plan).

        Raises
        ------
        ConflictError
            Another run holds it.
        """
        if not self._lock():
            raise self._busy()

    def close(self) -> None:
        """Let go of the folder's lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _part_files(self) -> list[Path]:
        """The parts in the order written, by number (``part-1000000`` after ``999999``)."""
        parts = [p for p in self.path.glob("part-*.parquet") if _part_number(p) is not None]
        return sorted(parts, key=lambda p: _part_number(p) or 0)

    def _progress(self, *, clean: bool = True) -> Progress:
        pa = require("pyarrow", "arrow")
        pq = require("pyarrow.parquet", "arrow")
        if clean:
            self.remove_unfinished_parts()
        parts = self._part_files()
        self.parts = (_part_number(parts[-1]) or 0) + 1 if parts else 0
        done = (self.path / SUCCESS).is_file()
        if not parts:
            return Progress(done=done)
        try:
            metas = [pq.read_metadata(part) for part in parts]
            state = json.loads((metas[-1].metadata or {})[_POSITION_KEY])
        except (pa.ArrowException, OSError, KeyError, ValueError, RecursionError) as error:
            raise DecodeError(
                f"a part in {self.path} is damaged or not LEAD's ({error!r}); remove the "
                "folder to start the migration over",
                param="target",
            ) from None
        return Progress(state["position"], sum(m.num_rows for m in metas), done)

    def remove_unfinished_parts(self) -> None:
        """Delete the temporary files of parts that a killed run did not finish."""
        for stale in self.path.glob(".part-*.tmp"):
            stale.unlink(missing_ok=True)

    def write(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        progress: Progress,
        confidence: np.ndarray | None = None,
    ) -> None:
        """Write one part (temporary name, fsync, rename) carrying the checkpoint (and the
        rows' confidences in :attr:`confidence_column`, when set)."""
        state = {"position": progress.position, "rows_written": progress.rows_written}
        batch = (ids, vectors) if confidence is None else (ids, vectors, confidence)
        self.write_part(f"part-{self.parts:06d}.parquet", state, [batch])
        self.parts += 1

    def write_part(
        self, name: str, state: dict[str, Any], batches: Iterable[tuple[np.ndarray, ...]]
    ) -> int:
        """Write the rows of ``batches`` as part ``name`` (one row group per batch), whole
        or not at all: to a temporary name, fsynced, renamed. ``state`` goes in its
        key-value metadata. Returns the rows written.

        Parameters
        ----------
        batches : iterable of (ids, vectors) or (ids, vectors, confidence)
            ids of shape (m,), int64 or str; vectors of shape (m, dim), float32;
            confidence of shape (m,), float32 (with :attr:`confidence_column` set).
        """
        pa = require("pyarrow", "arrow")
        pq = require("pyarrow.parquet", "arrow")
        fields = [
            ("id", pa.int64() if self.id_kind == "int" else pa.string()),
            (self.column, pa.list_(pa.float32(), self.dim)),
        ]
        if self.confidence_column is not None:
            fields.append((self.confidence_column, pa.float32()))
        schema = pa.schema(fields, metadata={_POSITION_KEY: json.dumps(state).encode()})
        rows = 0

        def write(handle: IO[bytes]) -> None:
            nonlocal rows
            with pq.ParquetWriter(handle, schema) as writer:
                for ids, vectors, *scores in batches:
                    arrays = [
                        pa.array(ids.tolist() if ids.dtype == object else ids),
                        vector_column(vectors),
                    ]
                    if self.confidence_column is not None:
                        if not scores:
                            raise InvalidInputError(
                                f"{self.path} records confidences in "
                                f"{self.confidence_column!r}: every batch needs them",
                                param="confidence_column",
                            )
                        arrays.append(pa.array(np.asarray(scores[0], dtype=np.float32)))
                    writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
                    rows += len(ids)

        atomic_write(self.path / name, write)
        return rows

    def finish(self, progress: Progress) -> None:
        """Mark the migration done; a migration of no rows first writes one empty part
        with the schema, so that the folder reads as a table of 0 rows (with no part,
        ``migrate verify``, ``plan`` and Parquet readers found "no .parquet files")."""
        if not any(self.path.glob("*.parquet")):
            state = {"position": progress.position, "rows_written": 0}
            self.write_part(f"part-{self.parts:06d}.parquet", state, [])
            self.parts += 1
        _write_json(self.path / SUCCESS, {"rows": progress.rows_written})

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Translated vectors of ``ids`` in that order (reads every part)."""
        source = ParquetSource(self.path, {"column": self.column, "id": "id"})
        return source.fetch(ids)
