"""The compact base64 fast path of /v1/translate: the same answer as the full parse, or none."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson
import pytest
from service_helpers import b64

from lead.errors import LimitExceededError, NonFiniteError
from service.compact_base64 import decode_compact_base64, split_compact_base64
from service.encoding import decode_vectors

D = 384


def _vectors(n: int, d: int = D) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, d)).astype(np.float32)


def _fast(body: bytes, d: int = D, max_vectors: int = 2048) -> tuple[dict[str, Any], Any] | None:
    split = split_compact_base64(body)
    if split is None:
        return None
    x = decode_compact_base64(split, d, max_vectors)
    return None if x is None else (split.fields, x)


def _slow(body: bytes, d: int = D) -> tuple[dict[str, Any], np.ndarray]:
    payload = json.loads(body)
    return {**payload, "input": []}, decode_vectors(payload["input"], d)


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_compact_bodies_decode_like_the_full_parse(n: int) -> None:
    x = _vectors(n)
    for fields in (
        {"stitch": "a-to-b", "input": b64(x)},
        {"input": b64(x), "encoding_format": "base64", "normalize": True},
        {"source_model": "org/a", "target_model": "org/b", "input": b64(x), "strict": False},
    ):
        body = orjson.dumps(fields)
        got = _fast(body)
        assert got is not None, body[:80]
        expected_fields, expected = _slow(body)
        assert got[0] == expected_fields
        np.testing.assert_array_equal(got[1], x)
        np.testing.assert_array_equal(got[1], expected)
        assert got[1].dtype == np.float32 and got[1].flags.writeable and got[1].flags.c_contiguous


def test_whitespace_around_the_key_is_fine() -> None:
    x = _vectors(3)
    body = b'{"stitch" : "s" ,\n "input" :\t["' + b'","'.join(s.encode() for s in b64(x)) + b'"] }'
    got = _fast(body)
    assert got is not None and got[0] == {"stitch": "s", "input": []}
    np.testing.assert_array_equal(got[1], x)


def _bodies_that_need_the_full_parse() -> dict[str, bytes]:
    x = _vectors(3)
    items = b64(x)
    good = b'"' + b'","'.join(s.encode() for s in items) + b'"'
    padded = base64.b64encode(_vectors(1, 383).tobytes()).decode()
    return {
        "spaces between items": json.dumps({"stitch": "s", "input": items}).encode(),
        "padded items (d not a multiple of 3)": orjson.dumps({"input": [padded]}),
        "a backslash anywhere": orjson.dumps({"stitch": 'a"b', "input": items}),
        "input nested before the real one": b'{"x":{"input":[]},"input":[' + good + b"]}",
        "top-level input empty, nested array": b'{"input":[],"x":{"input":[' + good + b"]}}",
        "a nested input after the array": b'{"input":[' + good + b'],"x":{"input":1}}',
        "the key twice": b'{"input":[' + good + b'],"input":["AAAA"]}',
        "float arrays": orjson.dumps({"input": x.tolist()}),
        "empty input": b'{"input":[]}',
        "one item one character short": orjson.dumps({"input": [items[0], items[1][:-1]]}),
        "a character that is not base64": orjson.dumps({"input": [items[0], "*" + items[1][1:]]}),
        "a number among the strings": b'{"input":[' + good + b",1]}",
        "not an object": b"[" + good + b"]",
        "broken JSON after the array": b'{"input":[' + good + b"],}",
        "a trailing space before ]": b'{"input":[' + good + b" ]}",
        "padding at the end of the last item": orjson.dumps({"input": [items[0][:-4] + "AA=="]}),
        "one long item instead of many": b'{"input":["' + b"A" * (4 * 2051 - 3) + b'"]}',
        "an unterminated string": b'{"input":["' + b"A" * (3 * 2051 - 2) + b"]}",
        "a string that is not base64": b'{"stitch":"nope","input":["a"b"]}',
    }


@pytest.mark.parametrize("case", list(_bodies_that_need_the_full_parse()))
def test_anything_else_falls_back_to_the_full_parse(case: str) -> None:
    body = _bodies_that_need_the_full_parse()[case]
    assert _fast(body) is None, case


def test_the_fast_path_never_disagrees_with_the_full_parse() -> None:
    """Random corruptions of a compact body: the fast path answers as the full parse does,
    or not at all."""
    rng = np.random.default_rng(7)
    body = orjson.dumps({"stitch": "s", "input": b64(_vectors(4))})
    alphabet = b'"[],:{} \\Ainput0/+='
    answered = 0
    for _ in range(600):
        corrupt = bytearray(body)
        for _ in range(int(rng.integers(1, 3))):
            corrupt[int(rng.integers(0, len(corrupt)))] = alphabet[int(rng.integers(len(alphabet)))]
        try:
            got = _fast(bytes(corrupt))
        except NonFiniteError as exc:  # the same error as the full parse, for the same row
            with pytest.raises(NonFiniteError) as info:
                _slow(bytes(corrupt))
            assert info.value.param == exc.param
            continue
        if got is None:
            continue
        answered += 1
        expected_fields, expected = _slow(bytes(corrupt))
        assert got[0] == expected_fields
        np.testing.assert_array_equal(got[1], expected)
    assert answered > 50  # corruptions inside base64 still decode (to other numbers)


def test_limits_and_finiteness_are_checked() -> None:
    body = orjson.dumps({"input": b64(_vectors(5))})
    split = split_compact_base64(body)
    assert split is not None
    with pytest.raises(LimitExceededError, match="5 in one request; the limit is 4"):
        decode_compact_base64(split, D, max_vectors=4)
    x = _vectors(3)
    x[2, 10] = np.nan
    split = split_compact_base64(orjson.dumps({"input": b64(x)}))
    assert split is not None
    with pytest.raises(NonFiniteError, match=r"input\[2\]"):
        decode_compact_base64(split, D, max_vectors=10)
    assert decode_compact_base64(split, 387, max_vectors=10) is None  # another width
    assert decode_compact_base64(split, 383, max_vectors=10) is None


def test_one_long_item_is_not_counted_as_many() -> None:
    body = b'{"input":["' + b"A" * (4 * 2051 - 3 - 1) + b'"]}'  # width a multiple of 4
    split = split_compact_base64(body)
    assert split is not None and split.n == 1
    assert decode_compact_base64(split, D, max_vectors=4) is None  # the full parse names it


_CASES = {
    "padded last item": lambda v: {"stitch": "minilm-to-mpnet", "input": [v[0][:-4] + "AA=="]},
    "padded third item": lambda v: {
        "stitch": "minilm-to-mpnet",
        "input": [v[0], v[1], v[2][:-4] + "AAA="],
    },
    "unknown stitch, good array": lambda v: {"stitch": "nope", "input": v[:2]},
    "good": lambda v: {"stitch": "minilm-to-mpnet", "input": v[:3], "encoding_format": "base64"},
    "too many": lambda v: {"stitch": "minilm-to-mpnet", "input": v[:1] * 2049},
    "wrong dimension": lambda v: {"source_model": MPNET, "target_model": MINILM, "input": v[:2]},
}
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"


@pytest.mark.parametrize("case", list(_CASES))
def test_compact_and_pretty_bodies_get_the_same_answer(
    client: Any, queries: Any, case: str
) -> None:
    payload = _CASES[case](b64(queries["minilm"][:3]))
    answers = []
    for body in (orjson.dumps(payload), json.dumps(payload, indent=1).encode()):
        r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        assert r.status_code < 500, r.text
        answers.append((r.status_code, r.json().get("error", {}).get("code"), r.json().get("data")))
    assert answers[0] == answers[1]
    assert client.get("/readyz").status_code == 200
