"""Arrow IPC bodies of ``POST /v1/translate`` (``application/vnd.apache.arrow.stream``).

Request: an Arrow IPC stream. Its vector column is the column named ``embedding``; a
stream without one may hold exactly one fixed-size-list column, which is then the vector
column, whatever its name (``vector``, ``emb``). Its type must be
``fixed_size_list<float32>[d_src]`` (``pa.list_(pa.float32(), d_src)``), without nulls.
Every other column (ids of any type, keys, payload) is passed through untouched. The
options come from the query string (:func:`query_options`), checked by the JSON body's
model :class:`~service.schemas.TranslateOptions`; booleans are written ``true`` / ``false``.

Response: an Arrow IPC stream of the request's batches (the same row counts, row order
and other columns) whose vector column, under the same name and at the same position,
holds the translated vectors, ``fixed_size_list<float32>[d_tgt]``. The fields that a JSON
answer carries beside ``data`` (``model``, ``stitch``, ``input_normalized``,
``rescaled_inputs``, ``usage``) are the JSON text of the schema metadata key ``lead``
(:data:`METADATA_KEY`); the request's schema metadata is not echoed.

Decoding is zero-copy (the batches are views of the body) but for one copy of the vectors
into one writable ``(n, d_src)`` float32 array, which the stitch reads. The stream is
read twice: first message by message (:func:`service._arrow_stream.check_stream`: too
many rows and compressed batches are refused before any value is decoded), then with
pyarrow's stream reader, each batch validated in full.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from fastapi.exceptions import RequestValidationError

from lead.errors import DecodeError, InvalidInputError, ShapeMismatchError
from service._arrow_stream import check_stream
from service.encoding import check_finite
from service.schemas import TranslateOptions
from service.translate_body import check_options

__all__ = [
    "ARROW_STREAM",
    "METADATA_KEY",
    "QUERY_OPTIONS",
    "VECTOR_COLUMN",
    "ArrowInput",
    "query_options",
    "read_vectors",
    "refuse_json",
    "refuse_query_options",
    "write_vectors",
]

#: The media type of an Arrow IPC stream (request and response bodies).
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: The name that marks the vector column.
VECTOR_COLUMN = "embedding"
#: The response schema's metadata key whose value is the JSON text of the answer's fields.
METADATA_KEY = b"lead"
#: The options an Arrow request takes from its query string (a JSON body carries them).
QUERY_OPTIONS = (
    "stitch",
    "source_model",
    "target_model",
    "direction",
    "normalize",
    "strict",
    "return_confidence",
)

_BOOLEANS = {"true": True, "false": False}
_BOOLEAN_OPTIONS = ("normalize", "strict", "return_confidence")
#: The answer's columns with ``return_confidence=true`` (appended after the request's).
CONFIDENCE_COLUMNS = ("confidence", "out_of_distribution")


@dataclass(frozen=True)
class ArrowInput:
    """A decoded request: its batches, which column holds the vectors, the vectors."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    column: int
    vectors: np.ndarray  # (n, d_src) float32, writable, C-contiguous, finite


def _query_error(key: str, message: str, value: Any) -> RequestValidationError:
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", key), "msg": message, "input": value}]
    )


def query_options(params: Iterable[tuple[str, str]]) -> TranslateOptions:
    """The options of an Arrow request, from its query string.

    Parameters
    ----------
    params : iterable of (str, str)
        The query parameters in order, repeated keys included.

    Raises
    ------
    RequestValidationError
        A key given twice, ``encoding_format`` (the answer is an Arrow stream), or what
        :class:`~service.schemas.TranslateOptions` refuses (an unknown key, a missing
        stitch, a boolean other than ``true`` / ``false``), located in ``query``.
    """
    fields: dict[str, Any] = {}
    for key, value in params:
        if key in fields:
            raise _query_error(key, "given more than once; give each option once", value)
        if key in _BOOLEAN_OPTIONS:
            # any case: Python's requests sends params={"normalize": True} as "True"
            if value.lower() not in _BOOLEANS:
                raise _query_error(key, f"must be true or false, got {value!r}", value)
            fields[key] = _BOOLEANS[value.lower()]
        else:
            fields[key] = value
    if "encoding_format" in fields:
        raise _query_error(
            "encoding_format",
            "an Arrow body is answered with an Arrow stream of float32 vectors; "
            "encoding_format applies to JSON bodies only",
            fields["encoding_format"],
        )
    return check_options(fields, "query")


