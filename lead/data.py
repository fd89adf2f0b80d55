"""Embedding files: read paired vectors lazily by row range, and stream translations out.

A file is named by a *spec*: ``path.safetensors:tensor`` (or just ``path.safetensors`` when
it holds one tensor), or ``path.npy``. Reading goes through ``safe_open(...).get_slice`` or
``np.load(mmap_mode="r")``, so only the rows asked for are read; every batch is checked to
be finite and within the float32 range (a float64 file with 1e200 is an error, never an
infinity). :func:`check_embeddings` checks a whole array the way fitting does (finite,
within float32, column spreads not too far apart); the service runs it on uploads.
:class:`EmbeddingWriter` writes ``.npy`` or ``.safetensors`` row batches straight to disk
(into a temporary file that is renamed at the end), so an export of any size needs memory
for one batch only.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from numpy.lib.format import open_memmap
from safetensors import SafetensorError, safe_open

from lead._options import check_int_option
from lead._validation import check_column_spread, check_float32_range
from lead.errors import DecodeError, InvalidInputError, NonFiniteError, ShapeMismatchError

__all__ = [
    "EmbeddingReader",
    "EmbeddingWriter",
    "check_embeddings",
    "parse_spec",
    "read_embeddings",
]

SUFFIXES = (".safetensors", ".npy")


def parse_spec(spec: str | Path) -> tuple[Path, str | None]:
    """Split ``"file.safetensors:tensor"`` into ``(Path("file.safetensors"), "tensor")``.

    A spec without ``:tensor`` (or whose full text names an existing file) gives ``None``.
    """
    text = str(spec)
    head, sep, tail = text.rpartition(":")
    if sep and head and tail and not Path(text).exists() and head.endswith(SUFFIXES):
        return Path(head), tail
    return Path(text), None


#: safetensors' dtype codes of floating values, as NumPy names them (integers: lower case).
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class EmbeddingReader:
    """Lazy, row-range reader of one 2-D embedding array in a ``.safetensors`` or ``.npy`` file.

    Parameters
    ----------
    spec : str or Path
        ``file.safetensors[:tensor]`` or ``file.npy``.

    Attributes
    ----------
    path : Path
    tensor : str or None
        The safetensors tensor name (``None`` for ``.npy``).
    shape : tuple of int
        ``(n, d)``.
    dtype : str
        How the file stores the values, as NumPy names it (``float32``, ``float64``,
        ``float16``, ``bfloat16``, ``int8``, ...); :meth:`read` gives float32 whatever it is.

    Raises
    ------
    InvalidInputError
        Missing file, unknown suffix, or a tensor name that is absent / ambiguous.
    DecodeError
        A file that is not valid safetensors / npy.
    ShapeMismatchError
        An array that is not 2-D.
    """

    def __init__(self, spec: str | Path) -> None:
        self.spec = str(spec)
        self.path, self.tensor = parse_spec(spec)
        if not self.path.is_file():
            message = (
                f"{self.path} is not a regular file (a folder, a device or a pipe)"
                if self.path.exists()
                else f"no such file: {self.path}"
            )
            raise InvalidInputError(message, param=self.spec)
        suffix = self.path.suffix.lower()
        if suffix not in SUFFIXES:
            raise InvalidInputError(
                f"{self.path}: expected a .safetensors or .npy file", param=self.spec
            )
        if suffix == ".npy":
            if self.tensor is not None:
                raise InvalidInputError(f"{self.path}: .npy files hold one array", param=self.spec)
            array = self._npy()
            shape, self.dtype = tuple(array.shape), array.dtype.name
        else:
            shape, self.dtype = self._safetensors_shape()
        if len(shape) != 2:
            raise ShapeMismatchError(
                f"{self.spec} must hold a 2-D array (n, d), got shape {shape}",
                expected="(n, d)",
                got=shape,
                param=self.spec,
            )
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))

    def _npy(self) -> np.ndarray:
        try:
            with open(self.path, "rb") as handle:
                magic = handle.read(len(np.lib.format.MAGIC_PREFIX))
            # without the magic string np.load would take the file for a pickle, and say so
            npy = magic == np.lib.format.MAGIC_PREFIX
            array: np.ndarray | None = (
                np.load(self.path, mmap_mode="r", allow_pickle=False) if npy else None
            )
        except (ValueError, OSError, EOFError) as error:
            reason = (
                "it holds Python objects (pickled), which LEAD never loads; save a numeric array"
                if "allow_pickle" in str(error) or "Python objects" in str(error)
                else str(error)
            )
            raise DecodeError(
                f"cannot read {self.path} as .npy: {reason}", param=self.spec
            ) from None
        if array is None:
            raise DecodeError(
                f"cannot read {self.path} as .npy: it does not start with the .npy magic "
                "string (write it with numpy.save)",
                param=self.spec,
            )
        if array.dtype.kind not in "iuf":
            raise DecodeError(f"{self.path} holds {array.dtype}, not numbers", param=self.spec)
        return array

    def _safetensors_shape(self) -> tuple[tuple[int, ...], str]:
        try:
            with safe_open(str(self.path), framework="pt") as f:
                names = list(f.keys())
                if self.tensor is None:
                    if len(names) != 1:
                        raise InvalidInputError(
                            f"{self.path} holds tensors {', '.join(names) or '(none)'}; "
                            f"name one as {self.path}:TENSOR",
                            param=self.spec,
                        )
                    self.tensor = names[0]
                if self.tensor not in names:
                    raise InvalidInputError(
                        f"{self.path} has no tensor {self.tensor!r} (it has {', '.join(names)})",
                        param=self.spec,
                    )
                found = f.get_slice(self.tensor)
                code = found.get_dtype()
                return tuple(found.get_shape()), _SAFETENSORS_DTYPES.get(code, code.lower())
        except (SafetensorError, OSError) as error:
            raise DecodeError(f"cannot read {self.path} as safetensors: {error}") from None

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` as a float32 array of shape ``(stop - start, d)``, checked finite.

        Raises
        ------
        NonFiniteError
            If a row holds NaN or infinity, or a value beyond the float32 range (its
            absolute row index is named).
        """
        stop = self.shape[0] if stop is None else min(stop, self.shape[0])
        start = max(0, min(start, stop))
        if self.tensor is None:
            raw: np.ndarray | torch.Tensor = self._npy()[start:stop]
        else:
            try:
                with safe_open(str(self.path), framework="pt") as f:
                    raw = f.get_slice(self.tensor)[start:stop]
            except (SafetensorError, OSError) as error:
                raise DecodeError(f"cannot read {self.path}: {error}", param=self.spec) from None
        _check_finite(raw, name=self.spec, first_row=start)
        check_float32_range(raw, name=self.spec, first_row=start)  # before the cast: no inf
        if isinstance(raw, torch.Tensor):
            return raw.to(torch.float32).numpy()
        return np.array(raw, dtype=np.float32)

    def iter_batches(self, batch_size: int = 4096) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(start, rows)`` for consecutive batches of at most ``batch_size`` rows."""
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", param="batch_size")
        for start in range(0, self.shape[0], batch_size):
            yield start, self.read(start, start + batch_size)


def _check_finite(x: np.ndarray | torch.Tensor, *, name: str, first_row: int = 0) -> None:
    """Refuse NaN and infinity in ``(n, d)`` ``x``, naming the first row that holds one."""
    if isinstance(x, torch.Tensor):
        bad_rows = (~torch.isfinite(x)).any(dim=1).nonzero().flatten().numpy()
    else:
        bad_rows = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if len(bad_rows):
        raise NonFiniteError(
            f"{name} holds NaN or infinity in row {first_row + int(bad_rows[0])}", param=name
        )


def check_embeddings(array: np.ndarray | torch.Tensor, *, name: str) -> None:
    """Check an embedding matrix the way fitting will: finite, float32-sized, not ill-conditioned.

    Parameters
    ----------
    array : ndarray or Tensor of shape (n, d)
        float16, float32 or float64 values (never copied whole).
    name : str
        The array's name in messages and the errors' ``param``.

    Raises
    ------
    NonFiniteError
        If it holds NaN or infinity, or a value beyond the float32 range (±3.4e38),
        naming the first row (and column) concerned.
    IllConditionedError
        If its widest column spreads more than :data:`lead._validation.MAX_SPREAD_RATIO`
        (about 8.4e6) times wider than the median column, or no column varies by the
        smallest float32: in float32 the data would be rounded away. Constant columns and
        columns narrower than the median (dead dimensions) are fine.

    Examples
    --------
    >>> check_embeddings(np.eye(4, dtype=np.float32), name="source")
    >>> check_embeddings(np.array([[1.0, 0.0], [1e200, 1.0]]), name="source")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lead.errors.NonFiniteError: source holds 1e+200 in row 1, column 0: ...
    """
    _check_finite(array, name=name)
    check_float32_range(array, name=name)
    tensor = array if isinstance(array, torch.Tensor) else _as_tensor(array)
    check_column_spread(tensor, name=name)


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor sharing its memory (a copy only when torch cannot share it)."""
    if not array.flags.writeable or array.dtype.byteorder not in "=|":
        array = np.array(array, dtype=array.dtype.newbyteorder("="))
    return torch.from_numpy(array)


