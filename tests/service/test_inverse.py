"""POST /v1/translate with ``"direction": "inverse"``: invertible stitches run backwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from service_helpers import b64, embeddings, unb64

from lead.artifacts import load_stitch, save_stitch
from lead.fitting import fit_stitch
from lead.stitches import StitchInfo


@pytest.fixture(scope="module")
def invertible_folder(scifact_small: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    models, corpus = scifact_small.models, scifact_small.corpus
    info = StitchInfo(source_model=models["minilm"], target_model=models["pml3"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stitch = fit_stitch(
            corpus["minilm"], corpus["pml3"], "invertible", info=info, max_epochs=2, hidden_dim=32
        )
    finally:
        torch.set_num_threads(threads)
    return save_stitch(stitch, tmp_path_factory.mktemp("inv") / "minilm-pml3-inv")


@pytest.fixture
def inv_client(make_client: Any, invertible_folder: Path) -> TestClient:
    client: TestClient = make_client(["minilm-to-mpnet", str(invertible_folder)])
    return client


def test_inverse_answers_in_the_source_space(
    inv_client: TestClient, invertible_folder: Path, queries: Any, scifact_small: Any
) -> None:
    stitch = load_stitch(invertible_folder)
    y = queries["pml3"][:9]
    r = inv_client.post(
        "/v1/translate",
        json={"stitch": "minilm-pml3-inv", "input": y.tolist(), "direction": "inverse"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == scifact_small.models["minilm"]
    assert body["stitch"] == {
        "id": "minilm-pml3-inv",
        "direction": "inverse",
        "chain": ["minilm-pml3-inv"],
        "models": [scifact_small.models["pml3"], scifact_small.models["minilm"]],
    }
    with torch.inference_mode():
        expected = stitch.inverse(torch.from_numpy(y)).numpy()
    got = embeddings(body)
    assert got.shape == (9, 384)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_round_trip_over_http_returns_the_input(inv_client: TestClient, queries: Any) -> None:
    x = queries["minilm"][:16]
    forward = inv_client.post(
        "/v1/translate",
        json={"stitch": "minilm-pml3-inv", "input": b64(x), "encoding_format": "base64"},
    )
    assert forward.status_code == 200, forward.text
    assert forward.json()["stitch"]["direction"] == "forward"
    y = unb64([d["embedding"] for d in forward.json()["data"]])
    back = inv_client.post(
        "/v1/translate",
        json={
            "stitch": "minilm-pml3-inv",
            "input": b64(y),
            "encoding_format": "base64",
            "direction": "inverse",
        },
    )
    assert back.status_code == 200, back.text
    x_back = unb64([d["embedding"] for d in back.json()["data"]])
    cosine = (x_back * x).sum(axis=1) / np.linalg.norm(x_back, axis=1) / np.linalg.norm(x, axis=1)
    assert cosine.min() >= 0.999


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        ({"stitch": "minilm-to-mpnet", "direction": "inverse"}, 422, "not_invertible", "affine"),
        (
            {"source_model": "a", "target_model": "b", "direction": "inverse"},
            422,
            "validation_error",
            "needs `stitch`",
        ),
        ({"stitch": "minilm-pml3-inv", "direction": "backwards"}, 422, "validation_error", ""),
        ({"stitch": "nope", "direction": "inverse"}, 404, "stitch_not_found", "nope"),
    ],
)
def test_bad_inverse_requests_are_4xx_and_harm_nothing(
    inv_client: TestClient,
    queries: Any,
    body: dict[str, Any],
    status: int,
    code: str,
    needle: str,
) -> None:
    x = queries["pml3"][:2].tolist()
    r = inv_client.post("/v1/translate", json={**body, "input": x})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and needle in error["message"]
    ok = inv_client.post(
        "/v1/translate", json={"stitch": "minilm-pml3-inv", "input": x, "direction": "inverse"}
    )
    assert ok.status_code == 200, ok.text


def test_inverse_checks_the_target_dimension(inv_client: TestClient, queries: Any) -> None:
    # an invertible 384 → 384 stitch run backwards takes 384-d vectors; 768 is refused
    r = inv_client.post(
        "/v1/translate",
        json={
            "stitch": "minilm-pml3-inv",
            "input": queries["mpnet"][:1].tolist(),
            "direction": "inverse",
        },
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "shape_mismatch"


def test_the_listing_says_which_stitches_run_backwards(inv_client: TestClient) -> None:
    listed = {s["id"]: s for s in inv_client.get("/v1/stitches").json()["data"]}
    assert listed["minilm-pml3-inv"]["invertible"] is True
    assert listed["minilm-pml3-inv"]["architecture"] == "invertible"
    assert listed["minilm-to-mpnet"]["invertible"] is False
