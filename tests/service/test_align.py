"""POST /v1/align: lead.alignment_scores of inline pairs or a dataset, the size cap, and every
bad request (each followed by a good one)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from jobs_helpers import dataset_bytes, make_jobs_client, upload
from service_helpers import b64, hold_one_request

from lead.alignment import alignment_scores
from service.app import create_app
from service.jobs.manager import JobManager
from service.settings import Settings

MAX_ALIGN = 120
MAX_INLINE = 100


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    client = make_jobs_client(
        tmp_path_factory.mktemp("align-data"),
        max_align_pairs=MAX_ALIGN,
        max_inline_pairs=MAX_INLINE,
        max_dimension=1000,
    )
    yield client
    client.__exit__(None, None, None)


def _close(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got["object"] == "alignment"
    assert set(got) == {"object", *expected}
    undefined = {k for k, v in expected.items() if v is None}  # a CCA score with too few pairs
    assert {k for k, v in got.items() if v is None} == undefined
    skip = {"object", "shuffled_baseline"} | undefined
    defined = {k: v for k, v in got.items() if k not in skip}
    assert defined == pytest.approx({k: expected[k] for k in defined}, rel=1e-9)
    baseline = got["shuffled_baseline"]
    assert set(baseline) == set(expected["shuffled_baseline"])
    for key, value in expected["shuffled_baseline"].items():
        assert baseline[key] == (None if value is None else pytest.approx(value, rel=1e-9))


def test_align_inline_pairs(client: TestClient, scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"][:60], scifact_small.corpus["mpnet"][:60]
    r = client.post("/v1/align", json={"source": X.tolist(), "target": b64(Y), "folds": 3})
    assert r.status_code == 200, r.text
    _close(r.json(), alignment_scores(X, Y, folds=3, seed=0))
    assert r.json()["pairs"] == 60 and 0 < r.json()["linear_cka_score"] <= 1
    for key in ("unbiased_cka_score", "cknna_score", "cycle_knn_score", "svcca_score"):
        assert 0 < r.json()[key] <= 1, key
    assert r.json()["pwcca_score"] is None  # 59 + 59 directions, 60 pairs: CCA is undefined


def test_align_a_dataset_beyond_the_cap_uses_a_seeded_subset(
    client: TestClient, scifact_small: Any
) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    ds = upload(client, dataset_bytes(X, Y))
    r = client.post("/v1/align", json={"dataset": ds["id"], "seed": 3, "folds": 2})
    assert r.status_code == 200, r.text
    assert r.json()["pairs"] == MAX_ALIGN
    _close(r.json(), alignment_scores(X, Y, folds=2, seed=3, max_pairs=MAX_ALIGN))
    # real, related models align far better than shuffled pairs
    shuffled = np.random.default_rng(0).permutation(len(Y))
    ds_shuffled = upload(client, dataset_bytes(X, Y[shuffled]))
    shuffled_body = {"dataset": ds_shuffled["id"], "seed": 3, "folds": 2}
    worse = client.post("/v1/align", json=shuffled_body).json()
    assert r.json()["ridge_r2_score"] > 0.1 > worse["ridge_r2_score"]
    assert r.json()["mutual_knn_score"] > worse["mutual_knn_score"]
    for key in ("unbiased_cka_score", "cknna_score", "cycle_knn_score", "svcca_score"):
        assert r.json()[key] > worse[key], key


def _wide(rows: np.ndarray) -> list[list[float]]:
    """The rows with column 7 a billion times wider than the others (still within float32)."""
    wide = np.array(rows, dtype=np.float64)
    wide[:, 7] *= 1e9
    return list(wide.tolist())


def _nan(rows: np.ndarray) -> list[list[float]]:
    out = rows.tolist()
    out[1][2] = float("nan")
    return list(out)


BAD: list[tuple[str, Any, int, str]] = [
    ("unknown dataset", lambda X, Y: {"dataset": "ds_missing"}, 404, "dataset_not_found"),
    ("dataset and inline", lambda X, Y: {"dataset": "ds_x", "source": X.tolist(),
                                         "target": Y.tolist()}, 422, "validation_error"),
    ("no target", lambda X, Y: {"source": X.tolist()}, 422, "validation_error"),
    ("one fold", lambda X, Y: {"source": X.tolist(), "target": Y.tolist(), "folds": 1}, 422,
     "validation_error"),
    ("3 pairs", lambda X, Y: {"source": X[:3].tolist(), "target": Y[:3].tolist()}, 422,
     "too_few_pairs"),
    ("rows differ", lambda X, Y: {"source": X.tolist(), "target": Y[:-1].tolist()}, 422,
     "shape_mismatch"),
    ("NaN", lambda X, Y: {"source": _nan(X), "target": Y.tolist()}, 422, "non_finite_input"),
    ("bad base64", lambda X, Y: {"source": X.tolist(), "target": ["@@"] * len(Y)}, 400,
     "decode_error"),
    ("ill-conditioned source", lambda X, Y: {"source": _wide(X), "target": Y.tolist()}, 422,
     "ill_conditioned_input"),
    ("over the inline cap", lambda X, Y: {"source": np.tile(X, (6, 1)).tolist(),
                                          "target": np.tile(Y, (6, 1)).tolist()}, 422,
     "limit_exceeded"),
    ("wider than the dimension cap", lambda X, Y: {"source": X.tolist(),
                                                  "target": b64(np.tile(Y, (1, 2)))}, 422,
     "limit_exceeded"),
    ("a number beyond float64", lambda X, Y: {"source": [[10**400, *X[0, 1:].tolist()],
                                                         *X[1:].tolist()], "target": Y.tolist()},
     422, "validation_error"),
    ("7 pairs in 2 folds", lambda X, Y: {"source": X[:7].tolist(), "target": Y[:7].tolist(),
                                         "folds": 2}, 422, "too_few_pairs"),
    ("all-zero source", lambda X, Y: {"source": np.zeros_like(X).tolist(),
                                      "target": Y.tolist()}, 422, "ill_conditioned_input"),
    ("one target row repeated", lambda X, Y: {"source": X.tolist(),
                                              "target": np.tile(Y[:1], (20, 1)).tolist()}, 422,
     "ill_conditioned_input"),
    ("NaN seed", lambda X, Y: {"source": X.tolist(), "target": Y.tolist(), "seed": float("nan")},
     422, "non_finite_input"),
    ("a boolean among floats", lambda X, Y: {"source": [[*X[0, :-1].tolist(), True],
                                                        *X[1:].tolist()], "target": Y.tolist()},
     400, "invalid_input"),
    # as POST /v1/translate: pydantic read "0.12" as 0.12 (an adversarial pass)
    ("a number as a string", lambda X, Y: {"source": X.tolist(),
                                            "target": [[str(Y[0, 0]), *Y[0, 1:].tolist()],
                                                       *Y[1:].tolist()]},
     400, "invalid_input"),
]  # fmt: skip

#: (case, param, words in the message) of the cases whose error names a side.
PARAMS = {
    "3 pairs": ("source", ["at least 4 pairs", "3"]),
    "7 pairs in 2 folds": ("source", ["training", "at least 8 pairs", "fewer folds"]),
    "all-zero source": ("source", ["source vectors do not vary"]),
    "one target row repeated": ("target", ["target vectors do not vary"]),
    "NaN seed": ("seed", ["seed"]),
    "a number beyond float64": ("source[0][0]", ["valid number"]),
    "wider than the dimension cap": ("target", ["dimension 1536", "limit is 1000"]),
    "ill-conditioned source": ("source", ["ill-conditioned: column 7", "standardise"]),
    "a boolean among floats": ("source[0]", ["source[0] contains true, not a number"]),
    "a number as a string": ("target[0]", ["target[0] contains the string '", "not a number"]),
}


@pytest.mark.parametrize(("case", "make", "status", "code"), BAD, ids=[c[0] for c in BAD])
def test_bad_align_request_then_a_good_one(
    client: TestClient, scifact_small: Any, case: str, make: Any, status: int, code: str
) -> None:
    X, Y = scifact_small.corpus["minilm"][:20], scifact_small.corpus["mpnet"][:20]
    body = json.dumps(make(X, Y))
    r = client.post("/v1/align", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.json()
    if case in PARAMS:
        param, words = PARAMS[case]
        assert r.json()["error"]["param"] == param, r.json()
        assert all(w in r.json()["error"]["message"] for w in words), r.json()
    good = client.post(
        "/v1/align", json={"source": X[:12].tolist(), "target": Y[:12].tolist(), "folds": 2}
    )
    assert good.status_code == 200, good.text


def test_wrong_content_type_is_415_then_a_good_one(client: TestClient, scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"][:12], scifact_small.corpus["mpnet"][:12]
    body = json.dumps({"source": X.tolist(), "target": Y.tolist(), "folds": 2})
    for headers in ({"content-type": "text/plain"}, {"content-type": "multipart/form-data"}, {}):
        r = client.post("/v1/align", content=body, headers=headers)
        assert r.status_code == 415, r.text
        assert r.json()["error"]["code"] == "unsupported_media_type"
        good = client.post("/v1/align", content=body, headers={"content-type": "application/json"})
        assert good.status_code == 200, good.text


def test_align_over_its_concurrency_limit_is_429_then_admitted(
    client: TestClient, scifact_small: Any
) -> None:
    X, Y = scifact_small.corpus["minilm"][:12], scifact_small.corpus["mpnet"][:12]
    body = {"source": X.tolist(), "target": Y.tolist(), "folds": 2}
    limiter = client.app.state.align_limiter  # type: ignore[attr-defined]
    assert limiter.limit == 1  # LEAD_MAX_CONCURRENT_ALIGN's default
    assert limiter.try_acquire()  # the one slot is held, as by an align in progress
    try:
        r = client.post("/v1/align", json=body)
    finally:
        limiter.release()
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "overloaded"
    assert "align" in r.json()["error"]["message"]
    good = client.post("/v1/align", json=body)
    assert good.status_code == 200, good.text
    assert limiter.in_flight == 0


def test_a_running_align_holds_its_slot_and_leaves_translate_free(
    tmp_path: Any, scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        stitches=[],
        device="cpu",
        load_in_background=False,
        data_dir=tmp_path,
        retry_after_seconds=3,
    )
    app = create_app(settings)
    release = threading.Event()
    original = JobManager.align

    def gated_align(self: JobManager, body: Any) -> dict[str, Any]:
        assert release.wait(10), "the test never released the first align"
        return original(self, body)

    monkeypatch.setattr(JobManager, "align", gated_align)
    X, Y = scifact_small.corpus["minilm"][:12], scifact_small.corpus["mpnet"][:12]
    body = {"source": X.tolist(), "target": Y.tolist(), "folds": 2}

    async def translate_while_held(http: httpx.AsyncClient) -> None:
        # translate has its own limiter: it is not refused as overloaded (404: no stitch)
        translate = await http.post("/v1/translate", json={"stitch": "x", "input": [[1.0]]})
        assert translate.status_code == 404, translate.text

    first, second, third = hold_one_request(
        app,
        "/v1/align",
        body,
        limiter=lambda: app.state.align_limiter,
        release=release,
        while_held=translate_while_held,
    )
    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    assert second.headers["retry-after"] == "3"
    assert third.status_code == 200, third.text
    assert app.state.align_limiter.in_flight == 0


def test_data_float32_cannot_hold_is_a_422_never_a_200_with_null_scores(
    client: TestClient, scifact_small: Any
) -> None:
    X, Y = scifact_small.corpus["minilm"][:60], scifact_small.corpus["pml3"][:60]
    scaled = X.astype(np.float64) * np.logspace(-150, 150, X.shape[1])  # ridge R² was NaN
    r = client.post("/v1/datasets", content=dataset_bytes(scaled, Y),
                    headers={"content-type": "application/octet-stream"})  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "non_finite_input"
    assert "beyond the float32 range" in r.json()["error"]["message"]
    wide = np.array(Y, dtype=np.float64)
    wide[:, 3] *= 1e12
    r = client.post("/v1/align", json={"source": X.tolist(), "target": wide.tolist(), "folds": 2})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "ill_conditioned_input"
    assert r.json()["error"]["param"] == "target"
    good = client.post("/v1/align", json={"source": X.tolist(), "target": Y.tolist(), "folds": 2})
    assert good.status_code == 200, good.text
    assert None not in (good.json()["ridge_r2_score"], good.json()["linear_cka_score"])


def test_inline_pairs_over_the_body_limit_point_to_a_dataset_upload(
    tmp_path_factory: pytest.TempPathFactory, scifact_small: Any
) -> None:
    small = make_jobs_client(tmp_path_factory.mktemp("small-body"), max_body_bytes=40_000)
    try:
        X, Y = scifact_small.corpus["minilm"][:20], scifact_small.corpus["pml3"][:20]
        job = {"source_model": "a", "target_model": "b", "source": b64(X), "target": b64(Y)}
        body = json.dumps(job).encode()  # ~ 80 kB
        for path, content in (("/v1/jobs", body), ("/v1/align", body), ("/v1/jobs", iter([body]))):
            r = small.post(path, content=content, headers={"content-type": "application/json"})
            assert r.status_code == 413, r.text
            message = r.json()["error"]["message"]
            assert "the limit is 40000 bytes" in message
            assert "POST /v1/datasets" in message and "lead datasets upload" in message
            assert '"dataset"' in message
        r = small.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "datasets" not in r.json()["error"]["message"]
        good = small.post("/v1/align", json={"source": b64(X[:8]), "target": b64(Y[:8]),
                                             "folds": 2})  # fmt: skip
        assert good.status_code == 200, good.text
    finally:
        small.__exit__(None, None, None)
