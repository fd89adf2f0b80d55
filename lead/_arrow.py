"""Arrow IPC streams of vectors for :meth:`lead.client.LeadClient.translate`.

pyarrow is optional for ``lead``: it is imported when a stream is made or read, and its
absence is an :class:`ImportError` that says how to install it
(``pip install pyarrow``, or the ``arrow`` extra).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ARROW_STREAM", "VECTOR_COLUMN", "read_vectors", "vector_column", "vectors_stream"]

#: The media type of an Arrow IPC stream.
ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: The column that holds the vectors, both ways.
VECTOR_COLUMN = "embedding"


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ImportError(
            "format='arrow' needs pyarrow, which is not installed: pip install pyarrow "
            "(or the project's arrow extra), or use format='json'"
        ) from exc
    return pyarrow


def vector_column(rows: np.ndarray) -> Any:
    """``rows`` (n, d) as an Arrow ``fixed_size_list<float32>[d]`` array (float32, copied
    only when ``rows`` is not C-contiguous float32)."""
    pa = _pyarrow()
    values = pa.array(np.ascontiguousarray(rows, np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, rows.shape[1])


def vectors_stream(rows: np.ndarray) -> bytes:
    """An Arrow IPC stream of one batch: column ``embedding`` of ``rows``.

    Parameters
    ----------
    rows : ndarray of shape (n, d), float32
        C-contiguous.

    Returns
    -------
    bytes
        The stream; its column is ``fixed_size_list<float32>[d]``.
    """
    pa = _pyarrow()
    batch = pa.RecordBatch.from_arrays([vector_column(rows)], names=[VECTOR_COLUMN])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def read_vectors(content: bytes) -> np.ndarray:
    """The ``embedding`` column of an Arrow IPC stream as one array.

    Returns
    -------
    ndarray of shape (n, d), float32
        Writable, in the stream's row order (all batches).
    """
    return read_scored(content, scored=False)[0]


def read_scored(
    content: bytes, *, scored: bool = True
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The ``embedding`` column of an Arrow IPC stream and, with ``scored``, its
    ``confidence`` and ``out_of_distribution`` columns (``return_confidence=true``).

    Returns
    -------
    vectors : ndarray of shape (n, d), float32
    confidence : ndarray of shape (n,), float32, or None
    out_of_distribution : ndarray of shape (n,), bool, or None
    """
    pa = _pyarrow()
    table = pa.ipc.open_stream(content).read_all()
    column = table.column(VECTOR_COLUMN)
    d = column.type.list_size
    parts = [chunk.flatten().to_numpy().reshape(-1, d) for chunk in column.chunks]
    vectors = np.concatenate(parts) if parts else np.empty((0, d), np.float32)
    if not scored:
        return vectors, None, None
    confidence = table.column("confidence").to_numpy().astype(np.float32)
    ood = table.column("out_of_distribution").to_numpy(zero_copy_only=False).astype(bool)
    return vectors, confidence, ood
