"""Service fixtures: stitches fitted from the SciFact fixture, and app/client factories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from lead.artifacts import load_stitch, save_stitch
from lead.fitting import fit_stitch
from lead.stitches import StitchInfo
from service.app import create_app
from service.settings import Settings


@dataclass(frozen=True)
class FittedStitches:
    """Ridge stitches saved as folders: minilm→mpnet, minilm→pml3, pml3→mpnet (all normalising
    their output) and minilm-to-mpnet-raw (not normalising)."""

    root: Path
    models: dict[str, str]

    def folder(self, stitch_id: str) -> Path:
        return self.root / stitch_id

    def expected(self, stitch_ids: list[str], x: np.ndarray) -> np.ndarray:
        """What the service should answer: the saved stitches applied in order, float32."""
        y = torch.from_numpy(np.asarray(x, dtype=np.float32))
        with torch.inference_mode():
            for stitch_id in stitch_ids:
                y = load_stitch(self.folder(stitch_id))(y)
        return y.numpy()


@pytest.fixture(autouse=True)
def _job_data_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apps under test keep job records, datasets and trained stitches in a fresh temporary
    LEAD_DATA_DIR (never ``.lead-data`` in the working directory)."""
    monkeypatch.setenv("LEAD_DATA_DIR", str(tmp_path_factory.mktemp("lead-data")))


@pytest.fixture(scope="session")
def fitted(scifact_small: Any, tmp_path_factory: pytest.TempPathFactory) -> FittedStitches:
    root = tmp_path_factory.mktemp("stitches")
    models = scifact_small.models
    corpus = scifact_small.corpus
    # One thread: a small eigh on oversubscribed cores (parallel CI jobs) can take seconds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for src, tgt in (("minilm", "mpnet"), ("minilm", "pml3"), ("pml3", "mpnet")):
            info = StitchInfo(source_model=models[src], target_model=models[tgt])
            stitch = fit_stitch(corpus[src], corpus[tgt], "ridge", info=info, alpha=1e-2)
            save_stitch(stitch, root / f"{src}-to-{tgt}")
        info = StitchInfo(source_model=models["minilm"], target_model=models["mpnet"])
        raw = fit_stitch(
            corpus["minilm"],
            corpus["mpnet"],
            "ridge",
            info=info,
            normalize_output=False,
            alpha=1e-2,
        )
        save_stitch(raw, root / "minilm-to-mpnet-raw")
    finally:
        torch.set_num_threads(threads)
    return FittedStitches(root, models)


@pytest.fixture(scope="session")
def queries(scifact_small: Any) -> dict[str, np.ndarray]:
    """Real query vectors (float32, unit rows) of each model: minilm (100, 384), ..."""
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in scifact_small.queries.items()}


@pytest.fixture
def make_client(fitted: FittedStitches) -> Iterator[Callable[..., TestClient]]:
    """``make_client(stitches=[...ids...], **settings)`` → a started TestClient.

    Stitch ids name folders of :func:`fitted`; other entries (paths, Hub ids) pass through.
    Loading happens before start-up completes unless ``load_in_background=True``.
    """
    clients: list[TestClient] = []

    def factory(stitches: list[str] | None = None, **overrides: Any) -> TestClient:
        names = ["minilm-to-mpnet"] if stitches is None else stitches
        entries = [
            str(fitted.folder(name)) if (fitted.root / name).is_dir() else name for name in names
        ]
        overrides.setdefault("load_in_background", False)
        overrides.setdefault("device", "cpu")
        settings = Settings(stitches=entries, **overrides)
        client = TestClient(create_app(settings), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    """All three fitted stitches, no API keys, default limits."""
    return make_client(["minilm-to-mpnet", "minilm-to-pml3", "pml3-to-mpnet"])
