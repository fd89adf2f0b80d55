"""Helpers of the jobs, datasets and align tests: apps with a data dir, datasets, waiting."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save

from lead.fitting import fit_stitch
from lead.scorecard import RetrievalData, score_stitch
from lead.splits import holdout_split
from lead.stitches import StitchInfo
from service.app import create_app
from service.settings import Settings

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
OCTET = {"content-type": "application/octet-stream"}


def make_jobs_client(data_dir: Path, **overrides: Any) -> TestClient:
    """A started TestClient serving no bundled stitch, with jobs under ``data_dir``."""
    overrides.setdefault("stitches", [])
    overrides.setdefault("load_in_background", False)
    overrides.setdefault("device", "cpu")
    client = TestClient(
        create_app(Settings(data_dir=data_dir, **overrides)), raise_server_exceptions=False
    )
    client.__enter__()
    return client


def wait_job(
    client: TestClient, job_id: str, *, until: Any = None, timeout: float = 90.0
) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` until ``until(job)`` (default: a final status)."""
    done = until or (lambda job: job["status"] in TERMINAL)
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job = r.json()
        if done(job):
            return job
        if job["status"] in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"job did not reach the expected state: {job}")
        time.sleep(0.05)


def dataset_bytes(
    source: np.ndarray,
    target: np.ndarray,
    metadata: dict[str, str] | None = None,
    **extra: np.ndarray,
) -> bytes:
    """A dataset file: ``source``, ``target`` and any extra tensors, with metadata."""
    tensors = {"source": source, "target": target, **extra}
    return save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=metadata)


def scifact_dataset(sf: Any, src: str = "minilm", tgt: str = "mpnet") -> bytes:
    """The SciFact fixture as a dataset with queries, ids and qrels (retrieval scores)."""
    return dataset_bytes(
        sf.corpus[src],
        sf.corpus[tgt],
        metadata={
            "query_ids": json.dumps(sf.query_ids),
            "corpus_ids": json.dumps(sf.corpus_ids),
            "qrels": json.dumps(sf.qrels),
            "name": f"scifact-small {src}->{tgt}",
        },
        source_queries=sf.queries[src],
        target_queries=sf.queries[tgt],
    )


def upload(client: TestClient, body: bytes, **params: Any) -> dict[str, Any]:
    r = client.post("/v1/datasets", content=body, headers=OCTET, params=params)
    assert r.status_code == 201, r.text
    return dict(r.json())


def lead_scorecard(
    X: np.ndarray,
    Y: np.ndarray,
    *,
    source_model: str,
    target_model: str,
    method: str = "ridge",
    holdout_fraction: float = 0.2,
    seed: int = 0,
    retrieval: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The scorecard lead itself gives: split, fit on the training rows, score the rest."""
    train, test = holdout_split(len(X), holdout_fraction, seed)
    info = StitchInfo(source_model=source_model, target_model=target_model)
    stitch = fit_stitch(X[train], Y[train], method, info=info, seed=seed, **options)
    data = None
    if retrieval is not None:
        data = RetrievalData(
            target_queries=retrieval["target_queries"],
            source_queries=retrieval.get("source_queries"),
            query_ids=retrieval["query_ids"],
            corpus_ids=[retrieval["corpus_ids"][i] for i in test],
            qrels=retrieval["qrels"],
        )
    card = score_stitch(
        stitch, X[test], Y[test], target_train_mean=Y[train].mean(axis=0), retrieval=data
    )
    return card.to_dict()


def assert_same_scorecard(got: Any, expected: Any, path: str = "scorecard") -> None:
    """Equal keys everywhere, numbers equal to a relative 1e-6."""
    if isinstance(expected, dict):
        assert isinstance(got, dict), path
        assert set(got) == set(expected), (path, set(got) ^ set(expected))
        for key in expected:
            assert_same_scorecard(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-9), path
    else:
        assert got == expected, path