def refuse_json(body: bytes) -> None:
    """Refuse a JSON body sent as an Arrow stream (an Arrow IPC stream starts with its
    continuation marker, never ``{`` or ``[``), before its query string is read for the
    options that such a body carries itself.

    Raises
    ------
    DecodeError
        Telling the client to send it as ``application/json``.
    """
    if body.lstrip()[:1] in (b"{", b"["):
        raise DecodeError(
            f"the body is not a valid Arrow IPC stream; it looks like JSON: send JSON as "
            f"Content-Type: application/json, not {ARROW_STREAM}",
            param="body",
        )


def refuse_query_options(params: Iterable[tuple[str, str]]) -> None:
    """Refuse options in the query string of a JSON request (its body carries them), so
    that ``?normalize=true`` beside a JSON body is an error, not silently ignored.

    Raises
    ------
    RequestValidationError
        Naming the first such key.
    """
    for key, value in params:
        if key in QUERY_OPTIONS or key == "encoding_format":
            raise _query_error(
                key,
                f"query parameters set the options of Arrow bodies only (Content-Type: "
                f'{ARROW_STREAM}); a JSON body carries "{key}" itself',
                value,
            )


def _vector_column(schema: pa.Schema, d_src: int) -> int:
    """Index of the vector column (see the module docstring); its type is checked."""
    names = schema.names
    if VECTOR_COLUMN in names:
        if names.count(VECTOR_COLUMN) > 1:
            raise InvalidInputError(
                f"the stream has {names.count(VECTOR_COLUMN)} columns named {VECTOR_COLUMN!r}",
                param=VECTOR_COLUMN,
            )
        index = names.index(VECTOR_COLUMN)
    else:
        lists = [i for i, field in enumerate(schema) if pa.types.is_fixed_size_list(field.type)]
        if len(lists) != 1:
            raise InvalidInputError(
                f"no vector column: name it {VECTOR_COLUMN!r}, or send one fixed-size-list "
                f"column (the stream has {len(lists)} among its columns {names[:20]!r})",
                param="body",
            )
        index = lists[0]
    field = schema.field(index)
    kind = field.type
    if not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.float32():
        raise InvalidInputError(
            f"column {field.name!r} is {str(kind)[:100]}; vectors must be "
            f"fixed_size_list<float32>[{d_src}] (pyarrow: pa.list_(pa.float32(), {d_src}))",
            param=field.name,
        )
    if kind.list_size != d_src:
        raise ShapeMismatchError(
            f"column {field.name!r} holds vectors of {kind.list_size} dimensions, but the "
            f"stitch expects {d_src}",
            expected=d_src,
            got=kind.list_size,
            param=field.name,
        )
    return int(index)


def _first(mask: pa.Array) -> int:
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _rows(column: pa.FixedSizeListArray, d: int, start: int) -> np.ndarray:
    """The batch's vectors as a read-only ``(rows, d)`` float32 view of the body."""
    if column.null_count:
        row = start + _first(column.is_null())
        raise InvalidInputError(f"input[{row}] is null; send a vector", param=f"input[{row}]")
    values = column.flatten()
    if values.null_count:
        row = start + _first(values.is_null()) // d
        raise InvalidInputError(
            f"input[{row}] holds a null value; every value must be a float32",
            param=f"input[{row}]",
        )
    rows: np.ndarray = values.to_numpy(zero_copy_only=True).reshape(-1, d)
    return rows


