"""Vectors on the wire: JSON float arrays or base64 strings of little-endian float32.

Base64 goes through pybase64 (SIMD); a whole batch is decoded or encoded in one call when
a row's bytes are a multiple of 3 (no padding inside the joined string).

Decoding goes straight into one C-contiguous, writable ``float32`` array of shape
``(n, d_src)``; every error names the offending ``input[i]``.
"""

from __future__ import annotations

import binascii
import functools
import math
from numbers import Real
from typing import Any, Literal

import numpy as np
import orjson
import pybase64  # SIMD base64, API of the standard library's; ~30x faster on big batches

from lead.errors import (
    DecodeError,
    InvalidInputError,
    LimitExceededError,
    NonFiniteError,
    ShapeMismatchError,
)

__all__ = [
    "EncodingFormat",
    "check_finite",
    "check_vector_count",
    "decode_vectors",
    "float32_rows",
    "json_kind",
    "reject_bools",
    "render_embeddings",
]

EncodingFormat = Literal["float", "base64"]

_LE_F32 = np.dtype("<f4")


def decode_vectors(items: Any, d_src: int, *, check_bools: bool = True) -> np.ndarray:
    """Decode the request's ``input`` into one array.

    Parameters
    ----------
    items : list of list of float, or list of str
        Float arrays, or base64 strings of ``4 * d_src`` little-endian float32 bytes each.
    d_src : int
        The dimension the (first) stitch expects.
    check_bools : bool, default True
        Refuse ``true`` / ``false`` among the numbers of float arrays (NumPy would read a
        row mixing them with floats as 1.0 / 0.0). A caller whose items come from a typed
        decoder that refuses them (:mod:`service.translate_body`) skips this scan of every
        value.

    Returns
    -------
    ndarray of shape (n, d_src), float32
        Writable and C-contiguous, finite.

    Raises
    ------
    InvalidInputError
        ``input`` is not a non-empty list of arrays / strings, mixes the two, or holds a
        boolean.
    DecodeError
        A string that is not base64, or whose bytes are not whole float32 values.
    ShapeMismatchError
        A vector (named by index) whose dimension is not ``d_src``.
    NonFiniteError
        A vector with NaN or infinity.
    """
    if not isinstance(items, list):
        raise InvalidInputError(
            "input must be a list of vectors (float arrays or base64 strings)", param="input"
        )
    if not items:
        raise InvalidInputError("input is empty; send at least one vector", param="input")
    if isinstance(items[0], str):
        array = _decode_base64(items, d_src)
    else:
        array = _decode_floats(items, d_src)
        if check_bools:
            reject_bools(items)
    check_finite(array, what="input", param="input")
    return array


def check_finite(array: np.ndarray, *, what: str, param: str | None = None) -> None:
    """Raise :class:`NonFiniteError` naming the first row with NaN or infinity."""
    if np.isfinite(array).all():
        return
    row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
    column = int(np.flatnonzero(~np.isfinite(array[row]))[0])
    raise NonFiniteError(
        f"{what}[{row}] holds NaN, infinity or a value beyond float32's range (±3.4e38) in "
        f"column {column}; every value must be a finite float32",
        param=f"{param}[{row}]" if param else None,
    )


def reject_bools(items: list[Any]) -> None:
    """Raise :class:`InvalidInputError` naming the first row of float arrays with a boolean.

    JSON ``true`` / ``false`` parse to Python booleans, which NumPy turns into 1.0 / 0.0
    when they share a row with numbers. Costs about 10 ms for 1024 × 384 values.
    """
    for i, row in enumerate(items):
        if bool in map(type, row):
            value = next(v for v in row if type(v) is bool)
            raise InvalidInputError(
                f"input[{i}] contains {json_kind(value)}, not a number", param=f"input[{i}]"
            )


def _dimensions(n: int) -> str:
    return "1 dimension" if n == 1 else f"{n} dimensions"


