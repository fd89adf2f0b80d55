"""POST /v1/translate with ``"return_confidence": true``: a confidence and an
out-of-distribution flag per vector, from the stitch's confidence head, over JSON and Arrow;
the vectors are the same bytes as without it, and a stitch without a head is a 422."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from fastapi.testclient import TestClient
from service_helpers import b64, unb64

from lead.artifacts import load_stitch, save_stitch
from lead.confidence import fit_confidence, translate_with_confidence
from lead.fitting import fit_stitch
from lead.splits import holdout_split
from lead.stitches import StitchInfo
from service.app import create_app
from service.settings import Settings

ARROW = "application/vnd.apache.arrow.stream"
SCORED = "minilm-to-mpnet-scored"


@pytest.fixture(scope="module")
def scored_folders(scifact_small: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ridge stitches with a confidence head fitted on held-out fixture rows:
    minilm → mpnet (``minilm-to-mpnet-scored``), minilm → pml3 and pml3 → mpnet (a chain)."""
    root = tmp_path_factory.mktemp("scored")
    corpus, models = scifact_small.corpus, scifact_small.models
    train, held = holdout_split(len(corpus["minilm"]), 0.3, 0)
    for src, tgt, name in (
        ("minilm", "mpnet", SCORED),
        ("minilm", "pml3", "minilm-to-pml3-scored"),
        ("pml3", "mpnet", "pml3-to-mpnet-scored"),
    ):
        info = StitchInfo(source_model=models[src], target_model=models[tgt])
        X, Y = corpus[src], corpus[tgt]
        stitch = fit_stitch(X[train], Y[train], "ridge", info=info, alpha=1e-2)
        fit_confidence(stitch, X[train], Y[train], X[held], Y[held], seed=0)
        save_stitch(stitch, root / name)
    return root


@pytest.fixture
def scored_client(
    scored_folders: Path, fitted: Any, request: pytest.FixtureRequest
) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def factory(names: list[str], **overrides: Any) -> TestClient:
        folders = [
            str(scored_folders / n if (scored_folders / n).is_dir() else fitted.folder(n))
            for n in names
        ]
        settings = Settings(stitches=folders, load_in_background=False, device="cpu", **overrides)
        client = TestClient(create_app(settings), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.__exit__(None, None, None)


def _post(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/translate", json=body)


def _scores(response: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    vectors = unb64([d["embedding"] for d in data])
    return (
        vectors,
        np.array([d["confidence"] for d in data], dtype=np.float32),
        np.array([d["out_of_distribution"] for d in data], dtype=bool),
    )


def test_confidence_is_the_library_s_and_leaves_the_vectors_alone(
    scored_client: Callable[..., TestClient], scored_folders: Path, queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED])
    x = queries["minilm"][:40]
    plain = _post(client, stitch=SCORED, input=b64(x), encoding_format="base64")
    scored = _post(
        client, stitch=SCORED, input=b64(x), encoding_format="base64", return_confidence=True
    )
    vectors, confidence, ood = _scores(scored)
    assert vectors.tobytes() == unb64([d["embedding"] for d in plain.json()["data"]]).tobytes()
    assert "confidence" not in plain.json()["data"][0]
    assert ((confidence >= 0) & (confidence <= 1)).all()
    assert confidence.std() > 0  # it tells the rows apart
    stitch = load_stitch(scored_folders / SCORED)
    y, expected, expected_ood = translate_with_confidence(stitch, torch.from_numpy(x))
    np.testing.assert_array_equal(np.asarray(y), vectors)
    np.testing.assert_allclose(confidence, np.asarray(expected), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ood, np.asarray(expected_ood))


def test_float_answers_carry_the_same_confidence(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED])
    x = queries["minilm"][:5]
    as_b64 = _scores(
        _post(client, stitch=SCORED, input=b64(x), encoding_format="base64", return_confidence=True)
    )
    response = _post(client, stitch=SCORED, input=x.tolist(), return_confidence=True)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(5))
    np.testing.assert_array_equal([d["confidence"] for d in data], as_b64[1])
    np.testing.assert_array_equal(np.array([d["embedding"] for d in data], np.float32), as_b64[0])


