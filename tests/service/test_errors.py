"""Every bad request gets a clear 4xx in the error envelope, and the server stays healthy."""

from __future__ import annotations

import base64
import errno
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from service_helpers import b64, embeddings

STITCH = "minilm-to-mpnet"


def _json(body: bytes | str) -> dict[str, Any]:
    content = body.encode() if isinstance(body, str) else body
    return {"content": content, "headers": {"content-type": "application/json"}}


def _vectors(n: int = 2, d: int = 384) -> list[list[float]]:
    rng = np.random.default_rng(n * 1000 + d)
    return rng.standard_normal((n, d)).astype(np.float32).tolist()


def _raw_with(token: str) -> dict[str, Any]:
    """A body whose input[1][5] is the JSON text ``token`` (NaN, Infinity, 1e999...)."""
    rows = [",".join(["0.01"] * 384)] * 3
    values = ["0.01"] * 384
    values[5] = token
    rows[1] = ",".join(values)
    vectors = ",".join(f"[{r}]" for r in rows)
    body = f'{{"stitch": "{STITCH}", "input": [{vectors}]}}'
    return _json(body)


def _b64_nan() -> list[str]:
    x = np.full((2, 384), 0.01, dtype="<f4")
    x[1, 7] = np.nan
    return b64(x)


