"""POST /v1/translate scales inputs to unit length for stitches fitted on unit-length vectors
(and says so), and refuses an all-zero vector by index; direct, chained and inverse routes.

Real vectors: the 80 everyday sentences with the bundled stitches (all fitted on unit-length
vectors of both models). Before this was fixed, the sentences ×10 translated with a mean
cosine to the real mpnet vectors of 0.515 instead of 0.673, and a zero vector was answered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.numpy import load_file
from service_helpers import b64, embeddings

from lead.artifacts import save_stitch
from lead.fitting import fit_stitch
from lead.stitches import StitchInfo
from tests.conftest import FIXTURES, REPO

MODELS = REPO / "models"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
E5 = "intfloat/multilingual-e5-small"


@pytest.fixture(scope="module")
def everyday() -> dict[str, np.ndarray]:
    """Unit-length float32 vectors of 80 sentences: minilm, e5, pml3 (80, 384), mpnet (80, 768)."""
    return load_file(FIXTURES / "everyday_sentences.safetensors")


@pytest.fixture(scope="module")
def raw_folder(scifact_small: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ridge stitch fitted on minilm vectors of lengths 0.5 to 2 (source not normalised)."""
    corpus = scifact_small.corpus
    lengths = np.linspace(0.5, 2, len(corpus["minilm"]), dtype=np.float32)[:, None]
    info = StitchInfo(source_model="raw-minilm", target_model=MPNET)
    stitch = fit_stitch(corpus["minilm"] * lengths, corpus["mpnet"], "ridge", info=info, alpha=0.01)
    assert stitch.info.source_normalized is False
    return save_stitch(stitch, tmp_path_factory.mktemp("raw") / "raw-minilm-to-mpnet")


@pytest.fixture
def bundled(make_client: Any, raw_folder: Path) -> TestClient:
    names = ("minilm-to-mpnet", "e5-to-minilm", "minilm-to-pml3-invertible")
    client: TestClient = make_client([str(MODELS / name) for name in names] + [str(raw_folder)])
    return client


def _translate(client: TestClient, x: np.ndarray, encoding: str, **fields: Any) -> Any:
    vectors = b64(x) if encoding == "base64" else x.tolist()
    return client.post("/v1/translate", json={"input": vectors, **fields})


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


ROUTES = {
    "direct": ("minilm", {"stitch": "minilm-to-mpnet"}),
    "chain": ("e5", {"source_model": E5, "target_model": MPNET}),
    "inverse": ("pml3", {"stitch": "minilm-to-pml3-invertible", "direction": "inverse"}),
}


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_scaled_inputs_answer_as_unit_ones(
    bundled: TestClient, everyday: dict[str, np.ndarray], route: str, encoding: str
) -> None:
    key, fields = ROUTES[route]
    x = everyday[key]
    unit = _translate(bundled, x, encoding, **fields)
    assert unit.status_code == 200, unit.text
    assert unit.json()["input_normalized"] is True and unit.json()["rescaled_inputs"] == 0
    scaled = _translate(bundled, x * 10, encoding, **fields)
    assert scaled.status_code == 200, scaled.text
    assert scaled.json()["input_normalized"] is True
    assert scaled.json()["rescaled_inputs"] == len(x)
    assert scaled.json()["stitch"] == unit.json()["stitch"]
    if route == "chain":
        assert scaled.json()["stitch"]["chain"] == ["e5-to-minilm", "minilm-to-mpnet"]
    got = embeddings(scaled.json())
    assert _cosines(got, embeddings(unit.json())).min() > 0.99999
    if route == "direct":  # the figure: 0.673, was 0.515 at ×10
        quality = _cosines(got, everyday["mpnet"]).mean()
        assert quality == pytest.approx(_cosines(embeddings(unit.json()), everyday["mpnet"]).mean())
        assert quality > 0.65


def test_only_the_rows_off_unit_length_are_counted(
    bundled: TestClient, everyday: dict[str, np.ndarray]
) -> None:
    x = everyday["minilm"][:6].copy()
    x[[1, 4]] *= np.float32(0.5)
    r = _translate(bundled, x, "float", stitch="minilm-to-mpnet")
    assert r.status_code == 200, r.text
    assert r.json()["rescaled_inputs"] == 2


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_zero_vector_is_a_422_naming_it(
    bundled: TestClient, everyday: dict[str, np.ndarray], route: str, encoding: str
) -> None:
    key, fields = ROUTES[route]
    x = everyday[key][:8].copy()
    x[3] = 0
    r = _translate(bundled, x, encoding, **fields)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("zero_vector", "input[3]")
    assert "input[3]" in error["message"] and error["request_id"]
    good = _translate(bundled, everyday[key][:8], encoding, **fields)
    assert good.status_code == 200, good.text


def test_a_stitch_fitted_on_raw_vectors_takes_them_as_they_are(
    bundled: TestClient, everyday: dict[str, np.ndarray], raw_folder: Path
) -> None:
    from lead.artifacts import load_stitch

    x = everyday["minilm"][:5] * 10
    x[2] = 0  # a point like any other for this stitch
    r = _translate(bundled, x, "float", stitch="raw-minilm-to-mpnet")
    assert r.status_code == 200, r.text
    assert r.json()["input_normalized"] is False and r.json()["rescaled_inputs"] == 0
    with torch.inference_mode():
        expected = load_stitch(raw_folder)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(embeddings(r.json()), expected, rtol=1e-5, atol=1e-6)
