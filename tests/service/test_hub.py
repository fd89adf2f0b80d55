"""Hub stitches from a pre-populated Hugging Face cache, offline, without any network call."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_helpers import b64, embeddings, no_network

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "lead-test/minilm-to-mpnet"


def _populate_cache(cache: Path, repo_id: str, commit: str, folder: Path) -> None:
    """The cache layout huggingface_hub writes: blobs by hash, snapshots linking to them."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)


@pytest.fixture
def offline_cache(tmp_path: Path, fitted: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _populate_cache(cache, REPO, COMMIT, fitted.folder("minilm-to-mpnet"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_hub_stitches_load_from_the_cache_offline(
    offline_cache: Path,
    make_client: Any,
    fitted: Any,
    queries: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pinned = f"{REPO}@{COMMIT}"
    with no_network(monkeypatch):
        client = make_client([pinned, REPO])
        r = client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["ready"] == [REPO, pinned]

        r = client.get(f"/v1/stitches/{pinned}")  # ids with '/' and '@' in the path
        assert r.status_code == 200, r.text
        stitch = r.json()
        assert stitch["id"] == pinned
        assert stitch["origin"] == "hub"
        assert stitch["revision"] == COMMIT
        assert stitch["source"] == {
            "model": fitted.models["minilm"],
            "dim": 384,
            "normalized": True,
            "revision": None,
        }
        assert stitch["target"]["dim"] == 768
        assert stitch["architecture"] == "affine"
        assert stitch["commit"] == COMMIT
        unpinned = client.get(f"/v1/stitches/{REPO}").json()
        assert (unpinned["revision"], unpinned["commit"]) == (None, COMMIT)  # which main loaded
        listed = {s["id"]: s for s in client.get("/v1/stitches").json()["data"]}
        assert listed[REPO]["commit"] == COMMIT

        x = queries["minilm"][:5]
        r = client.post("/v1/translate", json={"stitch": pinned, "input": b64(x)})
        assert r.status_code == 200, r.text
        assert r.json()["stitch"]["id"] == pinned
        np.testing.assert_allclose(
            embeddings(r.json()), fitted.expected(["minilm-to-mpnet"], x), rtol=1e-5, atol=1e-6
        )


def test_uncached_hub_stitch_is_reported(
    offline_cache: Path, make_client: Any, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with no_network(monkeypatch):
        client = make_client(["lead-test/not-cached@main", REPO])
        r = client.get("/readyz")
        assert r.status_code == 503, r.text
        [failure] = r.json()["failed"]
        assert failure["id"] == "lead-test/not-cached@main"
        assert failure["error"] == "StitchNotFoundError"
        assert "cache" in failure["message"]
        r = client.post("/v1/translate", json={"stitch": REPO, "input": b64(queries["minilm"][:1])})
        assert r.status_code == 200, r.text


def test_hub_stitch_files_download_but_the_stitch_is_not_deleted(
    offline_cache: Path, make_client: Any, fitted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = f"{REPO}@{COMMIT}"
    with no_network(monkeypatch):
        client = make_client([pinned])
        for name in ("config.json", "model.safetensors", "README.md"):
            r = client.get(f"/v1/stitch-files/{name}", params={"stitch": pinned})
            assert r.status_code == 200, r.text
            assert r.content == (fitted.folder("minilm-to-mpnet") / name).read_bytes()
        r = client.delete(f"/v1/stitches/{pinned}")
        assert r.status_code == 409, r.text  # configured (the Hub), not trained by a job
        assert "(hub)" in r.json()["error"]["message"]
        assert client.get(f"/v1/stitches/{pinned}").status_code == 200