def read_embeddings(spec: str | Path, rows: np.ndarray | None = None) -> np.ndarray:
    """Read a whole embedding array (or the given rows) as float32 of shape ``(n, d)``.

    Parameters
    ----------
    spec : str or Path
        As :class:`EmbeddingReader`.
    rows : array_like of int, shape (m,), optional
        Row indices in ``[0, n)``, in any order (repeats allowed); all rows when None.

    Raises
    ------
    InvalidInputError, DecodeError, ShapeMismatchError, NonFiniteError
        As :class:`EmbeddingReader`; ``rows`` that is not a 1-D array of integers in
        ``[0, n)`` (``param`` ``rows``).
    """
    data = EmbeddingReader(spec).read()
    return data if rows is None else data[_row_indices(rows, data.shape[0])]


def _row_indices(rows: Any, n: int) -> np.ndarray:
    """``rows`` as int64 indices into ``n`` rows: 1-D integers in ``[0, n)`` (no booleans,
    no negative indices counted from the end)."""
    try:
        index = np.asarray(rows)
    except (TypeError, ValueError) as error:  # ragged lists
        raise InvalidInputError("rows must be a 1-D array of row indices", param="rows") from error
    if index.size == 0 and index.ndim == 1:
        return index.astype(np.int64)
    if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
        raise InvalidInputError(
            f"rows must be a 1-D array of integer row indices, got {index.ndim}-D {index.dtype}",
            param="rows",
        )
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= n:
        raise InvalidInputError(
            f"rows must lie in [0, {n}) (the file's rows), got {low if low < 0 else high}",
            param="rows",
        )
    return index.astype(np.int64)