def _decode_base64(items: list[Any], d_src: int) -> np.ndarray:
    n_bytes = 4 * d_src
    if n_bytes % 3 == 0:  # unpadded strings: decode the whole batch in one call
        n_chars = n_bytes // 3 * 4
        if all(type(item) is str and len(item) == n_chars for item in items):
            try:
                joined = pybase64.b64decode_as_bytearray("".join(items), validate=True)
            except (binascii.Error, ValueError):
                pass  # find and name the bad string below
            else:
                if len(joined) == n_bytes * len(items):  # else padding inside: check each
                    return float32_rows(joined, len(items), d_src)
    chunks: list[bytes] = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidInputError(
                f"input[{i}] is not a string: input must be all float arrays or all base64 strings",
                param=f"input[{i}]",
            )
        try:
            raw = pybase64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            raise DecodeError(f"input[{i}] is not valid base64", param=f"input[{i}]") from None
        if len(raw) != n_bytes:
            if len(raw) % 4:
                raise DecodeError(
                    f"input[{i}] decodes to {len(raw)} bytes, not a whole number of float32 "
                    f"values (4 bytes each; expected {n_bytes} bytes = {d_src} × 4)",
                    param=f"input[{i}]",
                )
            doubled = " (float64 values? send float32)" if len(raw) == 2 * n_bytes else ""
            raise ShapeMismatchError(
                f"input[{i}] has {_dimensions(len(raw) // 4)} ({len(raw)} bytes), but the stitch "
                f"expects {d_src} ({n_bytes} bytes of little-endian float32){doubled}",
                expected=d_src,
                got=len(raw) // 4,
                param=f"input[{i}]",
            )
        chunks.append(raw)
    return float32_rows(bytearray(b"".join(chunks)), len(items), d_src)


def float32_rows(data: bytearray, n: int, d: int) -> np.ndarray:
    """``n * d`` little-endian float32 values of ``data`` as a writable ``(n, d)`` float32
    array sharing its memory (no copy on little-endian machines)."""
    return np.frombuffer(data, dtype=_LE_F32).reshape(n, d).astype(np.float32, copy=False)


def check_vector_count(n: int, max_vectors: int) -> None:
    """Raise :class:`LimitExceededError` when a request holds more than ``max_vectors``."""
    if n > max_vectors:
        raise LimitExceededError(
            f"too many vectors: {n} in one request; the limit is {max_vectors}",
            limit=max_vectors,
            got=n,
            param="input",
        )


def _decode_floats(items: list[Any], d_src: int) -> np.ndarray:
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            array = np.asarray(items)
    except (ValueError, TypeError):
        array = _diagnose_floats(items, d_src)
    else:
        if array.ndim != 2 or array.dtype.kind not in "fiu":
            array = _diagnose_floats(items, d_src)
    if array.shape[1] != d_src:
        raise ShapeMismatchError(
            f"input[0] has {_dimensions(array.shape[1])}, but the stitch expects {d_src}",
            expected=d_src,
            got=int(array.shape[1]),
            param="input[0]",
        )
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(array, dtype=np.float32)


def _diagnose_floats(items: list[Any], d_src: int) -> np.ndarray:
    """Find and raise the first problem of a batch that NumPy could not read as a matrix."""
    lengths: set[int] = set()
    for i, row in enumerate(items):
        if not isinstance(row, list):
            flat = all(isinstance(v, Real) and not isinstance(v, bool) for v in items)
            hint = (
                " (input is one flat array of numbers: a single vector goes inside a list of "
                'its own, "input": [[...]])'
                if flat
                else ""
            )
            raise InvalidInputError(
                f"input[{i}] is not an array of numbers: input must be all float arrays or all "
                f"base64 strings{hint}",
                param=f"input[{i}]",
            )
        # what a row holds before how long it is: a row of strings is not a vector of the
        # wrong length (its length is fixed once they are numbers)
        for value in row:
            if isinstance(value, bool) or not isinstance(value, Real):
                raise InvalidInputError(
                    f"input[{i}] contains {json_kind(value)}, not a number",
                    param=f"input[{i}]",
                )
        lengths.add(len(row))
        if len(row) != d_src:
            ragged = " (ragged batch: vectors of different lengths)" if len(lengths) > 1 else ""
            raise ShapeMismatchError(
                f"input[{i}] has {_dimensions(len(row))}, but the stitch expects {d_src}{ragged}",
                expected=d_src,
                got=len(row),
                param=f"input[{i}]",
            )
    # Every row is a list of d_src numbers, yet NumPy made an object array: integers beyond
    # float64 (310-640 digits; longer ones are refused as they are parsed). Infinite, like
    # 1e400: the finiteness check names the row and column (422 non_finite_input).
    rows = [[_as_float(value) for value in row] for row in items]
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(rows, dtype=np.float64)


