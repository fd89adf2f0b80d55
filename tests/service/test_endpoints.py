"""GET endpoints: /healthz, /v1/info, /v1/stitches, /v1/stitches/{id}, /metrics, request ids."""

from __future__ import annotations

import json
from typing import Any

import lead
from lead.scorecard import CORE_METRICS
from service.settings import DEFAULT_MODELS_DIR


def test_healthz(client: Any) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ok"}


def test_info(make_client: Any) -> None:
    client = make_client(
        max_vectors=100,
        max_body_bytes=1_000_000,
        max_vectors_arrow=5_000,
        max_body_bytes_arrow=9_000_000,
        max_translate_bytes_in_flight=3,
        max_concurrent_align=2,
        max_dataset_bytes=5_000_000,
        max_dataset_rows=9_000,
        max_inline_pairs=300,
        max_align_pairs=700,
        max_dimension=4_096,
        job_workers=2,
    )
    r = client.get("/v1/info")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "object": "info",
        "name": "lead",
        "version": lead.__version__,
        "device": "cpu",
        "dtype": "float32",
        "limits": {
            "max_vectors_per_request": 100,
            "max_body_bytes": 1_000_000,
            "max_vectors_arrow": 5_000,
            "max_body_bytes_arrow": 9_000_000,
            "max_translate_bytes_in_flight": 3,
            "max_concurrent_align": 2,
            "max_dataset_bytes": 5_000_000,
            "max_dataset_rows": 9_000,
            "max_inline_pairs": 300,
            "max_align_pairs": 700,
            "max_dimension": 4_096,
        },
        "jobs": {
            "enabled": True,
            "workers": 2,
            "engine": "process",
            "database": "sqlite",
            "shared_stitch_store": False,
        },
        "encodings": ["float", "base64"],
        "media_types": ["application/json", "application/vnd.apache.arrow.stream"],
        "auth": False,
        "stitches": 1,
    }


def test_list_and_get_stitches(client: Any, fitted: Any) -> None:
    r = client.get("/v1/stitches")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    assert [s["id"] for s in body["data"]] == ["minilm-to-mpnet", "minilm-to-pml3", "pml3-to-mpnet"]
    r = client.get("/v1/stitches/minilm-to-pml3")
    assert r.status_code == 200, r.text
    stitch = r.json()
    listed = body["data"][1]
    assert {k: v for k, v in stitch.items() if k not in ("fit", "scorecard")} == {
        k: v for k, v in listed.items() if k not in ("fit", "scorecard")
    }
    assert listed["fit"] == {k: stitch["fit"][k] for k in ("method", "pairs", "seed")}
    assert stitch["object"] == "stitch"
    assert stitch["source"]["model"] == fitted.models["minilm"]
    assert stitch["target"] == {
        "model": fitted.models["pml3"],
        "dim": 384,
        "normalized": True,
        "revision": None,
    }
    assert stitch["architecture"] == "affine"
    assert stitch["normalize_output"] is True
    assert stitch["origin"] == "local"
    assert (stitch["revision"], stitch["commit"]) == (None, None)
    assert stitch["fit"]["method"] == "ridge"
    assert stitch["fit"]["pairs"] == 400
    assert "scorecard" in stitch


def test_the_list_is_compact_and_one_stitch_is_whole(make_client: Any) -> None:
    """Bundled stitches record ~500 held-out ids each: only the single view carries them."""
    ids = ["minilm-to-mpnet", "minilm-to-pml3-invertible"]
    client = make_client([str(DEFAULT_MODELS_DIR / stitch_id) for stitch_id in ids])
    r = client.get("/v1/stitches")
    assert r.status_code == 200, r.text
    listed = {s["id"]: s for s in r.json()["data"]}
    assert len(r.content) < 1500 * len(ids), len(r.content)
    for stitch_id in ids:
        one = client.get(f"/v1/stitches/{stitch_id}")
        assert one.status_code == 200, one.text
        full, summary = one.json(), listed[stitch_id]
        assert len(full["fit"]["holdout"]["ids"]) == full["fit"]["holdout"]["test_pairs"] > 100
        assert "baselines" in full["scorecard"] and "data" in full["fit"]
        assert "holdout" not in summary["fit"] and "ids" not in json.dumps(summary)
        assert summary["fit"] == {k: full["fit"][k] for k in ("method", "pairs", "seed")}
        assert summary["scorecard"] == {k: full["scorecard"][k] for k in ("pairs", *CORE_METRICS)}
        assert {k: v for k, v in summary.items() if k not in ("fit", "scorecard")} == {
            k: v for k, v in full.items() if k not in ("fit", "scorecard")
        }


