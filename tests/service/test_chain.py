"""Translation through the shortest chain of stitches when no direct one exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_helpers import b64, embeddings


def _by_models(fitted: Any, x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "source_model": fitted.models["minilm"],
        "target_model": fitted.models["mpnet"],
        "input": b64(x),
        **extra,
    }


def test_chain_when_no_direct_stitch(make_client: Any, fitted: Any, queries: Any) -> None:
    client = make_client(["minilm-to-pml3", "pml3-to-mpnet"])
    x = queries["minilm"][:10]
    r = client.post("/v1/translate", json=_by_models(fitted, x))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stitch"] == {
        "id": None,
        "direction": "forward",
        "chain": ["minilm-to-pml3", "pml3-to-mpnet"],
        "models": [fitted.models["minilm"], fitted.models["pml3"], fitted.models["mpnet"]],
    }
    assert body["model"] == fitted.models["mpnet"]
    y = embeddings(body)
    np.testing.assert_allclose(
        y, fitted.expected(["minilm-to-pml3", "pml3-to-mpnet"], x), rtol=1e-5, atol=1e-6
    )
    # a chain through pml3 still lands near the real mpnet vectors
    assert float((y * queries["mpnet"][:10]).sum(axis=1).mean()) > 0.3
    text = client.get("/metrics").text
    assert 'lead_vectors_translated_total{stitch="minilm-to-pml3"} 10.0' in text
    assert 'lead_vectors_translated_total{stitch="pml3-to-mpnet"} 10.0' in text


def test_strict_refuses_chains(make_client: Any, fitted: Any, queries: Any) -> None:
    client = make_client(["minilm-to-pml3", "pml3-to-mpnet"])
    r = client.post("/v1/translate", json=_by_models(fitted, queries["minilm"][:2], strict=True))
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["code"] == "stitch_not_found"
    assert "strict" in error["message"] and "minilm-to-pml3 → pml3-to-mpnet" in error["message"]
    r = client.post("/v1/translate", json=_by_models(fitted, queries["minilm"][:2]))
    assert r.status_code == 200, r.text


def test_direct_stitch_beats_a_chain(client: Any, fitted: Any, queries: Any) -> None:
    x = queries["minilm"][:4]
    for strict in (False, True):
        r = client.post("/v1/translate", json=_by_models(fitted, x, strict=strict))
        assert r.status_code == 200, r.text
        assert r.json()["stitch"]["chain"] == ["minilm-to-mpnet"]
        assert r.json()["stitch"]["id"] == "minilm-to-mpnet"


def test_no_route_backwards(make_client: Any, fitted: Any, queries: Any) -> None:
    client = make_client(["minilm-to-pml3", "pml3-to-mpnet"])
    r = client.post(
        "/v1/translate",
        json={
            "source_model": fitted.models["mpnet"],
            "target_model": fitted.models["minilm"],
            "input": b64(queries["mpnet"][:1]),
        },
    )
    assert r.status_code == 404, r.text
    assert "no stitch or chain" in r.json()["error"]["message"]


def test_configured_stitch_beats_a_job_stitch_for_the_same_models(
    make_client: Any, fitted: Any, queries: Any
) -> None:
    from lead.artifacts import load_stitch

    client = make_client(["minilm-to-mpnet"])
    registry = client.app.state.registry
    # a job-trained stitch for the same two models whose id sorts first
    registry.register("all-minilm-to-mpnet-job", load_stitch(fitted.folder("minilm-to-mpnet-raw")))
    r = client.post("/v1/translate", json=_by_models(fitted, queries["minilm"][:3]))
    assert r.status_code == 200, r.text
    assert r.json()["stitch"]["id"] == "minilm-to-mpnet"
    r = client.post(
        "/v1/translate",
        json={"stitch": "all-minilm-to-mpnet-job", "input": b64(queries["minilm"][:3])},
    )
    assert r.status_code == 200, r.text
    assert r.json()["stitch"]["id"] == "all-minilm-to-mpnet-job"


def test_models_route_to_the_best_held_out_stitch_then_the_newest(
    make_client: Any, fitted: Any, scifact_small: Any, tmp_path: Path
) -> None:
    """Two stitches join the same models: configured ones win over job-trained ones, then
    the better held-out R², then (job-trained) the newer one."""
    from lead.artifacts import load_stitch, save_stitch

    x = scifact_small.queries["minilm"][:3]
    for better, worse in (("b-good", "a-poor"), ("a-good", "b-poor")):
        for stitch_id, r2 in ((better, 0.4), (worse, 0.1)):
            stitch = load_stitch(fitted.folder("minilm-to-pml3"))
            stitch.info.scorecard = {"r2_score": r2}
            save_stitch(stitch, tmp_path / better / stitch_id)
        client = make_client([str(tmp_path / better / s) for s in (better, worse)])
        r = client.post("/v1/translate", json=_by_models_pml3(fitted, x))
        assert r.status_code == 200, r.text
        assert r.json()["stitch"]["id"] == better  # whatever the ids' order
    registry = client.app.state.registry
    newer = load_stitch(fitted.folder("minilm-to-pml3"))
    newer.info.scorecard = {"r2_score": 0.9}
    registry.register("job-one", newer, origin="job")
    registry.register("job-two", load_stitch(fitted.folder("minilm-to-pml3")), origin="job")
    r = client.post("/v1/translate", json=_by_models_pml3(fitted, x))
    assert r.json()["stitch"]["id"] == "a-good"  # configured before job-trained
    jobs_only = sorted(
        (e for e in registry.entries() if e.origin == "job"), key=lambda e: e.preference()
    )
    assert [e.id for e in jobs_only] == ["job-one", "job-two"]  # better R² first
    registry.register("job-three", newer, origin="job")
    jobs_only = sorted(
        (e for e in registry.entries() if e.origin == "job"), key=lambda e: e.preference()
    )
    assert [e.id for e in jobs_only][:2] == ["job-three", "job-one"]  # same R²: newest first


def _by_models_pml3(fitted: Any, x: Any) -> dict[str, Any]:
    return {
        "source_model": fitted.models["minilm"],
        "target_model": fitted.models["pml3"],
        "input": x.tolist(),
    }


def test_an_unknown_id_lists_a_bounded_number_of_served_ones() -> None:
    """Job-trained stitches accumulate: the 404 names 20 of them and counts the rest."""
    import torch

    from lead.errors import StitchNotFoundError
    from lead.stitches import AffineStitch
    from service.registry import StitchRegistry

    registry = StitchRegistry(torch.device("cpu"))
    for i in range(25):
        registry.register(f"job-{i:02d}", AffineStitch(4, 4), origin="job")
    with pytest.raises(StitchNotFoundError) as info:
        registry.get("missing")
    message = str(info.value)
    assert "job-00" in message and "job-19" in message and "job-20" not in message
    assert "and 5 more (GET /v1/stitches lists them)" in message


def test_a_jobs_direct_stitch_never_takes_over_a_configured_chain(
    make_client: Any, fitted: Any, queries: Any
) -> None:
    """Models served through a chain of configured stitches keep that chain when a job
    trains a direct stitch between them (an adversarial pass found requests silently moved
    to a worse job stitch); the job's stitch answers by its id, and with strict."""
    from lead.artifacts import load_stitch

    client = make_client(["minilm-to-pml3", "pml3-to-mpnet"])
    x = queries["minilm"][:3]
    chain = ["minilm-to-pml3", "pml3-to-mpnet"]
    before = client.post("/v1/translate", json=_by_models(fitted, x))
    assert before.json()["stitch"]["chain"] == chain
    registry = client.app.state.registry
    registry.register("job-direct", load_stitch(fitted.folder("minilm-to-mpnet")), origin="job")
    after = client.post("/v1/translate", json=_by_models(fitted, x))
    assert after.status_code == 200, after.text
    assert after.json()["stitch"]["chain"] == chain
    assert embeddings(after.json()).tobytes() == embeddings(before.json()).tobytes()
    strict = client.post("/v1/translate", json=_by_models(fitted, x, strict=True))
    assert strict.status_code == 200, strict.text
    assert strict.json()["stitch"]["id"] == "job-direct"
    by_id = client.post("/v1/translate", json={"stitch": "job-direct", "input": b64(x)})
    assert by_id.json()["stitch"]["id"] == "job-direct"