def test_a_vector_s_confidence_does_not_depend_on_its_batch(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED])
    x = queries["minilm"][:24]
    whole = _scores(
        _post(client, stitch=SCORED, input=b64(x), encoding_format="base64", return_confidence=True)
    )
    for i in (0, 7, 23):
        alone = _scores(
            _post(
                client,
                stitch=SCORED,
                input=b64(x[i : i + 1]),
                encoding_format="base64",
                return_confidence=True,
            )
        )
        assert alone[0].tobytes() == whole[0][i : i + 1].tobytes()
        assert alone[1].tobytes() == whole[1][i : i + 1].tobytes()


def test_far_inputs_are_flagged_and_trusted_less(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED])
    real = queries["minilm"][:50]
    noise = np.random.default_rng(0).normal(size=(50, real.shape[1])).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    _, real_conf, real_ood = _scores(
        _post(
            client, stitch=SCORED, input=b64(real), encoding_format="base64", return_confidence=True
        )
    )
    _, noise_conf, noise_ood = _scores(
        _post(
            client,
            stitch=SCORED,
            input=b64(noise),
            encoding_format="base64",
            return_confidence=True,
        )
    )
    assert noise_ood.mean() > 0.9  # a loose threshold on 280 fixture rows: ~97 % here
    assert real_ood.mean() < 0.2
    assert np.median(noise_conf) < np.median(real_conf)


def test_a_chain_multiplies_the_confidences(
    scored_client: Callable[..., TestClient], scored_folders: Path, queries: dict[str, np.ndarray]
) -> None:
    names = ["minilm-to-pml3-scored", "pml3-to-mpnet-scored"]
    client = scored_client(names)
    x = queries["minilm"][:10]
    first = load_stitch(scored_folders / names[0])
    second = load_stitch(scored_folders / names[1])
    models = first.info.source_model, second.info.target_model
    response = _post(
        client,
        source_model=models[0],
        target_model=models[1],
        input=b64(x),
        encoding_format="base64",
        return_confidence=True,
    )
    vectors, confidence, _ = _scores(response)
    assert response.json()["stitch"]["chain"] == names
    plain = _post(
        client,
        source_model=models[0],
        target_model=models[1],
        input=b64(x),
        encoding_format="base64",
    )
    assert vectors.tobytes() == unb64([d["embedding"] for d in plain.json()["data"]]).tobytes()
    y1, c1, _ = translate_with_confidence(first, torch.from_numpy(x))
    _, c2, _ = translate_with_confidence(second, torch.as_tensor(np.asarray(y1)))
    np.testing.assert_allclose(confidence, np.asarray(c1) * np.asarray(c2), rtol=1e-5, atol=1e-6)