def json_kind(value: object) -> str:
    """How a JSON value that is not a number reads in an error: ``null``, ``true``, a string
    (quoted, cut to 40 characters), an array, an object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {value!r:.40}"
    return "an array" if isinstance(value, list) else "an object"


def _as_float(value: Any) -> float:
    """``value`` (a JSON number) as a float, an integer beyond float64's range as a signed
    infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def render_embeddings(
    array: np.ndarray, encoding_format: EncodingFormat, *, before: bytes = b"", after: bytes = b""
) -> bytes:
    """The response's ``data`` array as JSON bytes, one object per row of ``array``.

    Row ``i`` becomes ``{"object": "embedding", "index": i, "embedding": value}``: the
    row's numbers (``"float"``), or the base64 of its little-endian float32 bytes
    (``"base64"``), written straight into the JSON text (base64 needs no JSON escapes),
    without a Python object per vector; the whole text is assembled in one copy.

    Parameters
    ----------
    array : ndarray of shape (n, d_tgt), float32
    encoding_format : {"float", "base64"}
    before, after : bytes
        JSON text to put before and after the array (the rest of the response).

    Returns
    -------
    bytes
        ``before``, the UTF-8 JSON text of an array of ``n`` objects, ``after``.
    """
    if encoding_format == "float":
        items = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(array)]
        return b"".join((before, orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY), after))
    rows = _base64_rows(array)
    n = len(rows)
    parts: list[bytes | memoryview] = [b'"}'] * (3 * n + 4)  # before [ (opening row close)* ] after
    parts[:2], parts[-2:] = (before, b"["), (b"]", after)
    parts[2:-2:3] = _row_openings(1 << max(n - 1, 0).bit_length())[:n]
    parts[3:-2:3] = rows
    return b"".join(parts)


def render_scored(
    array: np.ndarray,
    confidence: np.ndarray,
    out_of_distribution: np.ndarray,
    encoding_format: EncodingFormat,
    *,
    before: bytes = b"",
    after: bytes = b"",
) -> bytes:
    """:func:`render_embeddings` with ``confidence`` and ``out_of_distribution`` in each row's
    object (``"return_confidence": true``).

    Parameters
    ----------
    array : ndarray of shape (n, d_tgt), float32
    confidence : ndarray of shape (n,), float32 in [0, 1]
    out_of_distribution : ndarray of shape (n,), bool
    encoding_format : {"float", "base64"}
    before, after : bytes
    """
    vectors: Any = array if encoding_format == "float" else _base64_rows(array)
    items = [
        {
            "object": "embedding",
            "index": i,
            "embedding": vector if encoding_format == "float" else bytes(vector).decode(),
            "confidence": float(score),
            "out_of_distribution": bool(far),
        }
        for i, (vector, score, far) in enumerate(
            zip(vectors, confidence, out_of_distribution, strict=True)
        )
    ]
    return b"".join((before, orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY), after))


@functools.cache
def _row_openings(n: int) -> tuple[bytes, ...]:
    """``{"object":"embedding","index":i,"embedding":"`` for ``i < n``, a comma before all
    but the first (cached per power of two: 12 tables up to the default 2,048 vectors)."""
    return tuple(
        b'%s{"object":"embedding","index":%d,"embedding":"' % (b"," * (i > 0), i) for i in range(n)
    )


def _base64_rows(array: np.ndarray) -> list[bytes | memoryview]:
    """Base64 of each row's little-endian float32 bytes (ASCII bytes or views of them)."""
    data = np.ascontiguousarray(array, dtype=_LE_F32).data.cast("B")  # a view: no copy
    n, d = array.shape
    row_bytes = 4 * d
    if row_bytes % 3 == 0:  # base64 of the whole buffer splits exactly at row boundaries
        text = memoryview(pybase64.b64encode(data))
        step = row_bytes // 3 * 4
        return [text[i * step : (i + 1) * step] for i in range(n)]
    return [pybase64.b64encode(data[i * row_bytes : (i + 1) * row_bytes]) for i in range(n)]