def test_request_id_is_honoured_when_sane(client: Any) -> None:
    r = client.get("/healthz", headers={"X-Request-ID": "trace-abc.123"})
    assert r.headers["x-request-id"] == "trace-abc.123"
    r = client.get("/nope", headers={"X-Request-ID": "trace-abc.123"})
    assert r.json()["error"]["request_id"] == "trace-abc.123"
    for insane in ("x" * 300, "has space", "semi;colon"):
        r = client.get("/healthz", headers={"X-Request-ID": insane})
        assert r.headers["x-request-id"] != insane
        assert len(r.headers["x-request-id"]) == 32
    ids = {client.get("/healthz").headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3


def test_metrics(client: Any) -> None:
    client.get("/healthz")
    client.get("/v1/stitches/minilm-to-mpnet")
    client.get("/v1/stitches/nope")
    client.get("/not/a/route")
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'lead_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in text
    route = "/v1/stitches/{stitch_id:path}"
    assert f'lead_http_requests_total{{method="GET",route="{route}",status="200"}} 1.0' in text
    assert f'lead_http_requests_total{{method="GET",route="{route}",status="404"}} 1.0' in text
    assert 'route="unmatched",status="404"' in text
    assert "lead_http_request_duration_seconds_bucket" in text
    assert 'lead_stitches{state="ready"} 3.0' in text


def test_metrics_are_per_app(make_client: Any) -> None:
    first, second = make_client(), make_client()
    for _ in range(3):
        first.get("/healthz")
    second.get("/healthz")
    line = 'lead_http_requests_total{method="GET",route="/healthz",status="200"}'
    assert f"{line} 3.0" in first.get("/metrics").text
    assert f"{line} 1.0" in second.get("/metrics").text


def test_info_says_when_jobs_are_off(make_client: Any) -> None:
    client = make_client(enable_jobs=False)
    r = client.get("/v1/info")
    assert r.status_code == 200, r.text
    assert r.json()["jobs"]["enabled"] is False
    assert client.post("/v1/align", json={"dataset": "ds_x"}).status_code == 503


def test_every_jobs_route_of_a_replica_without_jobs_is_a_documented_503(
    make_client: Any,
) -> None:
    """A translation-only replica answers 503 on every jobs, datasets and align route, and
    the schema lists 503 for each (a schema-driven client or fuzzer expects it)."""
    client = make_client(enable_jobs=False)
    schema = client.get("/openapi.json").json()
    calls = {
        ("post", "/v1/jobs"): {"json": {}},  # the feature before the body: not a 422
        ("get", "/v1/jobs"): {},
        ("get", "/v1/jobs/{job_id}"): {},
        ("post", "/v1/jobs/{job_id}/cancel"): {},
        ("post", "/v1/datasets"): {"content": b"x", "headers": {"content-type": "text/plain"}},
        ("get", "/v1/datasets"): {},
        ("get", "/v1/datasets/{dataset_id}"): {},
        ("delete", "/v1/datasets/{dataset_id}"): {},
        ("post", "/v1/align"): {"json": {}},
    }
    documented = {
        (method, path)
        for path, item in schema["paths"].items()
        for method in item
        if path.startswith(("/v1/jobs", "/v1/datasets", "/v1/align"))
    }
    assert documented == set(calls)
    for (method, path), kwargs in calls.items():
        url = path.replace("{job_id}", "job_x").replace("{dataset_id}", "ds_x")
        r = client.request(method.upper(), url, **kwargs)
        assert r.status_code == 503, (method, path, r.text)
        assert r.json()["error"]["code"] == "feature_disabled", (method, path)
        assert "LEAD_ENABLE_JOBS=false" in r.json()["error"]["message"]
        assert "retry-after" not in r.headers  # retrying will not help
        assert "503" in schema["paths"][path][method]["responses"], (method, path)


def test_every_get_route_answers_head_alike(make_client: Any) -> None:
    """RFC 9110 section 9.3.2: HEAD wherever GET, with GET's status and headers, no body
    (it was 405 on /metrics, /docs, /openapi.json and every /v1/ GET route)."""
    client = make_client(enable_jobs=True)
    paths = [
        path
        for path, item in client.app.openapi()["paths"].items()  # type: ignore[attr-defined]
        if "get" in item and "{" not in path
    ]
    paths += ["/docs", "/redoc", "/openapi.json", "/v1/stitches/minilm-to-mpnet"]
    paths += ["/v1/stitches/no-such-stitch", "/v1/jobs/no-such-job"]
    assert len(paths) >= 10
    for path in paths:
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code, path
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        if path != "/metrics":  # its counters move between the two requests
            assert head.headers["content-length"] == get.headers["content-length"], path
