"""Stitch stores: a folder, any fsspec URL (``memory://``, ``file://``), the Hub (offline)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import SecretStr
from service_helpers import no_network
from test_hub import COMMIT, _populate_cache

from lead.artifacts import ARTIFACT_FILES, load_stitch
from lead.errors import InvalidInputError, StitchFormatError, StitchNotFoundError
from service.jobs.stitch_store import (
    FolderStore,
    FsspecStore,
    HubStore,
    StitchStore,
    open_stitch_store,
)

STITCH = "minilm-to-mpnet"
OTHER = "minilm-to-mpnet-raw"  # another stitch's files, to see a put replace


def _same_files(folder: Path, expected: Path) -> bool:
    return all((folder / n).read_bytes() == (expected / n).read_bytes() for n in ARTIFACT_FILES)


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh folder of fsspec's in-process ``memory://`` file system, removed afterwards."""
    import fsspec

    root = f"lead-test-{uuid.uuid4().hex}"
    yield f"memory://{root}/stitches"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{root}"):
        fs.rm(f"/{root}", recursive=True)


@pytest.fixture(params=["folder", "memory", "file"])
def any_store(request: Any, tmp_path: Path, memory_url: str) -> StitchStore:
    if request.param == "folder":
        return FolderStore(tmp_path / "store")
    url = memory_url if request.param == "memory" else (tmp_path / "remote").as_uri()
    return FsspecStore(url, tmp_path / "cache")


def test_put_publishes_replaces_and_delete_removes(any_store: StitchStore, fitted: Any) -> None:
    assert not any_store.exists("s1")
    with pytest.raises(StitchNotFoundError, match="s1"):
        any_store.local_folder("s1")
    any_store.put("s1", fitted.folder(STITCH))
    assert any_store.exists("s1")
    folder = any_store.local_folder("s1")
    assert _same_files(folder, fitted.folder(STITCH))
    x = torch.linspace(-1, 1, 3 * 384).reshape(3, 384)
    with torch.inference_mode():
        assert torch.equal(load_stitch(folder)(x), load_stitch(fitted.folder(STITCH))(x))

    any_store.put("s1", fitted.folder(OTHER))  # putting again replaces
    assert _same_files(any_store.local_folder("s1"), fitted.folder(OTHER))

    any_store.delete("s1")
    assert not any_store.exists("s1")
    assert not folder.exists()  # the folder, or this machine's copy, is gone too
    with pytest.raises(StitchNotFoundError):
        any_store.local_folder("s1")
    any_store.delete("s1")  # nothing there: no error


def test_stores_refuse_bad_ids_and_incomplete_folders(
    any_store: StitchStore, fitted: Any, tmp_path: Path
) -> None:
    for bad in ("../escape", ".hidden", "a/b", "", "x" * 129):
        with pytest.raises(InvalidInputError, match="not a stitch id"):
            any_store.put(bad, fitted.folder(STITCH))
        with pytest.raises(InvalidInputError):
            any_store.local_folder(bad)
    partial = tmp_path / "partial"
    shutil.copytree(fitted.folder(STITCH), partial)
    (partial / "model.safetensors").unlink()
    with pytest.raises(StitchFormatError, match=r"model\.safetensors"):
        any_store.put("s2", partial)
    assert not any_store.exists("s2")


def test_folder_store_leaves_no_temporary_folders(tmp_path: Path, fitted: Any) -> None:
    store = FolderStore(tmp_path / "store")
    store.put("s1", fitted.folder(STITCH))
    store.put("s1", fitted.folder(OTHER))
    store.put("s2", fitted.folder(STITCH))
    assert sorted(p.name for p in store.root.iterdir()) == ["s1", "s2"]
    store.delete("s1")
    assert sorted(p.name for p in store.root.iterdir()) == ["s2"]


def test_folder_store_keeps_a_stitch_saved_in_place(tmp_path: Path, fitted: Any) -> None:
    """The worker saves into data_dir/stitches/<id>: putting that folder changes nothing."""
    store = open_stitch_store(None, tmp_path)
    assert isinstance(store, FolderStore)
    in_place = tmp_path / "stitches" / "s1"
    shutil.copytree(fitted.folder(STITCH), in_place)
    inode = in_place.stat().st_ino
    store.put("s1", in_place)
    assert store.local_folder("s1") == in_place.resolve()
    assert in_place.stat().st_ino == inode
    assert _same_files(in_place, fitted.folder(STITCH))