# (case id, request kwargs, status, code, words the message must contain)
CASES: list[tuple[str, dict[str, Any], int, str, list[str]]] = [
    ("empty input", {"json": {"stitch": STITCH, "input": []}}, 400, "invalid_input", ["empty"]),
    (
        "ragged batch",
        {"json": {"stitch": STITCH, "input": [[0.1] * 384, [0.1] * 383, [0.1] * 384]}},
        422,
        "shape_mismatch",
        ["input[1]", "383", "384", "ragged"],
    ),
    (
        "wrong dimension",
        {"json": {"stitch": STITCH, "input": _vectors(3, 768)}},
        422,
        "shape_mismatch",
        ["input[0]", "768", "384"],
    ),
    ("NaN token", _raw_with("NaN"), 422, "non_finite_input", ["input[1]", "NaN"]),
    ("Infinity token", _raw_with("-Infinity"), 422, "non_finite_input", ["input[1]"]),
    ("1e999 overflow", _raw_with("1e999"), 422, "non_finite_input", ["input[1]"]),
    (
        "float32 overflow",
        _raw_with("1e300"),
        422,
        "non_finite_input",
        ["input[1]", "beyond float32's range", "column 5"],
    ),
    (
        "NaN in base64",
        {"json": {"stitch": STITCH, "input": _b64_nan()}},
        422,
        "non_finite_input",
        ["input[1]"],
    ),
    (
        "bad base64",
        {"json": {"stitch": STITCH, "input": [b64(np.zeros((1, 384)))[0], "not base64!!"]}},
        400,
        "decode_error",
        ["input[1]", "base64"],
    ),
    (
        "base64 byte length not float32",
        {"json": {"stitch": STITCH, "input": [base64.b64encode(b"\0" * 1537).decode()]}},
        400,
        "decode_error",
        ["input[0]", "1537 bytes", "1536"],
    ),
    (
        "base64 of the wrong dimension",
        {"json": {"stitch": STITCH, "input": b64(np.zeros((2, 768)))}},
        422,
        "shape_mismatch",
        ["input[0]", "768", "384"],
    ),
    (
        "unknown stitch",
        {"json": {"stitch": "no-such-stitch", "input": _vectors()}},
        404,
        "stitch_not_found",
        ["no-such-stitch"],
    ),
    (
        "unknown model",
        {
            "json": {
                "source_model": "acme/unknown",
                "target_model": "sentence-transformers/all-mpnet-base-v2",
                "input": _vectors(),
            }
        },
        404,
        "stitch_not_found",
        ["acme/unknown"],
    ),
    (
        "same source and target",
        {"json": {"source_model": "a/b", "target_model": "a/b", "input": _vectors()}},
        422,  # as for jobs (was 400, which a schema-valid body should not get)
        "validation_error",
        ["must differ"],
    ),
    (
        "wrong content type",
        {"content": b"{}", "headers": {"content-type": "text/plain"}},
        415,
        "unsupported_media_type",
        ["application/json"],
    ),
    ("no content type", {"content": b"{}"}, 415, "unsupported_media_type", ["got no Content-Type"]),
    ("invalid JSON", _json('{"stitch": "x", "input": [[1,2'), 400, "invalid_json", ["JSON"]),
    ("body not an object", _json("[1, 2]"), 400, "invalid_input", ["object"]),
    ("missing input", {"json": {"stitch": STITCH}}, 422, "validation_error", ["input"]),
    # a mistyped option names the right one, as a mistyped query parameter does
    (
        "mistyped option",
        {"json": {"stitch": STITCH, "normalise": True, "input": _vectors()}},
        422,
        "validation_error",
        ["normalise", "did you mean 'normalize'?"],
    ),
    (
        "input mistyped",
        {"json": {"stitch": STITCH, "inputs": _vectors()}},
        422,
        "validation_error",
        ["input", "'inputs': did you mean 'input'?"],
    ),
    (
        "bad encoding_format",
        {"json": {"stitch": STITCH, "input": _vectors(), "encoding_format": "hex"}},
        422,
        "validation_error",
        ["encoding_format"],
    ),
    (
        "stitch and models",
        {"json": {"stitch": STITCH, "source_model": "x", "target_model": "y", "input": _vectors()}},
        422,
        "validation_error",
        ["either"],
    ),
    (
        "unknown field",
        {"json": {"stitch": STITCH, "input": _vectors(), "dimensions": 3}},
        422,
        "validation_error",
        ["dimensions"],
    ),
    (
        "input not a list",
        {"json": {"stitch": STITCH, "input": "abc"}},
        400,
        "invalid_input",
        ["list"],
    ),
    (
        "mixed strings and arrays",
        {"json": {"stitch": STITCH, "input": [[0.1] * 384, "AAAA"]}},
        400,
        "invalid_input",
        ["input[1]"],
    ),
    (
        "string inside a vector",
        {"json": {"stitch": STITCH, "input": [[0.1] * 383 + ["0.1"]]}},
        400,
        "invalid_input",
        ["input[0]", "not a number"],
    ),
    (
        # what the row holds is named first: its length is fixed once they are numbers
        "a short vector of strings",
        {"json": {"stitch": STITCH, "input": [["a", "b"]]}},
        400,
        "invalid_input",
        ["input[0] contains the string 'a', not a number"],
    ),
    (
        "a short vector of strings after a good one",
        {"json": {"stitch": STITCH, "input": [[0.1] * 384, ["0.1"] * 3]}},
        400,
        "invalid_input",
        ["input[1] contains the string '0.1', not a number"],
    ),
    (
        "null inside a vector",
        {"json": {"stitch": STITCH, "input": [[0.1] * 383 + [None]]}},
        400,
        "invalid_input",
        ["input[0] contains null, not a number"],  # JSON's names, not NoneType
    ),
    (
        "booleans as a vector",
        {"json": {"stitch": STITCH, "input": [[True] * 384]}},
        400,
        "invalid_input",
        ["input[0]"],
    ),
    ("a boolean among floats", _raw_with("true"), 400, "invalid_input",
     ["input[1] contains true, not a number"]),
    (
        "false among floats, normalize true",
        {"json": {"stitch": STITCH, "input": [[0.01] * 384, [0.01] * 383 + [False]],
                  "normalize": True}},
        400,
        "invalid_input",
        ["input[1] contains false, not a number"],
    ),
    (
        "a boolean among floats, an escape in the stitch id",
        _json('{"stitch": "minilm-to-mpn\\u0065t", "input": [[' + "0.01," * 383 + "true]]}"),
        400,
        "invalid_input",
        ["input[0] contains true, not a number"],
    ),
    (
        "UTF-16 body",
        {"content": '{"stitch": "minilm-to-mpnet", "input": [[0.1]]}'.encode("utf-16"),
         "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["not UTF-8", "UTF-16", "send JSON in UTF-8"],
    ),
    (
        "UTF-16 body without a byte order mark",
        {"content": '{"stitch": "minilm-to-mpnet", "input": [[0.1]]}'.encode("utf-16-le"),
         "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["not UTF-8", "UTF-16"],
    ),
    (
        "empty body",
        {"content": b"", "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["the body is empty"],
    ),
    (
        "body of whitespace",
        {"content": b" \r\n", "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["only whitespace"],
    ),
    (
        "UTF-8 byte order mark",
        {"content": b"\xef\xbb\xbf" + b'{"stitch": "minilm-to-mpnet", "input": [[0.1]]}',
         "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["byte order mark"],
    ),
    (
        "a body cut short",
        {"content": b'{"stitch": "minilm-to-mpnet", "input": [[0.1, 0.2',
         "headers": {"content-type": "application/json"}},
        400,
        "invalid_json",
        ["the body ends (byte 49) before its JSON text is complete"],
    ),
    (
        "a megabyte stitch id",
        {"json": {"stitch": "s" * 1_000_000, "input": _vectors()}},
        404,
        "stitch_not_found",
        ["characters)"],
    ),
]  # fmt: skip


def _good(client: TestClient, queries: Any) -> None:
    r = client.post("/v1/translate", json={"stitch": STITCH, "input": b64(queries["minilm"][:2])})
    assert r.status_code == 200, r.text
    assert embeddings(r.json()).shape == (2, 768)


def _check_envelope(r: Any, status: int, code: str, words: list[str]) -> dict[str, Any]:
    assert r.status_code == status, r.text[:1000]
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"type", "code", "message", "param", "request_id"}
    assert error["code"] == code, error
    assert error["request_id"] == r.headers["x-request-id"]
    for word in words:
        assert word in error["message"], (word, error["message"])
    return dict(error)


@pytest.mark.parametrize(
    ("kwargs", "status", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_translate_request(
    client: TestClient,
    queries: Any,
    kwargs: dict[str, Any],
    status: int,
    code: str,
    words: list[str],
) -> None:
    r = client.post("/v1/translate", **kwargs)
    error = _check_envelope(r, status, code, words)
    assert len(error["message"]) < 1000
    _good(client, queries)


def test_booleans_in_strings_or_options_are_not_mistaken_for_input(
    client: TestClient, queries: Any
) -> None:
    """`true` in options or ids triggers only the exact scan, which finds nothing."""
    x = queries["minilm"][:3].tolist()
    r = client.post(
        "/v1/translate",
        json={"stitch": STITCH, "input": x, "normalize": True, "strict": False},
    )
    assert r.status_code == 200, r.text
    plain = client.post("/v1/translate", json={"stitch": STITCH, "input": x, "normalize": True})
    assert r.json()["data"] == plain.json()["data"]


def test_ragged_batch_names_the_row_and_both_dimensions(client: TestClient, queries: Any) -> None:
    rows = _vectors(5)
    rows[3] = rows[3][:100]
    r = client.post("/v1/translate", json={"stitch": STITCH, "input": rows})
    error = _check_envelope(r, 422, "shape_mismatch", ["input[3]", "100", "384"])
    assert error["param"] == "input[3]"
    _good(client, queries)


def test_too_many_vectors(make_client: Any, queries: Any) -> None:
    client = make_client(max_vectors=4)
    r = client.post("/v1/translate", json={"stitch": STITCH, "input": b64(queries["minilm"][:5])})
    _check_envelope(r, 422, "limit_exceeded", ["5", "4"])
    _good(client, queries)
    assert client.get("/v1/info").json()["limits"]["max_vectors_per_request"] == 4


def test_body_over_the_limit(make_client: Any, queries: Any) -> None:
    client = make_client(max_body_bytes=20_000)
    big = {"stitch": STITCH, "input": queries["minilm"][:10].tolist()}  # ~ 40 kB of JSON
    r = client.post("/v1/translate", json=big)  # declares its Content-Length
    _check_envelope(r, 413, "payload_too_large", ["20000"])
    _good(client, queries)

    import orjson

    payload = orjson.dumps(big)

    def chunks() -> Any:  # streamed without a Content-Length: counted as it arrives
        for start in range(0, len(payload), 4096):
            yield payload[start : start + 4096]

    r = client.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    _check_envelope(r, 413, "payload_too_large", ["20000"])
    _good(client, queries)
    assert client.get("/v1/info").json()["limits"]["max_body_bytes"] == 20_000


def test_non_finite_output_is_refused(
    make_client: Any, fitted: Any, queries: Any, tmp_path: Path
) -> None:
    from lead.artifacts import load_stitch, save_stitch

    # a stitch that takes its inputs as they are (one fitted on unit-length vectors would
    # scale the huge input below to unit length first)
    stitch = load_stitch(fitted.folder("minilm-to-mpnet-raw"))
    stitch.info.source_normalized = False
    client = make_client([str(save_stitch(stitch, tmp_path / "minilm-to-mpnet-raw"))])
    weight = stitch.weight.detach().numpy()
    row = int(np.abs(weight).sum(axis=1).argmax())
    assert np.abs(weight[row]).sum() > 1.5  # so the next input overflows float32 in row `row`
    x = np.full((3, 384), 0.01, dtype=np.float32)
    x[2] = 3.0e38 * np.sign(weight[row])  # finite input, overflowing output
    r = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet-raw", "input": b64(x)})
    _check_envelope(r, 422, "non_finite_output", ["input[2]"])
    r = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet-raw", "input": b64(queries["minilm"][:2])}
    )
    assert r.status_code == 200, r.text


def test_framework_errors_use_the_envelope(client: TestClient, queries: Any) -> None:
    r = client.get("/v1/translate")
    _check_envelope(r, 405, "method_not_allowed", ["GET"])
    assert r.headers["allow"] == "POST"
    # a path served by one route per method: Allow names them all (Starlette names only the
    # first route's), and a schema-driven client can rely on it
    r = client.request("OPTIONS", "/v1/datasets/ds_0123")
    _check_envelope(r, 405, "method_not_allowed", ["OPTIONS"])
    assert r.headers["allow"] == "DELETE, GET"
    r = client.get("/v2/nothing")
    _check_envelope(r, 404, "not_found", ["/v2/nothing"])
    # a trailing slash: 404 in the envelope, not a bare 307 to a Location built from the
    # request's Host header (an adversarial pass)
    for method, path in [("GET", "/v1/jobs/"), ("POST", "/v1/translate/")]:
        r = client.request(method, path, headers={"host": "evil.example"}, follow_redirects=False)
        _check_envelope(r, 404, "not_found", [f"without the trailing slash: '{path[:-1]}'"])
        assert "location" not in r.headers
    r = client.get("/v1/stitches/org/none@abc")
    _check_envelope(r, 404, "stitch_not_found", ["org/none@abc"])
    _good(client, queries)


def test_a_huge_unknown_field_name_is_not_echoed_whole(client: TestClient, queries: Any) -> None:
    """A 20 MB field name came back twice, in the message and the param (a 40 MB answer:
    an adversarial pass)."""
    name = "a" * 1_000_000
    for path, body in (
        ("/v1/translate", {"stitch": STITCH, "input": _vectors(), name: 1}),
        ("/v1/align", {name: 1}),
    ):
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text[:300]
        assert len(r.content) < 2_000
        assert name[:100] in r.json()["error"]["message"]
    assert r.json()["error"]["param"].endswith("…")
    _good(client, queries)


def test_unexpected_errors_do_not_leak(
    client: TestClient, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.routes.translate as translate_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail /etc/passwd")

    monkeypatch.setattr(translate_module, "render_embeddings", broken)
    r = client.post("/v1/translate", json={"stitch": STITCH, "input": b64(queries["minilm"][:1])})
    error = _check_envelope(r, 500, "internal_error", ["request id"])
    assert "secret" not in r.text and "passwd" not in r.text
    assert error["type"] == "server_error"
    monkeypatch.undo()
    _good(client, queries)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "path", ["/v1/datasets?limit=true&limit=true&limit=1", "/v1/jobs?limit=1&limit=2"]
)
def test_a_query_parameter_given_twice_is_a_422_naming_it(client: Any, path: str) -> None:
    """FastAPI keeps the last of a repeated query parameter and ignores the others; the
    contract test found ?limit=true&limit=true&limit=1 answered 200."""
    r = client.get(path)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "validation_error" and error["param"] == "limit", error
    assert "more than once" in error["message"]
    assert client.get("/v1/datasets?limit=1").status_code in (200, 404, 503)


def test_an_unexpected_error_is_answered_and_not_raised_again(
    client: TestClient, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starlette answers a 500 and raises the error again for the server, and uvicorn then
    closes the keep-alive connection: the client's next request failed with "connection
    reset". A client that re-raises what the app raises shows it."""
    import service.routes.translate as translate_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    raising = TestClient(client.app, raise_server_exceptions=True)
    monkeypatch.setattr(translate_module, "render_embeddings", broken)
    body = {"stitch": STITCH, "input": b64(queries["minilm"][:1])}
    r = raising.post("/v1/translate", json=body)  # a re-raised error would fail here
    _check_envelope(r, 500, "internal_error", ["request id"])
    monkeypatch.undo()
    _good(raising, queries)


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        sqlite3.OperationalError("database or disk is full"),
    ],
)
def test_a_full_disk_is_a_507(
    client: TestClient, queries: Any, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    import service.routes.translate as translate_module

    def full(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(translate_module, "render_embeddings", full)
    r = client.post("/v1/translate", json={"stitch": STITCH, "input": b64(queries["minilm"][:1])})
    envelope = _check_envelope(r, 507, "insufficient_storage", ["no room left", "retry"])
    assert envelope["type"] == "server_error"
    monkeypatch.undo()
    _good(client, queries)


@pytest.mark.parametrize(
    ("path", "param", "says"),
    [
        ("/v1/jobs?stauts=failed", "stauts", "(after, limit, status); did you mean 'status'?"),
        ("/v1/datasets?limt=5", "limt", "did you mean 'limit'?"),
        ("/v1/stitches?verbose=1", "verbose", "(no query parameters)"),
    ],
)
def test_a_query_parameter_the_route_does_not_take_is_a_422_naming_it(
    client: Any, path: str, param: str, says: str
) -> None:
    """FastAPI ignores unknown query parameters: a misspelt filter listed every job."""
    r = client.get(path)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert client.get(path.split("?")[0]).status_code == 200
    assert client.get("/healthz?probe=1").status_code == 200  # outside /v1/: monitors add some


def test_arrow_options_misspelt_in_the_query_are_named(client: Any) -> None:
    r = client.post(
        "/v1/translate?stitch=s&normalise=true",
        content=b"not arrow",
        headers={"content-type": "application/vnd.apache.arrow.stream"},
    )
    assert r.status_code == 422, r.text
    assert "did you mean 'normalize'?" in r.json()["error"]["message"]
