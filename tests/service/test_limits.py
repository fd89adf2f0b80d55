"""Concurrency limit: one request over the limit gets 429 with Retry-After at once."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import sys
import threading
import time
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest
from service_helpers import b64, hold_one_request

from service.app import create_app
from service.routing import Route, Translation
from service.settings import Settings


def test_over_the_concurrency_limit_is_429(
    fitted: Any, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))],
        device="cpu",
        load_in_background=False,
        max_translate_bytes_in_flight=1,
        retry_after_seconds=2,
        micro_batching=False,  # every forward in a worker thread, where the test holds it
    )
    app = create_app(settings)
    release = threading.Event()
    original = Route.run

    def slow_run(
        self: Route, x: np.ndarray, *, normalize: bool = False, scored: bool = False
    ) -> Translation:
        assert release.wait(10), "the test never released the first request"
        return original(self, x, normalize=normalize, scored=scored)

    monkeypatch.setattr(Route, "run", slow_run)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:2])}

    async def health_while_held(http: httpx.AsyncClient) -> None:
        health = await http.get("/healthz")  # the event loop is not blocked
        assert health.status_code == 200

    first, second, third = hold_one_request(
        app,
        "/v1/translate",
        body,
        limiter=lambda: app.state.limiter,
        release=release,
        while_held=health_while_held,
    )
    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    assert second.headers["retry-after"] == "2"
    assert second.json()["error"]["code"] == "overloaded"
    # the limit it names is a share of the setting, which it names too
    assert "7/8 of LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT" in second.json()["error"]["message"]
    assert third.status_code == 200, third.text
    assert app.state.limiter.in_flight == 0


def _scope(path: str, content_type: bytes, content_length: int) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", content_type), (b"content-length", b"%d" % content_length)],
        "client": ("127.0.0.1", 5000),
        "server": ("lead", 80),
    }


async def _raw_request(
    app: Any, path: str, first_chunk: bytes, *, then: str, content_type: bytes = b"application/json"
) -> tuple[int, bytes]:
    """Send ``first_chunk`` of a body promising more, then stall (``then="stall"``) or
    disconnect (``then="disconnect"``); the app's status and body."""
    pending = [{"type": "http.request", "body": first_chunk, "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        if then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # a client that never sends the rest
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(path, content_type, 10 * len(first_chunk) + 100), receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _requests_total(app: Any, route: str, status: str) -> float:
    value = app.state.metrics.registry.get_sample_value(
        "lead_http_requests_total", {"route": route, "method": "POST", "status": status}
    )
    return float(value or 0.0)


def test_stalled_bodies_hold_no_slot_and_time_out_with_408(fitted: Any, queries: Any) -> None:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))],
        device="cpu",
        load_in_background=False,
        max_translate_bytes_in_flight=1,
        body_timeout_seconds=0.5,
    )
    app = create_app(settings)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:2])}
    partial = b'{"stitch": "minilm-to-mpnet", "input": [['

    async def main() -> tuple[list[tuple[int, bytes]], list[int]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                stalled = [
                    asyncio.create_task(_raw_request(app, "/v1/translate", partial, then="stall"))
                    for _ in range(3)
                ]
                upload = _raw_request(
                    app, "/v1/datasets", b"\0" * 10, then="stall",
                    content_type=b"application/octet-stream",
                )  # fmt: skip
                stalled.append(asyncio.create_task(upload))
                await asyncio.sleep(0.1)
                during = (await http.post("/v1/translate", json=body)).status_code
                results = [await task for task in stalled]
                after = (await http.post("/v1/translate", json=body)).status_code
                return results, [during, after]

    results, good = asyncio.run(main())
    assert good == [200, 200]  # the stalled clients never held the only slot
    for status, content in results:
        assert status == 408, content
        error = json.loads(content)["error"]
        assert (error["code"], error["param"]) == ("request_timeout", "body")
        assert "0.5 seconds" in error["message"]
    assert app.state.limiter.in_flight == 0
    assert _requests_total(app, "/v1/translate", "408") == 3
    assert _requests_total(app, "/v1/datasets", "408") == 1


def test_a_client_that_disconnects_is_no_server_error(
    fitted: Any, queries: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))], device="cpu", load_in_background=False
    )
    app = create_app(settings)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:2])}

    async def main() -> tuple[list[int], int]:
        async with app.router.lifespan_context(app):
            gone = [
                (await _raw_request(app, path, first, then="disconnect", content_type=ctype))[0]
                for path, first, ctype in (
                    ("/v1/translate", b'{"input": [[0.1,', b"application/json"),
                    ("/v1/jobs", b'{"source": [[0.1,', b"application/json"),
                    ("/v1/datasets", b"\0" * 10, b"application/octet-stream"),
                )
            ]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                return gone, (await http.post("/v1/translate", json=body)).status_code

    with caplog.at_level(logging.INFO):
        gone, good = asyncio.run(main())
    assert gone == [499, 499, 499]
    assert good == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    for route in ("/v1/translate", "/v1/jobs", "/v1/datasets"):
        assert _requests_total(app, route, "499") == 1, route
        assert _requests_total(app, route, "500") == 0, route