def read_vectors(body: bytes, d_src: int, max_vectors: int) -> ArrowInput:
    """Decode an Arrow IPC request body (see the module docstring).

    Parameters
    ----------
    body : bytes
        The request body.
    d_src : int
        The dimension the (first) stitch expects.
    max_vectors : int
        The most rows the stream may hold.

    Returns
    -------
    ArrowInput
        With ``vectors`` of shape (n, d_src), float32, writable, C-contiguous, finite.

    Raises
    ------
    DecodeError
        Not an Arrow IPC stream, a truncated or malformed one, compressed batches, bytes
        after its end, a column name that is not UTF-8. (A JSON body is named as such by
        :func:`refuse_json`, which the route calls first, before the query string.)
    LimitExceededError
        More than ``max_vectors`` rows.
    InvalidInputError
        No vector column, one of another type, a null vector or value, no rows.
    ShapeMismatchError
        Vectors of another dimension than ``d_src``.
    NonFiniteError
        NaN or infinity (``input[i]``: row ``i`` of the stream, counting across batches).
    """
    buffer = pa.py_buffer(body)
    try:
        schema = check_stream(buffer, max_vectors)
        batches = list(pa.ipc.open_stream(buffer))
        for batch in batches:
            batch.validate(full=True)
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(
            f"the body is not a valid Arrow IPC stream: {exc}"[:500], param="body"
        ) from None
    try:
        schema.names  # noqa: B018 (pyarrow decodes them here)
    except UnicodeDecodeError:
        raise DecodeError("a column name of the stream is not UTF-8 text", param="body") from None
    column = _vector_column(schema, d_src)
    views, start = [], 0
    for batch in batches:
        views.append(_rows(batch.column(column), d_src, start))
        start += batch.num_rows
    if not start:
        raise InvalidInputError("input is empty; send at least one vector", param="input")
    vectors = np.concatenate(views)  # one copy: writable, for the stitch
    check_finite(vectors, what="input", param="input")
    return ArrowInput(schema, batches, column, vectors)


def write_vectors(
    request: ArrowInput,
    y: np.ndarray,
    fields: dict[str, Any],
    *,
    scores: Sequence[np.ndarray] | None = None,
) -> pa.Buffer:
    """The response stream: ``request``'s batches with ``y`` in the vector column.

    Parameters
    ----------
    request : ArrowInput
        The decoded request.
    y : ndarray of shape (n, d_tgt), float32
        The translated vectors, row ``i`` for row ``i`` of the request.
    fields : dict
        The answer's other fields, written as JSON under :data:`METADATA_KEY`.
    scores : (ndarray of shape (n,) float32, ndarray of shape (n,) bool), optional
        Each row's confidence and out-of-distribution flag, appended as the columns
        :data:`CONFIDENCE_COLUMNS` (``return_confidence=true``).

    Returns
    -------
    pyarrow.Buffer
        The Arrow IPC stream (the only copy of ``y`` made).

    Raises
    ------
    InvalidInputError
        If the request already has a column named as one of :data:`CONFIDENCE_COLUMNS`.
    """
    y = np.ascontiguousarray(y, dtype=np.float32)
    values = pa.Array.from_buffers(pa.float32(), y.size, [None, pa.py_buffer(y)])
    translated = pa.FixedSizeListArray.from_arrays(values, y.shape[1])
    name = request.schema.field(request.column).name
    schema = request.schema.set(request.column, pa.field(name, translated.type, nullable=False))
    extra: list[pa.Array] = []
    if scores is not None:
        taken = [c for c in CONFIDENCE_COLUMNS if c in schema.names]
        if taken:
            raise InvalidInputError(
                f"the request has a column named {taken[0]!r}, which the answer's "
                "confidence would overwrite; rename it",
                param="return_confidence",
            )
        extra = [pa.array(scores[0], pa.float32()), pa.array(scores[1], pa.bool_())]
        for column, array in zip(CONFIDENCE_COLUMNS, extra, strict=True):
            schema = schema.append(pa.field(column, array.type, nullable=False))
    schema = schema.with_metadata({METADATA_KEY: orjson.dumps(fields)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        start = 0
        for batch in request.batches:
            columns = list(batch.columns)
            columns[request.column] = translated.slice(start, batch.num_rows)
            columns += [array.slice(start, batch.num_rows) for array in extra]
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
            start += batch.num_rows
    return sink.getvalue()
