"""A first pass over an Arrow IPC stream that decodes no values: the schema, the rows of
each batch, no compressed batch, nothing after the end.

Each batch's rows are counted from its metadata (the batch read against an empty schema,
which touches no buffer), so that too many rows are refused before any value is decoded.
A batch whose body compression (lz4, zstd) is set is refused: a few compressed bytes could
claim gigabytes (float32 embeddings hardly compress; ``Content-Encoding: gzip`` of the
whole body is bounded by the body limit). pyarrow does not expose the compression of a
message, so its flag is read from the message's flatbuffer (Arrow's ``Message.fbs``),
after pyarrow has read and verified the message.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from lead.errors import DecodeError, LimitExceededError

__all__ = ["MAX_MESSAGES", "MAX_METADATA_BYTES", "check_stream"]

_NO_FIELDS = pa.schema([])


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


#: The most record batches and dictionaries a stream may hold: each costs ~30 µs to read
#: whatever its rows (a stream of a million empty batches took 28 s; an adversarial pass).
MAX_MESSAGES = 4096
#: The most bytes of batch and dictionary metadata a stream may hold: reading a batch costs
#: in proportion to its columns (4,096 one-row batches of 3,000 null columns took 16-21 s;
#: an adversarial pass). A batch of a vector and an id column has ~200 bytes.
MAX_METADATA_BYTES = 8 * 1024 * 1024


def check_stream(body: pa.Buffer, max_vectors: int) -> pa.Schema:
    """Walk the stream's messages: the schema first, then batches, none compressed, at
    most ``max_vectors`` rows, :data:`MAX_MESSAGES` batches and dictionaries and
    :data:`MAX_METADATA_BYTES` of their metadata in all (and as much for the schema),
    nothing after the end-of-stream marker.

    Returns
    -------
    pyarrow.Schema
        The stream's schema.

    Raises
    ------
    DecodeError
        Not an Arrow IPC stream (an Arrow IPC file included), another message than
        batches after the schema, a compressed batch, bytes after the end.
    LimitExceededError
        More than ``max_vectors`` rows, :data:`MAX_MESSAGES` messages or
        :data:`MAX_METADATA_BYTES` of metadata.
    pyarrow.ArrowException
        A truncated or malformed message (the caller names it).
    """
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
    if message.metadata.size > MAX_METADATA_BYTES:  # read_schema builds every field
        raise LimitExceededError(
            f"the Arrow stream's schema exceeds {MAX_METADATA_BYTES} bytes (a translate "
            "stream needs a vector column and an optional id column)",
            limit=MAX_METADATA_BYTES,
            got=message.metadata.size,
            param="body",
        )
    schema = pa.ipc.read_schema(message)
    rows = metadata = 0
    for count, message in enumerate(reader, start=1):
        if message.type not in ("record batch", "dictionary"):
            raise DecodeError(f"unexpected {message.type} message in the stream", param="body")
        if count > MAX_MESSAGES:
            raise LimitExceededError(
                f"the Arrow stream holds more than {MAX_MESSAGES} batches and dictionaries; "
                "send fewer, larger batches",
                limit=MAX_MESSAGES,
                got=count,
                param="body",
            )
        metadata += message.metadata.size
        if metadata > MAX_METADATA_BYTES:
            raise LimitExceededError(
                f"the Arrow stream's batch metadata exceeds {MAX_METADATA_BYTES} bytes (many "
                "columns in many batches); send the vectors and ids only, in fewer batches",
                limit=MAX_METADATA_BYTES,
                got=metadata,
                param="body",
            )
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