def test_413_on_content_length_is_counted_under_its_route(make_client: Any, queries: Any) -> None:
    client = make_client(max_body_bytes=1000)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:2])}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 413, r.text
    # the body is not read: closing the connection keeps its bytes from being taken for the
    # next request (an adversarial pass: a request pipelined behind it went unanswered)
    assert r.headers["connection"] == "close"
    metrics = client.get("/metrics").text
    assert 'method="POST",route="/v1/translate",status="413"' in metrics
    assert 'route="unmatched"' not in metrics
    assert client.get("/nope").status_code == 404
    assert 'route="unmatched",status="404"' in client.get("/metrics").text
    good = make_client()
    assert good.post("/v1/translate", json=body).status_code == 200


def _translate_body(queries: Any) -> bytes:
    import json

    return json.dumps(
        {"stitch": "minilm-to-mpnet", "input": queries["minilm"][:3].tolist()}
    ).encode()


def _halves(body: bytes) -> tuple[bytes, bytes]:
    return body[: len(body) // 2], body[len(body) // 2 :]


def test_gzip_and_deflate_bodies_are_decompressed(make_client: Any, queries: Any) -> None:
    import zlib

    client = make_client()
    plain = client.post(
        "/v1/translate",
        content=_translate_body(queries),
        headers={"content-type": "application/json"},
    )
    assert plain.status_code == 200, plain.text
    for coding, packed in (
        ("gzip", gzip.compress(_translate_body(queries))),
        ("deflate", zlib.compress(_translate_body(queries))),
        ("identity", _translate_body(queries)),
        # several gzip members, as RFC 1952 allows (e.g. files concatenated)
        ("gzip", b"".join(gzip.compress(part) for part in _halves(_translate_body(queries)))),
    ):
        r = client.post(
            "/v1/translate",
            content=packed,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert r.status_code == 200, (coding, r.text)
        assert r.json()["data"] == plain.json()["data"]
    # no body is no body in any coding: a probe that names one is served (it got 400)
    for method, path in (("GET", "/healthz"), ("GET", "/v1/stitches"), ("HEAD", "/v1/info")):
        r = client.request(method, path, headers={"content-encoding": "gzip"})
        assert r.status_code == 200, (path, r.text)
    json_gzip = {"content-type": "application/json", "content-encoding": "gzip"}
    empty = client.post("/v1/translate", headers=json_gzip)
    assert empty.status_code == 400 and "the body is empty" in empty.json()["error"]["message"]


def test_bad_or_unknown_encodings_are_4xx(make_client: Any, queries: Any) -> None:
    import zlib

    client = make_client(max_body_bytes=64 * 1024)
    cases = [
        ("br", _translate_body(queries), 415, "br"),
        ("gzip, br", gzip.compress(_translate_body(queries)), 415, "gzip, br"),
        ("gzéip".encode(), _translate_body(queries), 415, "Content-Encoding gz\\xc3\\xa9ip "),
        ("gzip", _translate_body(queries), 400, "not valid gzip"),
        ("gzip", gzip.compress(_translate_body(queries))[:-20], 400, "gzip"),
        # a small bomb: 10 MB of zeros that compress to ~10 kB, over the 64 kB limit
        ("gzip", gzip.compress(b"0" * 10_000_000), 413, "limit"),
        # bytes after the data are refused, not dropped
        ("gzip", gzip.compress(_translate_body(queries)) + b"trailing", 400, "gzip"),
        ("deflate", zlib.compress(_translate_body(queries)) + b"xx", 400, "follow the deflate"),
    ]
    for coding, body, status, needle in cases:
        r = client.post(
            "/v1/translate",
            content=body,
            headers={"content-type": "application/json", "content-encoding": coding},
        )
        assert r.status_code == status, (coding, r.text)
        assert needle in r.json()["error"]["message"]
        ok = client.post(
            "/v1/translate",
            content=_translate_body(queries),
            headers={"content-type": "application/json"},
        )
        assert ok.status_code == 200


@pytest.mark.parametrize("item", [b"[]", b'""', b"[0.5]"])
def test_millions_of_tiny_vectors_are_refused_before_parsing(make_client: Any, item: bytes) -> None:
    client = make_client()
    body = b'{"stitch":"minilm-to-mpnet","input":[' + b",".join([item] * 2_000_000) + b"]}"
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "limit_exceeded" and error["param"] == "input"
    assert "at least" in error["message"]
    assert client.get("/healthz").status_code == 200


def test_a_body_just_under_the_vector_limit_is_still_parsed_in_full(
    make_client: Any, queries: Any
) -> None:
    """Brackets in strings do not count against a request: the pre-check leaves room."""
    client = make_client(max_vectors=4)
    x = queries["minilm"][:4].tolist()
    r = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": x, "encoding_format": "float"}
    )
    assert r.status_code == 200, r.text
    r = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet", "input": x * 2})
    assert r.status_code == 422 and "too many vectors: 8" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "prefix", "item", "param"),
    [
        ("/v1/translate", b'{"stitch":"minilm-to-mpnet","input":[', b"{}", "input"),
        ("/v1/align", b'{"target":[[1.0]],"source":[', b"[]", "source"),
        ("/v1/align", b'{"target":[[1.0]],"source":[', b"{}", "source"),
        ("/v1/align", b'{"target":[[1.0]],"source":[', b'""', "source"),
        (
            "/v1/jobs",
            b'{"source_model":"a","target_model":"b","target":[[1.0]],"source":[',
            b"{}",
            "source",
        ),
    ],
    ids=["translate-objects", "align-arrays", "align-objects", "align-strings", "jobs-objects"],
)
def test_every_route_with_vectors_refuses_too_many_before_parsing(
    make_client: Any, path: str, prefix: bytes, item: bytes, param: str
) -> None:
    """Objects count as vectors (a parser builds one per item all the same), and align and
    jobs bodies are counted before FastAPI parses them, gzip or not."""
    client = make_client()
    limits = client.get("/v1/info").json()["limits"]
    body = prefix + b",".join([item] * 200_000) + b"]}"
    for headers, content in (
        ({"content-type": "application/json"}, body),
        ({"content-type": "application/json", "content-encoding": "gzip"}, gzip.compress(body)),
    ):
        r = client.post(path, content=content, headers=headers)
        assert r.status_code == 422, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == "limit_exceeded" and error["param"] == param, error
        most = {
            "/v1/translate": limits["max_vectors_per_request"],
            "/v1/align": 2 * limits["max_align_pairs"],
            "/v1/jobs": 2 * limits["max_inline_pairs"],
        }[path]
        assert f"the limit is {most} vectors" in error["message"]
    assert client.get("/healthz").status_code == 200