def test_a_stitch_without_a_head_is_a_422_and_the_next_request_is_served(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED, "minilm-to-pml3"])
    x = queries["minilm"][:2].tolist()
    refused = _post(client, stitch="minilm-to-pml3", input=x, return_confidence=True)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "no_confidence"
    assert error["param"] == "return_confidence"
    assert "minilm-to-pml3" in error["message"]
    assert _post(client, stitch=SCORED, input=x, return_confidence=True).status_code == 200


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_return_confidence_must_be_a_boolean(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray], value: Any
) -> None:
    client = scored_client([SCORED])
    response = _post(
        client, stitch=SCORED, input=queries["minilm"][:1].tolist(), return_confidence=value
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"
    assert "return_confidence" in response.text


def test_arrow_answers_have_confidence_columns(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    client = scored_client([SCORED])
    x = np.ascontiguousarray(queries["minilm"][:30])
    ids = pa.array([f"q{i}" for i in range(len(x))])
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    sink = pa.BufferOutputStream()
    batch = pa.RecordBatch.from_pydict({"id": ids, "embedding": column})
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch.slice(0, 13))
        writer.write_batch(batch.slice(13))
    body = sink.getvalue().to_pybytes()
    response = client.post(
        "/v1/translate",
        content=body,
        params={"stitch": SCORED, "return_confidence": "true"},
        headers={"content-type": ARROW},
    )
    assert response.status_code == 200, response.text
    table = pa.ipc.open_stream(response.content).read_all()
    assert table.column_names == ["id", "embedding", "confidence", "out_of_distribution"]
    assert table.column("id").to_pylist() == ids.to_pylist()
    expected = _scores(
        _post(client, stitch=SCORED, input=b64(x), encoding_format="base64", return_confidence=True)
    )
    vectors = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(len(x), -1)
    assert vectors.tobytes() == expected[0].tobytes()
    assert table.column("confidence").to_numpy().tobytes() == expected[1].tobytes()
    np.testing.assert_array_equal(table.column("out_of_distribution").to_numpy(), expected[2])
    clash = pa.RecordBatch.from_pydict(
        {"embedding": column, "confidence": pa.array([0.0] * len(x))}
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, clash.schema) as writer:
        writer.write_batch(clash)
    refused = client.post(
        "/v1/translate",
        content=sink.getvalue().to_pybytes(),
        params={"stitch": SCORED, "return_confidence": "true"},
        headers={"content-type": ARROW},
    )
    assert refused.status_code == 400
    assert "confidence" in refused.json()["error"]["message"]


def test_listing_reports_how_far_the_confidence_can_be_trusted(
    scored_client: Callable[..., TestClient],
) -> None:
    client = scored_client([SCORED, "minilm-to-pml3"])
    listed = {s["id"]: s for s in client.get("/v1/stitches").json()["data"]}
    assert listed["minilm-to-pml3"]["confidence"] is None
    report = listed[SCORED]["confidence"]
    assert isinstance(report, dict) and report


@pytest.mark.parametrize("format", ["json", "arrow"])
def test_lead_client_splits_and_keeps_each_row_s_confidence(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray], format: str
) -> None:
    from lead.client import LeadClient
    from lead.errors import NoConfidenceError

    lead = LeadClient(http=scored_client([SCORED, "minilm-to-pml3"]))
    x = queries["minilm"][:23]
    whole = lead.translate_with_confidence(x, stitch=SCORED, format=format)  # type: ignore[arg-type]
    split = lead.translate_with_confidence(x, stitch=SCORED, format=format, batch_size=5)  # type: ignore[arg-type]
    for a, b in zip(whole, split, strict=True):
        assert a.tobytes() == b.tobytes()
    assert whole[0].tobytes() == lead.translate(x, stitch=SCORED).tobytes()
    assert whole[1].shape == (23,) and whole[2].dtype == bool
    with pytest.raises(NoConfidenceError, match="minilm-to-pml3"):
        lead.translate_with_confidence(x, stitch="minilm-to-pml3", format=format)  # type: ignore[arg-type]


def test_a_json_body_refuses_return_confidence_in_the_query(
    scored_client: Callable[..., TestClient], queries: dict[str, np.ndarray]
) -> None:
    """``?return_confidence=true`` beside a JSON body was ignored (an answer without
    confidences, or with them despite ``=false``); like every option of Arrow bodies it is
    a 422 naming it."""
    client = scored_client([SCORED])
    body = {"stitch": SCORED, "input": queries["minilm"][:1].tolist()}
    for value, scored in (("true", False), ("false", True)):
        refused = client.post(
            "/v1/translate",
            params={"return_confidence": value},
            json={**body, "return_confidence": scored},
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["param"] == "return_confidence"
    assert _post(client, **body, return_confidence=True).status_code == 200


def test_no_confidence_names_a_stitch_of_the_same_models_that_has_a_head(
    scored_client: Callable[..., TestClient], fitted: Any, queries: dict[str, np.ndarray]
) -> None:
    """Models named, the preferred stitch without a head: the 422 said "refit it" although
    another served stitch joins the same models with one; it names that stitch now."""
    client = scored_client(["minilm-to-pml3", "minilm-to-pml3-scored"])
    models = {"source_model": fitted.models["minilm"], "target_model": fitted.models["pml3"]}
    x = queries["minilm"][:2].tolist()
    assert _post(client, **models, input=x).json()["stitch"]["chain"] == ["minilm-to-pml3"]
    refused = _post(client, **models, input=x, return_confidence=True)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "no_confidence"
    assert (
        "stitch minilm-to-pml3-scored joins the same models" in refused.json()["error"]["message"]
    )
    named = _post(client, stitch="minilm-to-pml3-scored", input=x, return_confidence=True)
    assert named.status_code == 200, named.text
