"""Wire encodings: base64 ↔ float32 round trips on both code paths, and decode errors."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from service_helpers import b64

from lead.errors import DecodeError, InvalidInputError, NonFiniteError, ShapeMismatchError
from service.encoding import decode_vectors, render_embeddings


@pytest.mark.parametrize("d", [384, 383, 1])  # 4·d a multiple of 3 (one call) or not (per row)
def test_base64_round_trip(d: int) -> None:
    x = np.random.default_rng(d).standard_normal((7, d)).astype(np.float32)
    decoded = decode_vectors(b64(x), d)
    np.testing.assert_array_equal(decoded, x)
    assert decoded.dtype == np.float32 and decoded.flags.writeable and decoded.flags.c_contiguous
    encoded = [item["embedding"] for item in orjson.loads(render_embeddings(x, "base64"))]
    assert encoded == b64(x)
    np.testing.assert_array_equal(decode_vectors(encoded, d), x)
    np.testing.assert_array_equal(decode_vectors(x.tolist(), d), x)
    floats = [item["embedding"] for item in orjson.loads(render_embeddings(x, "float"))]
    np.testing.assert_array_equal(np.asarray(floats, dtype=np.float32), x)


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize(("n", "d"), [(5, 384), (3, 383), (1, 1)])
def test_rendered_data_is_the_json_of_the_encoded_values(encoding: str, n: int, d: int) -> None:
    x = np.random.default_rng(n + d).standard_normal((n, d)).astype(np.float32)
    data = orjson.loads(render_embeddings(x, encoding))  # type: ignore[arg-type]
    assert [item["index"] for item in data] == list(range(n))
    assert {key for item in data for key in item} == {"object", "index", "embedding"}
    assert all(item["object"] == "embedding" for item in data)
    embeddings = [item["embedding"] for item in data]
    if encoding == "base64":
        assert embeddings == b64(x)
    else:
        np.testing.assert_array_equal(np.asarray(embeddings, dtype=np.float32), x)


@pytest.mark.parametrize("d", [384, 383])
def test_base64_errors_name_the_vector(d: int) -> None:
    good = b64(np.zeros((4, d), dtype=np.float32))
    bad = list(good)
    bad[2] = "*" + bad[2][1:]
    with pytest.raises(DecodeError, match=r"input\[2\] is not valid base64"):
        decode_vectors(bad, d)
    short = list(good)
    short[3] = base64.b64encode(b"\0" * (4 * d - 2)).decode()
    with pytest.raises(DecodeError, match=r"input\[3\] decodes to"):
        decode_vectors(short, d)
    wrong = [*good[:1], b64(np.zeros((1, d + 1)))[0]]
    with pytest.raises(ShapeMismatchError, match=rf"input\[1\] has {d + 1} dimensions") as info:
        decode_vectors(wrong, d)
    assert (info.value.expected, info.value.got) == (d, d + 1)
    nan = np.zeros((3, d), dtype=np.float32)
    nan[1, 0] = np.inf
    with pytest.raises(NonFiniteError, match=r"input\[1\]"):
        decode_vectors(b64(nan), d)
    with pytest.raises(InvalidInputError, match=r"input\[1\] is not a string"):
        decode_vectors([good[0], [0.0] * d], d)


def test_float_edge_cases() -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        decode_vectors([], 3)
    with pytest.raises(InvalidInputError, match="list of vectors"):
        decode_vectors({"a": 1}, 3)
    with pytest.raises(ShapeMismatchError, match=r"input\[0\] has 2 dimensions"):
        decode_vectors([[1.0, 2.0]], 3)
    # beyond float64: infinite, named like 1e400 (an adversarial pass found them apart)
    for huge in (10**400, -(10**400)):
        with pytest.raises(NonFiniteError, match=r"input\[1\] holds .* in column 2"):
            decode_vectors([[1.0, 2.0, 3.0], [1.0, 2.0, huge]], 3)
    with pytest.raises(NonFiniteError, match=r"input\[0\]"):
        decode_vectors([[1.0, 2.0, 10**60]], 3)  # fits a double, overflows float32
    np.testing.assert_array_equal(decode_vectors([[1, 2, 3]], 3), [[1.0, 2.0, 3.0]])
    # one vector sent flat: the answer says how to wrap it (a mixed list does not get that)
    with pytest.raises(InvalidInputError, match=r"input\[0\] .*single vector .*\[\[\.\.\.\]\]"):
        decode_vectors([0.1, 0.2, 0.3], 3)
    with pytest.raises(InvalidInputError, match=r"base64 strings$"):
        decode_vectors([0.1, [0.2]], 3)


def test_one_dimension_is_singular() -> None:
    with pytest.raises(ShapeMismatchError, match=r"input\[0\] has 1 dimension, but the stitch"):
        decode_vectors([[1e30]], 384)
