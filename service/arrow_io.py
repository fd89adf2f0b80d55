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
read twice. First message by message: each batch's rows are counted from its metadata
(the batch read against an empty schema, which touches no buffer), so that too many rows
are refused before any value is decoded, and a batch whose body compression (lz4, zstd)
is set is refused, because a few compressed bytes could claim gigabytes (float32
embeddings hardly compress; ``Content-Encoding: gzip`` of the whole body is bounded by the
body limit). Then with pyarrow's stream reader, each batch validated in full.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from lead.errors import DecodeError, InvalidInputError, LimitExceededError, ShapeMismatchError
from service.encoding import check_finite
from service.schemas import TranslateOptions

__all__ = [
    "ARROW_STREAM",
    "METADATA_KEY",
    "QUERY_OPTIONS",
    "VECTOR_COLUMN",
    "ArrowInput",
    "query_options",
    "read_vectors",
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
QUERY_OPTIONS = ("stitch", "source_model", "target_model", "direction", "normalize", "strict")

_BOOLEANS = {"true": True, "false": False}
_NO_FIELDS = pa.schema([])


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
        fields[key] = _BOOLEANS.get(value, value) if key in ("normalize", "strict") else value
    if "encoding_format" in fields:
        raise _query_error(
            "encoding_format",
            "an Arrow body is answered with an Arrow stream of float32 vectors; "
            "encoding_format applies to JSON bodies only",
            fields["encoding_format"],
        )
    try:
        return TranslateOptions.model_validate(fields)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        raise RequestValidationError(
            [{**error, "loc": ("query", *error["loc"])} for error in errors]
        ) from None


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
                f"query parameters set the options of Arrow bodies only; a JSON body "
                f'carries "{key}" itself',
                value,
            )


def _slot(buf: bytes, table: int, slot: int) -> int:
    """Offset of field ``slot`` within the flatbuffer table at ``table`` (0: absent)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    at = 4 + 2 * slot
    if at >= struct.unpack_from("<H", buf, vtable)[0]:
        return 0
    return int(struct.unpack_from("<H", buf, vtable + at)[0])


def _subtable(buf: bytes, table: int, slot: int) -> int:
    at = _slot(buf, table, slot)
    if not at:
        raise DecodeError("an Arrow batch message without its header", param="body")
    field = table + at
    return field + int(struct.unpack_from("<I", buf, field)[0])


def _compressed(message: pa.ipc.Message) -> bool:
    """Whether a record or dictionary batch message sets its body compression.

    Arrow's ``Message.fbs``: the root ``Message`` holds its header table in slot 2 (after
    ``version`` and the union's type); a ``RecordBatch`` holds ``compression`` in slot 3,
    a ``DictionaryBatch`` its ``RecordBatch`` in slot 1. pyarrow has verified the
    flatbuffer when it read the message.
    """
    buf = message.metadata.to_pybytes()
    try:
        header = _subtable(buf, struct.unpack_from("<I", buf, 0)[0], 2)
        if message.type == "dictionary":
            header = _subtable(buf, header, 1)
        return _slot(buf, header, 3) != 0
    except struct.error:
        raise DecodeError("an Arrow batch message with malformed metadata", param="body") from None


def _count_rows(body: pa.Buffer, max_vectors: int) -> pa.Schema:
    """Walk the stream's messages: the schema first, then batches, none compressed, at
    most ``max_vectors`` rows in all, nothing after the end-of-stream marker."""
    if body.size >= 6 and body[:6].to_pybytes() == b"ARROW1":
        raise DecodeError(
            "the body is an Arrow IPC file (Feather), not a stream: write it with "
            "pyarrow.ipc.new_stream, not new_file",
            param="body",
        )
    source = pa.BufferReader(body)
    reader = pa.ipc.MessageReader.open_stream(source)
    try:
        message = reader.read_next_message() if body.size else None
    except StopIteration:  # an end-of-stream marker and nothing before it
        message = None
    if message is None or message.type != "schema":
        raise DecodeError(
            "the body is not an Arrow IPC stream (it must start with a schema message)",
            param="body",
        )
    schema = pa.ipc.read_schema(message)
    rows = 0
    for message in reader:
        if message.type not in ("record batch", "dictionary"):
            raise DecodeError(f"unexpected {message.type} message in the stream", param="body")
        if _compressed(message):
            raise DecodeError(
                "compressed Arrow IPC batches (lz4, zstd) are not accepted: send the "
                "stream uncompressed (float32 vectors hardly compress), or the whole body "
                "with Content-Encoding: gzip",
                param="body",
            )
        if message.type == "record batch":
            rows += pa.ipc.read_record_batch(message, _NO_FIELDS).num_rows
            if rows > max_vectors:
                raise LimitExceededError(
                    f"too many vectors: the Arrow stream holds {rows} rows or more; the "
                    f"limit is {max_vectors}",
                    limit=max_vectors,
                    got=rows,
                    param="input",
                )
    if source.tell() < body.size:
        raise DecodeError(
            f"{body.size - source.tell()} bytes follow the end of the Arrow stream", param="body"
        )
    return schema


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
        after its end.
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
        schema = _count_rows(buffer, max_vectors)
        batches = list(pa.ipc.open_stream(buffer))
        for batch in batches:
            batch.validate(full=True)
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(
            f"the body is not a valid Arrow IPC stream: {exc}"[:500], param="body"
        ) from None
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


def write_vectors(request: ArrowInput, y: np.ndarray, fields: dict[str, Any]) -> pa.Buffer:
    """The response stream: ``request``'s batches with ``y`` in the vector column.

    Parameters
    ----------
    request : ArrowInput
        The decoded request.
    y : ndarray of shape (n, d_tgt), float32
        The translated vectors, row ``i`` for row ``i`` of the request.
    fields : dict
        The answer's other fields, written as JSON under :data:`METADATA_KEY`.

    Returns
    -------
    pyarrow.Buffer
        The Arrow IPC stream (the only copy of ``y`` made).
    """
    y = np.ascontiguousarray(y, dtype=np.float32)
    values = pa.Array.from_buffers(pa.float32(), y.size, [None, pa.py_buffer(y)])
    translated = pa.FixedSizeListArray.from_arrays(values, y.shape[1])
    name = request.schema.field(request.column).name
    schema = request.schema.set(
        request.column, pa.field(name, translated.type, nullable=False)
    ).with_metadata({METADATA_KEY: orjson.dumps(fields)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        start = 0
        for batch in request.batches:
            columns = list(batch.columns)
            columns[request.column] = translated.slice(start, batch.num_rows)
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=schema))
            start += batch.num_rows
    return sink.getvalue()