def test_fsspec_replicas_share_the_store_and_cache_their_copies(
    memory_url: str, tmp_path: Path, fitted: Any
) -> None:
    trainer = FsspecStore(memory_url, tmp_path / "a")
    other = FsspecStore(memory_url, tmp_path / "b")  # another replica, its own cache
    trainer.put("s1", fitted.folder(STITCH))
    assert other.exists("s1")
    copy = other.local_folder("s1")
    assert copy.is_relative_to(tmp_path / "b")
    assert _same_files(copy, fitted.folder(STITCH))
    assert sorted(p.name for p in copy.parent.iterdir()) == ["s1"]  # no .tmp-* left
    assert other.local_folder("s1") == copy  # the cached copy is reused

    trainer.delete("s1")
    assert not other.exists("s1")
    other.evict("s1")  # what the watcher does once the job record says deleted
    assert not copy.exists()
    with pytest.raises(StitchNotFoundError):
        other.local_folder("s1")


def test_open_stitch_store_picks_the_store(tmp_path: Path, memory_url: str) -> None:
    default = open_stitch_store(None, tmp_path)
    assert isinstance(default, FolderStore) and default.root == (tmp_path / "stitches").resolve()
    assert isinstance(open_stitch_store("", tmp_path), FolderStore)
    shared = open_stitch_store(str(tmp_path / "shared"), tmp_path)
    assert isinstance(shared, FolderStore) and shared.url == str(tmp_path / "shared")
    remote = open_stitch_store(memory_url, tmp_path)
    assert isinstance(remote, FsspecStore) and remote.url == memory_url
    assert remote.cache.is_relative_to(tmp_path / "stitch-cache")
    assert isinstance(open_stitch_store((tmp_path / "f").as_uri(), tmp_path), FsspecStore)
    hub = open_stitch_store("hub://lead-test", tmp_path, SecretStr("hf_secret"))
    assert isinstance(hub, HubStore) and hub.url == "hub://lead-test"
    assert hub._token == "hf_secret"  # unwrapped for huggingface_hub, never in the url


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hub://", "does not name a Hub user"),
        ("hub://org/name", "does not name a Hub user"),
        ("nope://bucket/x", "Protocol not known: nope"),
        ("nope://user:pa55word@host/x", "user:\\*\\*\\*@host"),
    ],
)
def test_open_stitch_store_refuses_bad_specs(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as caught:
        open_stitch_store(spec, tmp_path)
    assert caught.value.param == "stitch_store"
    assert "pa55word" not in str(caught.value)


@pytest.fixture
def offline_hub(tmp_path: Path, fitted: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``lead-test/minilm-to-mpnet`` in a pre-populated Hugging Face cache, offline."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _populate_cache(cache, f"lead-test/{STITCH}", COMMIT, fitted.folder(STITCH))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with no_network(monkeypatch):
        yield


def test_hub_store_loads_from_the_cache_offline(offline_hub: None, fitted: Any) -> None:
    store = HubStore("lead-test", token=None)
    assert store.exists(STITCH)
    assert not store.exists("not-cached")
    folder = store.local_folder(STITCH)
    assert folder.name == COMMIT
    assert _same_files(folder, fitted.folder(STITCH))
    with pytest.raises(StitchNotFoundError, match="HF_HUB_OFFLINE"):
        store.local_folder("not-cached")
    store.delete(STITCH)  # forgets only: the Hub repo (and the cache) stay
    assert store.exists(STITCH)
    with pytest.raises(InvalidInputError):
        store.local_folder("../x")


@pytest.mark.network
def test_hub_store_pushes_to_the_live_hub(fitted: Any, tmp_path: Path) -> None:
    org = os.environ.get("LEAD_TEST_HUB_ORG")
    if not org or not os.environ.get("HF_TOKEN"):
        pytest.skip("set LEAD_TEST_HUB_ORG and HF_TOKEN to test against the live Hub")
    store = HubStore(org, os.environ["HF_TOKEN"])
    stitch_id = f"lead-test-{uuid.uuid4().hex[:8]}"
    store.put(stitch_id, fitted.folder(STITCH))
    assert store.exists(stitch_id)
    folder = store.local_folder(stitch_id)
    assert _same_files(folder, fitted.folder(STITCH))
    x = np.ones((1, 384), dtype=np.float32)
    with torch.inference_mode():
        got = load_stitch(folder)(torch.from_numpy(x))
        assert torch.equal(got, load_stitch(fitted.folder(STITCH))(torch.from_numpy(x)))
