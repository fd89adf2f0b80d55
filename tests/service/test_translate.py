"""POST /v1/translate: happy paths, encodings, ordering, batching, concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from service_helpers import b64, embeddings, unb64

from service.app import create_app
from service.arrow_io import ARROW_STREAM
from service.settings import Settings

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def test_translate_by_id_matches_the_stitch(client: TestClient, fitted: Any, queries: Any) -> None:
    x = queries["minilm"][:8]
    r = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet", "input": x.tolist()})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    assert body["model"] == fitted.models["mpnet"]
    assert body["stitch"] == {
        "id": "minilm-to-mpnet",
        "direction": "forward",
        "chain": ["minilm-to-mpnet"],
        "models": [fitted.models["minilm"], fitted.models["mpnet"]],
    }
    assert body["usage"] == {"vectors": 8}
    assert [d["index"] for d in body["data"]] == list(range(8))
    assert all(d["object"] == "embedding" for d in body["data"])
    y = embeddings(body)
    assert y.shape == (8, 768)
    np.testing.assert_allclose(y, fitted.expected(["minilm-to-mpnet"], x), rtol=1e-5, atol=1e-6)
    # the bundled stitch normalises: unit rows, and close to the real mpnet vectors
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-5)
    cosine = (y * queries["mpnet"][:8]).sum(axis=1)
    assert cosine.mean() > 0.5
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"]


def test_translate_by_models(client: TestClient, fitted: Any, queries: Any) -> None:
    x = queries["minilm"][:3]
    r = client.post(
        "/v1/translate",
        json={
            "source_model": fitted.models["minilm"],
            "target_model": fitted.models["pml3"],
            "input": x.tolist(),
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["stitch"]["id"] == "minilm-to-pml3"
    np.testing.assert_allclose(
        embeddings(r.json()), fitted.expected(["minilm-to-pml3"], x), rtol=1e-5, atol=1e-6
    )


def test_base64_and_float_agree_both_ways(client: TestClient, queries: Any) -> None:
    x = queries["minilm"][:16]
    results = {}
    for in_format, payload in (("float", x.tolist()), ("base64", b64(x))):
        for out_format in ("float", "base64"):
            r = client.post(
                "/v1/translate",
                json={"stitch": "minilm-to-mpnet", "input": payload, "encoding_format": out_format},
            )
            assert r.status_code == 200, r.text
            data = [d["embedding"] for d in r.json()["data"]]
            if out_format == "base64":
                assert all(isinstance(s, str) for s in data)
                results[in_format, out_format] = unb64(data)
            else:
                results[in_format, out_format] = np.asarray(data, dtype=np.float32)
    reference = results["float", "float"]
    assert reference.shape == (16, 768)
    for key, value in results.items():
        np.testing.assert_array_equal(value, reference, err_msg=str(key))


def test_order_is_preserved_and_batch_equals_singles(client: TestClient, queries: Any) -> None:
    x = queries["minilm"][:12]
    order = np.random.default_rng(0).permutation(12)
    batch = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(x)})
    shuffled = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(x[order])}
    )
    assert batch.status_code == 200, batch.text
    assert shuffled.status_code == 200, shuffled.text
    y = embeddings(batch.json())
    np.testing.assert_allclose(embeddings(shuffled.json()), y[order], rtol=1e-5, atol=1e-6)
    singles = []
    for row in x:
        r = client.post(
            "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": [row.tolist()]}
        )
        assert r.status_code == 200, r.text
        singles.append(embeddings(r.json())[0])
    np.testing.assert_allclose(np.stack(singles), y, rtol=1e-5, atol=1e-6)


def test_normalize_option(make_client: Any, queries: Any) -> None:
    client = make_client(["minilm-to-mpnet-raw"])
    x = queries["minilm"][:4]
    norms = {}
    for normalize in (False, True):
        r = client.post(
            "/v1/translate",
            json={"stitch": "minilm-to-mpnet-raw", "input": x.tolist(), "normalize": normalize},
        )
        assert r.status_code == 200, r.text
        norms[normalize] = np.linalg.norm(embeddings(r.json()), axis=1)
    assert np.abs(norms[False] - 1.0).max() > 1e-3  # this stitch does not normalise
    np.testing.assert_allclose(norms[True], 1.0, atol=1e-5)


def test_full_batch_at_the_limit(make_client: Any, queries: Any) -> None:
    client = make_client(max_vectors=300)
    x = np.tile(queries["minilm"], (3, 1))  # 300 rows
    r = client.post(
        "/v1/translate",
        json={"stitch": "minilm-to-mpnet", "input": b64(x), "encoding_format": "base64"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["vectors"] == 300
    y = unb64([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(y[:100], y[100:200], rtol=1e-5, atol=1e-6)


def test_concurrent_requests(fitted: Any, queries: Any) -> None:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))], device="cpu", load_in_background=False
    )
    app = create_app(settings)
    x = queries["minilm"]

    async def main() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                requests = [
                    http.post(
                        "/v1/translate",
                        json={"stitch": "minilm-to-mpnet", "input": b64(x[i * 10 : i * 10 + 10])},
                    )
                    for i in range(10)
                ]
                return list(await asyncio.gather(*requests))

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200] * 10, [r.text for r in responses]
    got = np.concatenate([embeddings(r.json()) for r in responses])
    np.testing.assert_allclose(got, fitted.expected(["minilm-to-mpnet"], x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/x+json"])
def test_json_content_type_variants(client: TestClient, queries: Any, content_type: str) -> None:
    import orjson

    body = orjson.dumps({"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])})
    r = client.post("/v1/translate", content=body, headers={"content-type": content_type})
    assert r.status_code == 200, r.text


def test_ambiguous_content_types_and_empty_names_are_refused(
    client: TestClient, queries: Any
) -> None:
    """Found by an adversarial pass: two Content-Type headers were answered as the first
    one, a latin-1 charset was read as UTF-8, and ``?stitch=`` got 404 "no stitch ''"."""
    import orjson

    body = orjson.dumps({"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])})
    good = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    assert good.status_code == 200
    two = [("content-type", "application/json"), ("content-type", ARROW_STREAM)]
    r = client.post("/v1/translate", content=body, headers=two)
    assert r.status_code == 415 and "2 Content-Type headers" in r.json()["error"]["message"]
    for charset in ("latin-1", ""):
        headers = {"content-type": f"application/json; charset={charset}"}
        r = client.post("/v1/translate", content=body, headers=headers)
        assert r.status_code == 415, r.text
        assert f"charset '{charset}'" in r.json()["error"]["message"]
    quoted = {"content-type": 'application/json; charset="UTF-8"'}
    assert client.post("/v1/translate", content=body, headers=quoted).content == good.content
    for params in ("stitch=", "source_model=&target_model=x"):
        r = client.post(
            f"/v1/translate?{params}", content=b"", headers={"content-type": ARROW_STREAM}
        )
        assert r.status_code == 422 and "is empty" in r.text, r.text
    empty = orjson.dumps({"stitch": "", "input": b64(queries["minilm"][:1])})
    r = client.post("/v1/translate", content=empty, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "`stitch` is empty" in r.text
    assert client.post("/v1/translate", content=body, headers=quoted).content == good.content


def test_vectors_metric_counts(client: TestClient, queries: Any) -> None:
    r = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:5])}
    )
    assert r.status_code == 200, r.text
    text = client.get("/metrics").text
    assert 'lead_vectors_translated_total{stitch="minilm-to-mpnet"} 5.0' in text
    assert MINILM in client.get("/v1/stitches/minilm-to-mpnet").text


def test_reduced_precision_dtype(make_client: Any, fitted: Any, queries: Any) -> None:
    client = make_client(dtype="bfloat16")
    x = queries["minilm"][:8]
    r = client.post("/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(x)})
    assert r.status_code == 200, r.text
    assert client.get("/v1/info").json()["dtype"] == "bfloat16"
    y = embeddings(r.json())
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, fitted.expected(["minilm-to-mpnet"], x), atol=2e-2)


@pytest.mark.gpu
def test_translate_on_cuda(make_client: Any, fitted: Any, queries: Any) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    client = make_client(device="cuda")
    assert client.get("/v1/info").json()["device"].startswith("cuda")
    x = np.tile(queries["minilm"], (11, 1))[:1024]
    r = client.post(
        "/v1/translate",
        json={"stitch": "minilm-to-mpnet", "input": b64(x), "encoding_format": "base64"},
    )
    assert r.status_code == 200, r.text
    y = unb64([d["embedding"] for d in r.json()["data"]])
    np.testing.assert_allclose(y, fitted.expected(["minilm-to-mpnet"], x), atol=1e-4)


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_flags_are_json_booleans(client: TestClient, queries: Any, value: Any) -> None:
    for flag in ("normalize", "strict"):
        body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1]), flag: value}
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 422, r.text
        assert flag in r.text


def test_translate_is_served_without_fastapi_dependencies_it_would_skip(
    client: TestClient,
) -> None:
    """``POST /v1/translate`` is answered by a plain Starlette route ahead of FastAPI's
    (``service.routes.translate.fast_route``), so FastAPI's dependencies never run for it:
    the documented route may have none of its own, and the app's may only be those whose
    checks the endpoint makes itself (a new one would be skipped silently). The router's
    API-key check is made before the body by ``service.auth.ApiKeyGate``."""
    from fastapi.routing import APIRoute
    from starlette.routing import Match

    from service.deps import refuse_repeated_query
    from service.routes import translate

    app: Any = client.app
    scope = {"type": "http", "method": "POST", "path": "/v1/translate", "root_path": ""}
    served = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
    assert not isinstance(served, APIRoute)
    (documented,) = [r for r in translate.router.routes if isinstance(r, APIRoute)]
    assert documented.path == "/v1/translate" and documented.endpoint is served.endpoint
    assert documented.dependencies == [] and documented.dependant.dependencies == []
    assert [d.dependency for d in app.router.dependencies] == [refuse_repeated_query]
    assert "/v1/translate" in app.openapi()["paths"]