def test_vectors_of_the_wrong_type_stop_validation_at_the_first() -> None:
    """A million numbers where vectors belong give one error per union member, not one
    per item (each a dict: a million of them took seconds and gigabytes)."""
    from service.jobs.schemas import AlignRequest

    with pytest.raises(pydantic.ValidationError) as info:
        AlignRequest.model_validate({"source": [0] * 1_000_000, "target": [[1.0]]})
    assert len(info.value.errors()) <= 2
    assert info.value.errors()[0]["loc"][:3] == ("source", "list[list[float]]", 0)


def test_compressed_bodies_are_inflated_a_few_at_a_time(
    make_client: Any, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few KB of gzip may stand for the whole body limit: at most two bodies are inflated
    at once (memory does not grow with the number of such clients), the rest wait."""
    import service.limits as limits_module

    running, most = 0, 0
    lock = threading.Lock()
    original = limits_module._decompress

    def counting(*args: Any) -> bytes:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.05)
            return original(*args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(limits_module, "_decompress", counting)
    client = make_client()
    body = gzip.compress(_translate_body(queries))
    headers = {"content-type": "application/json", "content-encoding": "gzip"}

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
            answers = await asyncio.gather(
                *(http.post("/v1/translate", content=body, headers=headers) for _ in range(6))
            )
        return [r.status_code for r in answers]

    assert asyncio.run(main()) == [200] * 6
    assert most == 2


def test_a_gzip_body_of_many_members_is_refused_at_once(make_client: Any, queries: Any) -> None:
    """RFC 1952 allows several members; a body of 250,000 empty ones (5 MB) cost minutes of
    CPU (the rest of the body was copied per member). Now: at most 1,000 members, a 400."""
    from service.limits import MAX_GZIP_MEMBERS

    client = make_client()
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    few = gzip.compress(_translate_body(queries)) + gzip.compress(b"") * 10
    assert client.post("/v1/translate", content=few, headers=headers).status_code == 200
    many = gzip.compress(_translate_body(queries)) + gzip.compress(b"") * 250_000
    r = client.post("/v1/translate", content=many, headers=headers)
    assert r.status_code == 400, r.text
    assert f"more than {MAX_GZIP_MEMBERS} members" in r.json()["error"]["message"]
    assert client.post("/v1/translate", content=few, headers=headers).status_code == 200


def test_a_small_body_of_one_huge_vector_is_refused_before_it_is_decoded(
    make_client: Any, queries: Any
) -> None:
    """54 KB of gzip held one vector of 14 million numbers: decoding it held every other
    request for a second before its 422 (an adversarial pass). The numbers are counted
    first: more than max_vectors vectors of the largest served dimension can hold."""
    client = make_client()
    limits = client.get("/v1/info").json()["limits"]
    numbers = limits["max_vectors_per_request"] * 800  # 768 is the largest served dimension
    body = b'{"stitch":"minilm-to-mpnet","input":[[' + b",".join([b"0.1"] * numbers) + b"]]}"
    headers = {"content-type": "application/json"}
    for content, extra in ((body, {}), (gzip.compress(body), {"content-encoding": "gzip"})):
        start = time.perf_counter()
        r = client.post("/v1/translate", content=content, headers={**headers, **extra})
        took = time.perf_counter() - start
        assert r.status_code == 422, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == "limit_exceeded" and error["param"] == "input"
        assert "too many numbers" in error["message"] and "768" in error["message"]
        assert took < 5  # refused by a count, not after a decode of every number
    # the next request is served; a large legitimate float body still decodes
    x = queries["minilm"][:64].tolist()
    for n in (1, 64):
        r = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet", "input": x[:n]})
        assert r.status_code == 200, r.text[:300]
    wide = {"stitch": "minilm-to-mpnet", "input": [[0.1] * 769]}  # one number too many
    r = client.post("/v1/translate", json=wide)
    assert r.status_code == 422 and r.json()["error"]["code"] == "shape_mismatch"


_BASE64_WITH_NAN = b'{"stitch":"minilm-to-mpnet","input":[' + b",".join([b'"QNaNInfinity"'] * 3000)


@pytest.mark.parametrize(
    "body",
    [b"xx" + b'""' * 3000, b'"' * 5000, b"[" * 5000, b"[" * 5000 + b"NaN", _BASE64_WITH_NAN],
)
def test_a_body_that_is_not_json_is_invalid_json_before_any_count(
    make_client: Any, body: bytes
) -> None:
    """The counts of brackets and quotes ran before the body was known to be JSON: such a
    body got 422 limit_exceeded instead of 400 invalid_json (an adversarial pass)."""
    client = make_client(max_vectors=4)
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_json"


def test_a_body_with_nan_and_too_many_vectors_keeps_its_count_error(make_client: Any) -> None:
    """NaN is not JSON, but Python writes it and the plain parse reads it: such a body is
    refused for its count, not for its JSON."""
    client = make_client(max_vectors=4)
    body = b'{"stitch":"minilm-to-mpnet","input":[' + b",".join([b"[NaN]"] * 3000) + b"]}"
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "limit_exceeded", r.text[:200]


def test_integers_of_too_many_digits_are_refused_as_they_are_parsed(
    make_client: Any, queries: Any
) -> None:
    """A 56 MB body of 4,290-digit integers held the event loop for 1.3 s while the plain
    parse built them (an adversarial pass): the service converts at most 640 digits."""
    from service.app import MAX_INT_DIGITS

    client = make_client()
    assert sys.get_int_max_str_digits() == MAX_INT_DIGITS  # set at start-up
    row = b"[" + b",".join([b"1" * 700] * 384) + b"]"
    body = b'{"stitch":"minilm-to-mpnet","input":[' + b",".join([row] * 34) + b"]}"
    start = time.perf_counter()
    r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "invalid_input" and "more than 640 digits" in error["message"]
    assert time.perf_counter() - start < 5
    good = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
    assert client.post("/v1/translate", json=good).status_code == 200