def _reserve(path: Path) -> None:
    """Allocate the blocks of ``path`` (a sparse file of its final size) now.

    A memory map writes into a sparse file page by page; on a full disk the kernel then
    kills the process with SIGBUS, leaving the temporary file. Reserved first, a full disk
    is an ``OSError`` (``ENOSPC``) here instead, before any work.
    """
    size = path.stat().st_size
    if not size or not hasattr(os, "posix_fallocate"):  # macOS and Windows have none
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
            raise
    finally:
        os.close(fd)


class EmbeddingWriter:
    """Write ``(n, d)`` float32 rows batch by batch to ``.npy`` or ``.safetensors``.

    Use as a context manager; the file appears (atomically renamed) only when all ``n``
    rows were written without error.

    Parameters
    ----------
    spec : str or Path
        ``out.npy``, or ``out.safetensors[:tensor]`` (tensor name default ``embeddings``).
    n, d : int
        Rows and columns of the output.
    metadata : dict of str to str, optional
        safetensors header metadata (ignored for ``.npy``).
    """

    def __init__(
        self, spec: str | Path, n: int, d: int, *, metadata: dict[str, str] | None = None
    ) -> None:
        self.path, tensor = parse_spec(spec)
        self.n = check_int_option(n, "n", minimum=0)
        self.d = check_int_option(d, "d", minimum=1)
        self.rows = 0
        suffix = self.path.suffix.lower()
        if suffix not in SUFFIXES:
            raise InvalidInputError(
                f"{self.path}: output must be .npy or .safetensors", param="output"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._memmap: np.memmap[Any, Any] | None = None
        self._file: Any = None
        if suffix == ".npy":
            try:
                self._memmap = open_memmap(
                    self._tmp, mode="w+", dtype="<f4", shape=(self.n, self.d)
                )
                _reserve(self._tmp)
            except BaseException:
                self._memmap = None
                self._tmp.unlink(missing_ok=True)
                raise
        else:
            header: dict[str, Any] = {
                tensor or "embeddings": {
                    "dtype": "F32",
                    "shape": [self.n, self.d],
                    "data_offsets": [0, self.n * self.d * 4],
                }
            }
            if metadata:
                header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)
            self._file = open(self._tmp, "wb")  # noqa: SIM115
            self._file.write(struct.pack("<Q", len(raw)) + raw)

    def write(self, batch: np.ndarray) -> None:
        """Append rows of shape ``(m, d)`` (converted to little-endian float32).

        Raises
        ------
        ShapeMismatchError
            Rows of another width, or more rows than ``n`` in all.
        NonFiniteError
            NaN, infinity, or a value beyond the float32 range (which
            :class:`EmbeddingReader` would refuse), naming its row.
        """
        batch = np.asarray(batch)
        if batch.ndim != 2 or batch.shape[1] != self.d or self.rows + batch.shape[0] > self.n:
            raise ShapeMismatchError(
                f"cannot write a batch of shape {batch.shape} after {self.rows} of "
                f"{self.n} rows of dimension {self.d}",
                expected=(self.n - self.rows, self.d),
                got=batch.shape,
            )
        if batch.dtype.kind not in "fiub":
            raise InvalidInputError(f"cannot write values of dtype {batch.dtype}", param="batch")
        with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused
            values = np.ascontiguousarray(batch, dtype="<f4")
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            row = self.rows + int(np.flatnonzero(~finite)[0])
            raise NonFiniteError(
                f"cannot write NaN, infinity or a value beyond the float32 range (row {row})",
                param="batch",
            )
        if self._memmap is not None:
            self._memmap[self.rows : self.rows + batch.shape[0]] = values
        else:
            self._file.write(values.tobytes())
        self.rows += batch.shape[0]

    def _close(self) -> None:
        if self._memmap is not None:
            self._memmap.flush()
            self._memmap = None
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def __enter__(self) -> EmbeddingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()
        if exc_type is None and self.rows != self.n:
            self._tmp.unlink(missing_ok=True)
            raise ShapeMismatchError(
                f"wrote {self.rows} rows, expected {self.n}", expected=self.n, got=self.rows
            )
        if exc_type is None:
            try:
                os.replace(self._tmp, self.path)
            except OSError:  # the output is a directory, say: no temporary file left
                self._tmp.unlink(missing_ok=True)
                raise
        else:
            self._tmp.unlink(missing_ok=True)
