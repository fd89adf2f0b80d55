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

from lead.errors import LimitExceededError
from service.encoding import check_finite

__all__ = ["CompactBase64Body", "decode_compact_base64", "split_compact_base64"]

#: ``"input"`` followed by the opening of an array of strings (JSON whitespace allowed).
_INPUT_ARRAY = re.compile(rb'"input"\s*:\s*\["')
_KEY = b'"input"'
_QUOTE, _COMMA = ord('"'), ord(",")
_LE_F32 = np.dtype("<f4")


@dataclass(frozen=True)
class CompactBase64Body:
    """A request body split into its fields and the span of its base64 ``input`` array.

    Made by :func:`split_compact_base64` without parsing the (large) array: ``fields`` is
    the body parsed with ``"input": []``; ``start`` / ``end`` are the offsets of the first
    item's opening quote and of the array's closing ``]``.
    """

    body: bytes
    fields: dict[str, Any]
    start: int
    end: int


def split_compact_base64(body: bytes) -> CompactBase64Body | None:
    """Split a JSON body whose ``input`` is an array of strings, or None.

    None (the caller parses the whole body instead) unless the body has no backslash
    (so no string holds a quote), ``"input"`` occurs once outside the array, and the body
    with the array emptied parses to an object whose ``input`` is ``[]``: then the emptied
    array is the top-level ``input``, and the body is ``fields`` plus that array (if the
    array's contents are valid, which :func:`decode_compact_base64` checks).
    """
    if b"\\" in body:
        return None
    match = _INPUT_ARRAY.search(body)
    if match is None or body.find(_KEY, 0, match.start()) != -1:
        return None
    start = match.end() - 1
    end = body.find(b"]", start)  # base64 has no "]": a string holding one fails below
    if end < 0 or body.find(_KEY, end) != -1:
        return None
    try:
        fields = orjson.loads(body[:start] + body[end:])
    except orjson.JSONDecodeError:
        return None
    if type(fields) is not dict or fields.get("input") != []:
        return None
    return CompactBase64Body(body, fields, start, end)


def decode_compact_base64(
    split: CompactBase64Body, d_src: int, max_vectors: int
) -> np.ndarray | None:
    """The array of :func:`split_compact_base64`'s body as ``(n, d_src)`` float32, or None.

    Decodes without a Python string per vector: the array must be compact
    (``["…","…",…]``, no whitespace) with every item exactly the unpadded base64 of
    ``4 * d_src`` bytes (``d_src`` a multiple of 3). Anything else gives None, and the
    caller decodes the parsed items with :func:`decode_vectors`, which names the culprit.

    Raises
    ------
    LimitExceededError
        More than ``max_vectors`` items.
    NonFiniteError
        A vector with NaN or infinity.
    """
    n_bytes = 4 * d_src
    if n_bytes % 3:
        return None
    width = n_bytes // 3 * 4
    stride = width + 3  # "…",
    n, rest = divmod(split.end - split.start + 1, stride)
    if rest or n == 0:
        return None
    if n > max_vectors:
        raise LimitExceededError(
            f"too many vectors: {n} in one request; the limit is {max_vectors}",
            limit=max_vectors,
            got=n,
            param="input",
        )
    raw = np.frombuffer(split.body, dtype=np.uint8)
    items = np.lib.stride_tricks.as_strided(
        raw[split.start :], shape=(n, width + 2), strides=(stride, 1), writeable=False
    )
    commas = raw[split.start + width + 2 : split.end : stride]
    if not ((items[:, 0] == _QUOTE).all() and (items[:, -1] == _QUOTE).all()):
        return None
    if not (commas == _COMMA).all():
        return None
    try:
        decoded = pybase64.b64decode(np.ascontiguousarray(items[:, 1:-1]).data, validate=True)
    except (binascii.Error, ValueError):
        return None
    array = np.frombuffer(bytearray(decoded), dtype=_LE_F32).reshape(n, d_src)
    array = array.astype(np.float32, copy=False)
    check_finite(array, what="input", param="input")
    return array
