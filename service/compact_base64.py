"""The compact base64 fast path of ``POST /v1/translate``.

A large base64 request is almost all ``input``: a JSON array of equally long strings.
Parsing it makes a Python string per vector and joins them again before decoding; this
module finds the array's span in the raw body instead, parses only the rest, checks the
array's layout with NumPy (quotes and commas at fixed offsets) and decodes every vector in
one pybase64 call. It applies to bodies as compact JSON encoders write them (orjson,
httpx, ``JSON.stringify``): no whitespace inside the array, no padding in the items (the
dimension a multiple of 3). Anything else gives ``None``, and the route parses the whole
body, so every error is still found and named by the full parse.
"""

from __future__ import annotations

import binascii
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pybase64

from service.encoding import check_finite, check_vector_count, float32_rows

__all__ = ["CompactBase64Body", "decode_compact_base64", "split_compact_base64"]

#: ``"input"`` followed by the opening of an array of strings (JSON whitespace allowed).
_INPUT_ARRAY = re.compile(rb'"input"\s*:\s*\["')
_KEY = b'"input"'
_QUOTE, _COMMA = ord('"'), ord(",")


@dataclass(frozen=True)
class CompactBase64Body:
    """A request body whose ``input`` is a compact array of equally long base64 strings.

    ``fields`` is the body parsed with ``"input": []``; ``decoded`` the bytes of all
    ``n`` items, decoded in one call; ``width`` the length of each item in characters.
    """

    fields: dict[str, Any]
    decoded: bytes
    n: int
    width: int


def split_compact_base64(body: bytes) -> CompactBase64Body | None:
    """Split and decode a JSON body whose ``input`` is a compact array of base64 strings.

    Returns None (the caller parses the whole body instead) unless all of these hold:

    - no backslash in the body, so no string holds a quote;
    - ``"input"`` occurs once outside the array, and the body with the array emptied
      parses to an object whose ``input`` is ``[]``: so the array is the top-level
      ``input``;
    - the array is ``["…","…",…,"…"]`` with no whitespace, every item as long as the first
      (a multiple of 4 characters), and the items together are valid base64 without
      padding (:func:`pybase64.b64decode` with ``validate=True``).

    Then the body is valid JSON, equal to ``fields`` plus that array, so errors of the
    fields (and of the route they name) come in the order of the full parse.
    """
    if b"\\" in body:
        return None
    match = _INPUT_ARRAY.search(body)
    if match is None or body.find(_KEY, 0, match.start()) != -1:
        return None
    start = match.end() - 1  # the first item's opening quote
    end = body.find(b"]", start)  # base64 has no "]": a string holding one fails below
    if end < 0 or body.find(_KEY, end) != -1:
        return None
    width = body.find(b'"', start + 1) - start - 1
    stride = width + 3  # "…",
    n, rest = divmod(end - start + 1, stride)
    if width <= 0 or width % 4 or rest or n == 0:
        return None
    raw = np.frombuffer(body, dtype=np.uint8)
    items = np.lib.stride_tricks.as_strided(
        raw[start:], shape=(n, width + 2), strides=(stride, 1), writeable=False
    )
    commas = raw[start + width + 2 : end : stride]
    if not ((items[:, 0] == _QUOTE).all() and (items[:, -1] == _QUOTE).all()):
        return None
    if not (commas == _COMMA).all():
        return None
    try:
        decoded = pybase64.b64decode(np.ascontiguousarray(items[:, 1:-1]).data, validate=True)
        fields = orjson.loads(body[:start] + body[end:])
    except (binascii.Error, ValueError):  # orjson.JSONDecodeError is a ValueError
        return None
    if len(decoded) != n * width // 4 * 3:  # padding at the end of the last item
        return None
    if type(fields) is not dict or fields.get("input") != []:
        return None
    return CompactBase64Body(fields, decoded, n, width)


def decode_compact_base64(
    split: CompactBase64Body, d_src: int, max_vectors: int
) -> np.ndarray | None:
    """The vectors of a :class:`CompactBase64Body` as ``(n, d_src)`` float32, or None.

    None when an item is not exactly the unpadded base64 of ``4 * d_src`` bytes (the
    caller then decodes the parsed items with
    :func:`~service.encoding.decode_vectors`, which names the culprit).

    Returns
    -------
    ndarray of shape (n, d_src), float32, or None
        Writable and C-contiguous, finite.

    Raises
    ------
    LimitExceededError
        More than ``max_vectors`` items.
    NonFiniteError
        A vector with NaN or infinity (named by index).
    """
    check_vector_count(split.n, max_vectors)
    if 3 * split.width != 16 * d_src:  # width = 4 * d_src bytes / 3 * 4 characters
        return None
    array = float32_rows(bytearray(split.decoded), split.n, d_src)
    check_finite(array, what="input", param="input")
    return array
