"""Stitch artifacts: exact save → load round trips, strict validation, Hub cache loading."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import huggingface_hub
import numpy as np
import pytest
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from safetensors.torch import load_file, save_file

import lead.artifacts
from lead.artifacts import (
    ARTIFACT_FILES,
    BUNDLED_MODELS_DIR,
    is_replaceable,
    load_stitch,
    push_stitch,
    read_stitch_config,
    save_stitch,
    stitch_folder,
)
from lead.errors import (
    ConflictError,
    HubError,
    InvalidInputError,
    StitchFormatError,
    StitchNotFoundError,
    UnknownArchitectureError,
)
from lead.fitting import fit_stitch
from lead.stitches import MLPStitch, Stitch, StitchInfo

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SCORECARD = {
    "pairs": 20,
    "pool_size": 20,
    "r2_score": 0.5,
    "mean_squared_error": 0.01,
    "retrieval": None,
    "baselines": {"mean_estimator": {"r2_score": 0.0}},
}


def _info() -> StitchInfo:
    return StitchInfo(
        source_model="org/source-model",
        target_model="org/target-model",
        source_revision="abc",
        target_normalized=False,
        fit={"data": "toy pairs"},
        scorecard=dict(SCORECARD),
    )


def _fitted(method: str, **options: Any) -> Stitch:
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(60, 5)), rng.normal(size=(60, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # unit rows: the source is normalised
    return fit_stitch(X, Y, method, info=_info(), **options)


def _mlp() -> Stitch:
    """An MLP stitch with every parameter random (training is tested elsewhere)."""
    stitch = MLPStitch(5, 3, hidden_dim=8, depth=2, normalize_output=True, info=_info())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in stitch.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    return stitch


STITCHES = {
    "affine": lambda: _fitted("ridge"),
    "orthogonal": lambda: _fitted("procrustes", scaling=True),
    "mlp": _mlp,
}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_stitch(_fitted("ridge"), tmp_path / "stitch")


@pytest.mark.parametrize("architecture", sorted(STITCHES))
def test_save_load_round_trips_exactly(tmp_path: Path, architecture: str) -> None:
    stitch = STITCHES[architecture]()
    folder = save_stitch(stitch, tmp_path / "out")
    loaded = load_stitch(folder)
    assert type(loaded) is type(stitch) and loaded.architecture == architecture
    assert loaded.get_config() == stitch.get_config()
    assert loaded.normalize_output == stitch.normalize_output
    assert loaded.info == stitch.info
    original, restored = stitch.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys()
    for name, tensor in original.items():
        assert torch.equal(tensor, restored[name]), name
    x = torch.randn(7, 5)
    with torch.no_grad():
        assert torch.equal(stitch(x), loaded(x))
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def test_config_json_documents_the_artifact(saved: Path) -> None:
    config = read_stitch_config(saved)
    assert sorted(p.name for p in saved.iterdir()) == sorted(ARTIFACT_FILES)
    assert config["format"] == "lead-stitch" and config["format_version"] == 1
    assert config["architecture"] == "affine"
    assert config["weight_orientation"] == "(d_tgt, d_src)"
    assert config["source"] == {
        "model": "org/source-model",
        "dim": 5,
        "revision": "abc",
        "normalized": True,
    }
    assert config["target"]["dim"] == 3 and config["target"]["normalized"] is False
    assert config["normalize_output"] is False  # follows target_normalized
    assert config["tensors"] == {"source_mean": [5], "target_mean": [3], "weight": [3, 5]}
    assert config["scorecard"] == SCORECARD
    assert config["fit"]["method"] == "ridge" and config["fit"]["data"] == "toy pairs"
    assert config["lead_version"] == "0.1.0"
    tensors = load_file(saved / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in tensors.values())


def test_model_card_has_hub_metadata_and_the_scorecard(saved: Path) -> None:
    yaml = pytest.importorskip("yaml")
    text = (saved / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["library_name"] == "lead"
    assert meta["tags"] == ["lead", "embedding-stitch", "affine"]
    assert meta["base_model"] == ["org/source-model", "org/target-model"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert {"type": "r2_score", "value": 0.5, "name": "r2_score"} in metrics
    assert "| `r2_score` | 0.5000 | 0.0000 |" in text
    assert "load_stitch(" in text and "lead translate" in text


def test_save_replaces_an_existing_stitch_atomically(tmp_path: Path) -> None:
    folder = tmp_path / "stitch"
    save_stitch(_fitted("ridge"), folder)
    second = _fitted("procrustes")
    save_stitch(second, folder)
    assert load_stitch(folder).architecture == "orthogonal"
    assert [p.name for p in tmp_path.iterdir()] == ["stitch"]  # no temporary folders left


def test_a_failed_save_keeps_the_previous_stitch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = save_stitch(_fitted("ridge"), tmp_path / "stitch")
    before = (folder / "model.safetensors").read_bytes()

    def broken(config: dict[str, Any], name: str) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(lead.artifacts, "model_card", broken)
    with pytest.raises(OSError, match="disk full"):
        save_stitch(_fitted("procrustes"), folder)
    assert (folder / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["stitch"]


def test_save_without_overwrite_keeps_an_existing_stitch(tmp_path: Path) -> None:
    folder = save_stitch(_fitted("ridge"), tmp_path / "stitch")
    before = {name: (folder / name).read_bytes() for name in ARTIFACT_FILES}
    with pytest.raises(ConflictError, match="exists already") as info:
        save_stitch(_fitted("procrustes"), folder, overwrite=False)
    assert info.value.param == "folder"
    assert {name: (folder / name).read_bytes() for name in ARTIFACT_FILES} == before
    assert [p.name for p in tmp_path.iterdir()] == ["stitch"]
    (tmp_path / "empty").mkdir()  # an empty folder is no stitch to lose
    save_stitch(_fitted("procrustes"), tmp_path / "empty", overwrite=False)
    assert load_stitch(tmp_path / "empty").architecture == "orthogonal"
    (tmp_path / "afile").write_text("mine")  # it said "exists already and is not empty"
    with pytest.raises(ConflictError, match="afile is a file, not a folder"):
        save_stitch(_fitted("ridge"), tmp_path / "afile", overwrite=False)
    assert (tmp_path / "afile").read_text() == "mine"


def test_save_without_overwrite_checks_again_when_it_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "stitch"
    card = lead.artifacts.model_card
    other = _fitted("ridge")

    def meanwhile(config: dict[str, Any], name: str) -> str:  # another writer gets there first
        monkeypatch.setattr(lead.artifacts, "model_card", card)
        save_stitch(other, folder)
        return card(config, name)

    monkeypatch.setattr(lead.artifacts, "model_card", meanwhile)
    with pytest.raises(ConflictError):
        save_stitch(_fitted("procrustes"), folder, overwrite=False)
    monkeypatch.undo()
    assert load_stitch(folder).architecture == "affine"  # the other writer's stitch stays
    assert [p.name for p in tmp_path.iterdir()] == ["stitch"]


def test_save_refuses_to_replace_something_that_is_not_a_stitch(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidInputError, match="refusing"):
        save_stitch(_fitted("ridge"), folder)
    assert (folder / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInputError):
        save_stitch(_fitted("ridge"), tmp_path / "file")
    # a stitch folder with a user's files beside it: `lead fit --force` deleted them
    stitch_dir = save_stitch(_fitted("ridge"), tmp_path / "stitch")
    (stitch_dir / "notes.txt").write_text("keep me too")
    with pytest.raises(InvalidInputError, match=r"holding only config\.json"):
        save_stitch(_fitted("ridge"), stitch_dir)
    assert (stitch_dir / "notes.txt").read_text() == "keep me too"


def test_a_format_version_of_true_is_not_version_1(saved: Path) -> None:
    _edit_config(saved, format_version=True)  # True == 1 in Python: it loaded
    with pytest.raises(StitchFormatError, match="unsupported format_version True"):
        load_stitch(saved)


def test_load_moves_to_dtype(saved: Path) -> None:
    stitch = load_stitch(saved, device="cpu", dtype=torch.float64)
    assert stitch.weight.dtype == torch.float64
    assert stitch(torch.randn(2, 5, dtype=torch.float64)).dtype == torch.float64


# --- strict loading ------------------------------------------------------------------------


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            config[section][field] = value
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def _edit_tensors(folder: Path, change: Any) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def test_missing_folder_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(StitchNotFoundError):
        load_stitch(tmp_path / "nope")
    with pytest.raises(StitchNotFoundError):
        read_stitch_config(tmp_path / "nope")


def test_unknown_architecture(saved: Path) -> None:
    _edit_config(saved, architecture="transformer")
    with pytest.raises(UnknownArchitectureError, match="transformer"):
        load_stitch(saved)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "other"}, "lead-stitch"),
        ({"format_version": 2}, "format_version"),
        ({"weight_orientation": "(d_src, d_tgt)"}, "weight_orientation"),
        ({"weight_orientation": None}, "weight_orientation"),
        ({"source__dim": 0}, "source.dim"),
        ({"target__dim": "3"}, "target.dim"),
        ({"source": None}, "source"),
        # values a served stitch shows as they are (a string scorecard made GET
        # /v1/stitches answer 500 for every stitch)
        ({"scorecard": "hello"}, "scorecard must be an object or null"),
        ({"fit": [1, 2]}, "fit must be an object or null"),
        ({"source__revision": 123}, "source.revision must be a string or null"),
        ({"target__normalized": "no"}, "target.normalized must be true or false"),
        ({"normalize_output": 1}, "normalize_output must be true or false"),
        # shown by the card and GET /v1/stitches as the storage dtype (a user trial)
        ({"dtype": "int8"}, "dtype must be one of float32, float16, bfloat16, got 'int8'"),
        ({"dtype": 16}, "dtype must be one of"),
    ],
)
def test_bad_config_is_a_format_error(saved: Path, changes: dict[str, Any], message: str) -> None:
    _edit_config(saved, **changes)
    with pytest.raises(StitchFormatError, match=message):
        load_stitch(saved)


def test_dimension_that_disagrees_with_the_tensors(saved: Path) -> None:
    _edit_config(saved, source__dim=4, tensors=None)
    with pytest.raises(StitchFormatError, match=r"'source_mean' has shape \[5\], expected \[4\]"):
        load_stitch(saved)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.update(weight=torch.zeros(5, 3)), "tensor 'weight' has shape"),
        (lambda t: t.pop("target_mean"), "tensor 'target_mean' is missing"),
        (lambda t: t.update(bias=torch.zeros(3)), "unexpected tensor 'bias'"),
        (lambda t: t.update(weight=torch.full((3, 5), float("nan"))), "'weight' must be finite"),
    ],
)
def test_bad_tensors_are_format_errors(saved: Path, change: Any, message: str) -> None:
    _edit_tensors(saved, change)
    with pytest.raises(StitchFormatError, match=message):
        load_stitch(saved)


def test_declared_dimensions_are_checked_before_memory_is_taken(saved: Path) -> None:
    # an affine stitch of 200,000 x 200,000 would need 160 GB: built first, it failed to
    # allocate (or took the memory) before its 5-d weights were even read
    _edit_config(saved, source__dim=200_000, target__dim=200_000, tensors=None)
    with pytest.raises(
        StitchFormatError, match=r"'source_mean' has shape \[5\], expected \[200000\]"
    ):
        load_stitch(saved)
    # 2**31 overflowed torch's size calculation: a RuntimeError, a traceback in the CLI
    _edit_config(saved, source__dim=2**31, target__dim=2**31, tensors=None)
    with pytest.raises(StitchFormatError, match="of dimensions 2147483648 -> 2147483648"):
        load_stitch(saved)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_files_that_are_not_regular_files_are_refused_without_blocking(saved: Path) -> None:
    # opening a FIFO for reading waits for a writer: the loader hung, and every stitch after
    # it stayed pending
    (saved / "config.json").unlink()
    os.mkfifo(saved / "config.json")
    with pytest.raises(StitchFormatError, match="not a regular file"):
        load_stitch(saved)


def test_layer_counts_and_parameter_kinds_are_checked(tmp_path: Path) -> None:
    # a depth of 10**8 built modules for minutes and gigabytes before any check
    folder = save_stitch(_mlp(), tmp_path / "mlp")
    for changes, message in (
        ({"depth": 10**8}, "depth in"),
        ({"depth": True}, "depth must be a number"),
        ({"hidden_dim": "8"}, "hidden_dim must be a number"),
        # a torch message ("empty(): argument 'size' ... found element of type float")
        ({"hidden_dim": 16.5}, "cannot build a mlp stitch: hidden_dim must be a positive integer"),
    ):
        original = (folder / "config.json").read_text()
        _edit_config(folder, **changes)
        with pytest.raises(StitchFormatError, match=message):
            load_stitch(folder)
        (folder / "config.json").write_text(original)
    orthogonal = save_stitch(_fitted("procrustes", scaling=True), tmp_path / "orthogonal")
    _edit_config(orthogonal, scaling="false")  # loaded as true
    with pytest.raises(StitchFormatError, match="scaling must be true or false"):
        load_stitch(orthogonal)


def test_a_huge_config_is_refused_unread(saved: Path) -> None:
    with open(saved / "config.json", "r+b") as config:
        config.truncate(64 << 20)  # sparse: no disk, but read whole it took the memory
    with pytest.raises(StitchFormatError, match="a stitch config holds at most"):
        load_stitch(saved)


def test_a_deeply_nested_config_is_a_format_error(saved: Path) -> None:
    """json's parser recurses once per level: RecursionError escaped (a traceback from the
    CLI, a failed stitch with a logged traceback in the service)."""
    (saved / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StitchFormatError, match="nested too deeply"):
        load_stitch(saved)
    assert not is_replaceable(saved)


def test_tensors_declared_in_config_must_match(saved: Path) -> None:
    _edit_config(saved, tensors={"weight": [3, 5], "source_mean": [5]})
    with pytest.raises(StitchFormatError, match="'target_mean' is missing"):
        load_stitch(saved)


def test_missing_or_corrupt_files_are_format_errors(saved: Path) -> None:
    (saved / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(StitchFormatError, match="cannot read"):
        load_stitch(saved)
    (saved / "model.safetensors").unlink()
    with pytest.raises(StitchFormatError, match=r"model\.safetensors"):
        load_stitch(saved)
    (saved / "config.json").write_text("{")
    with pytest.raises(StitchFormatError):
        load_stitch(saved)
    (saved / "config.json").unlink()
    with pytest.raises(StitchFormatError, match=r"config\.json"):
        load_stitch(saved)


def test_bad_architecture_parameters(tmp_path: Path) -> None:
    folder = save_stitch(_mlp(), tmp_path / "mlp")
    _edit_config(folder, hidden_dim=0)
    with pytest.raises(StitchFormatError, match="cannot build"):
        load_stitch(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_dim"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(StitchFormatError, match="hidden_dim"):
        load_stitch(folder)


# --- Hugging Face Hub ----------------------------------------------------------------------


def _cache_repo(
    cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...]
) -> None:
    """Lay a stitch out as huggingface_hub's cache does: blobs, snapshot symlinks, refs."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name in ARTIFACT_FILES:
        data = (folder / name).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved: Path) -> Path:
    cache = tmp_path / "hf-cache"
    _cache_repo(cache, "lead-org/toy-stitch", saved, COMMIT, ("main", "v1"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize(
    ("spec", "revision"),
    [
        ("lead-org/toy-stitch", None),
        ("lead-org/toy-stitch@v1", None),
        (f"lead-org/toy-stitch@{COMMIT}", None),
        ("lead-org/toy-stitch", "main"),
    ],
)
def test_load_from_the_hub_cache_offline(
    offline_cache: Path, saved: Path, spec: str, revision: str | None
) -> None:
    stitch = load_stitch(spec, revision=revision)
    local = load_stitch(saved)
    for name, tensor in local.state_dict().items():
        assert torch.equal(tensor, stitch.state_dict()[name])
    assert stitch.info == local.info


def test_offline_hub_miss_is_not_found(offline_cache: Path) -> None:
    with pytest.raises(StitchNotFoundError, match="HF_HUB_OFFLINE"):
        load_stitch("lead-org/other-stitch")
    with pytest.raises(StitchNotFoundError):
        load_stitch("lead-org/toy-stitch@v2")


def test_a_misspelt_folder_path_is_named_as_a_folder_not_a_hub_error(
    offline_cache: Path, saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``models/minilm-to-mpnett`` has a Hub id's form: a new user's typo in LEAD_STITCHES
    was reported as the Hub's network error."""
    monkeypatch.chdir(saved.parent)
    misspelt = f"{saved.name}/no-such-stitch"  # the folder exists, not the stitch in it
    with pytest.raises(StitchNotFoundError) as caught:
        load_stitch(misspelt)
    message = caught.value.message
    assert message.startswith(f"no stitch folder {misspelt!r}: the folder {saved.name} has")
    assert "HF_HUB_OFFLINE" in message  # and why the Hub did not have it either
    with pytest.raises(StitchNotFoundError, match="HF_HUB_OFFLINE") as caught:
        load_stitch("lead-org/other-stitch")  # no such local folder: the Hub's error as it is
    assert "no stitch folder" not in caught.value.message
    monkeypatch.chdir(saved.parent.parent)  # a folder that is there, pinned as a Hub id is
    with pytest.raises(StitchNotFoundError) as caught:
        load_stitch(f"{saved.parent.name}/{saved.name}@main")
    assert "has no" not in caught.value.message  # it said "the folder ... has no 'stitch'"


def test_revision_must_agree_with_the_id(offline_cache: Path) -> None:
    with pytest.raises(InvalidInputError, match="disagrees"):
        load_stitch("lead-org/toy-stitch@v1", revision="main")
    # "org/name@" downloaded main (an adversarial pass)
    for spec in ("lead-org/toy-stitch@", "lead-org/toy-stitch@ "):
        with pytest.raises(InvalidInputError, match="names no revision after '@'"):
            load_stitch(spec)


def test_not_a_folder_nor_a_repo_id(tmp_path: Path) -> None:
    with pytest.raises(StitchNotFoundError):
        load_stitch("a/b/c")
    with pytest.raises(StitchNotFoundError) as caught:
        load_stitch("just-a-name")
    assert "(bundled: e5-to-minilm, minilm-to-e5, minilm-to-mpnet," in caught.value.message


def test_a_bundled_id_loads_as_the_cli_and_migrations_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lead translate minilm-to-mpnet`` and ``migrate.apply(..., "minilm-to-mpnet")``
    worked, ``lead.load_stitch("minilm-to-mpnet")`` was not found (a new user's trial)."""
    monkeypatch.chdir(tmp_path)  # not where models/ is
    stitch = load_stitch("minilm-to-mpnet")
    assert stitch.info.target_model == "sentence-transformers/all-mpnet-base-v2"
    assert stitch_folder("minilm-to-mpnet") == BUNDLED_MODELS_DIR / "minilm-to-mpnet"
    (tmp_path / "minilm-to-mpnet").mkdir()  # a local folder of that name comes first
    assert stitch_folder("minilm-to-mpnet") == Path("minilm-to-mpnet")


def test_hub_failures_are_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(*args: Any, **kwargs: Any) -> str:
        # huggingface_hub's own message spans lines; the CLI prints one
        raise hf_errors.LocalEntryNotFoundError("connection refused\nAn error happened")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(HubError, match="connection refused An error happened") as caught:
        load_stitch("lead-org/toy-stitch")
    assert "\n" not in caught.value.message


def test_push_stitch_uploads_the_three_files(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, Any] = {}

    class FakeApi:
        def __init__(self, token: str | None = None) -> None:
            calls["token"] = token

        def create_repo(self, repo_id: str, **kwargs: Any) -> None:
            calls["repo"] = repo_id

        def create_branch(self, repo_id: str, *, branch: str, **kwargs: Any) -> None:
            calls["branch"] = branch

        def upload_folder(self, **kwargs: Any) -> Any:
            calls["upload"] = kwargs
            return type("Commit", (), {"oid": "f" * 40})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert (
        push_stitch(saved, "lead-org/toy", token="t", revision="dev") == "lead-org/toy@" + "f" * 40
    )
    assert calls["token"] == "t" and calls["branch"] == "dev"
    assert calls["upload"]["allow_patterns"] == list(ARTIFACT_FILES)
    assert calls["upload"]["folder_path"] == str(saved)


def test_push_refuses_an_invalid_folder(tmp_path: Path) -> None:
    with pytest.raises(StitchNotFoundError):
        push_stitch(tmp_path / "nope", "lead-org/toy")


@pytest.mark.network
def test_push_and_load_on_the_live_hub(saved: Path) -> None:
    repo = os.environ.get("LEAD_TEST_HUB_REPO")
    if not repo or not os.environ.get("HF_TOKEN"):
        pytest.skip("set LEAD_TEST_HUB_REPO and HF_TOKEN to test against the live Hub")
    stitch_id = push_stitch(saved, repo)
    loaded = load_stitch(stitch_id)
    assert torch.equal(loaded.weight, load_stitch(saved).weight)


def test_float16_storage_loads_the_rounded_values(tmp_path: Path) -> None:
    stitch = _fitted("ridge")
    save_stitch(stitch, tmp_path / "half", dtype="float16")
    loaded = load_stitch(tmp_path / "half")
    assert read_stitch_config(tmp_path / "half")["dtype"] == "float16"
    for name, value in stitch.state_dict().items():
        stored = loaded.state_dict()[name]
        assert stored.dtype == torch.float32
        assert torch.equal(stored, value.half().float()), name
    stored_dtypes = {
        t.dtype for t in load_file(str(tmp_path / "half" / "model.safetensors")).values()
    }
    assert stored_dtypes == {torch.float16}


def test_save_rejects_an_unknown_storage_dtype(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="dtype"):
        save_stitch(_fitted("ridge"), tmp_path / "x", dtype="int8")
    assert not (tmp_path / "x").exists()


def test_a_full_disk_while_saving_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors reports ENOSPC as text in a SafetensorError, which the service mapped to
    500 and ``lead fit`` printed as a traceback."""
    from safetensors import SafetensorError

    from lead.errors import StorageFullError

    def full(*args: Any, **kwargs: Any) -> None:
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(lead.artifacts, "save_file", full)
    with pytest.raises(StorageFullError, match="no space left"):
        save_stitch(_fitted("ridge"), tmp_path / "stitch")
    assert list(tmp_path.iterdir()) == []  # no temporary folder left


@pytest.mark.parametrize(("scale", "says"), [(1e7, "beyond float16's largest"), (1e-9, "100.0%")])
def test_a_stitch_its_storage_dtype_cannot_hold_is_not_saved(
    tmp_path: Path, scale: float, says: str
) -> None:
    """Targets at 1e7 saved as float16 did not load back (infinity); at 1e-9 every weight
    was stored as 0 and the stitch answered the mean (an adversarial pass)."""
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(60, 5)), rng.normal(size=(60, 3))
    stitch = fit_stitch(X, Y * scale, "ridge")
    with pytest.raises(InvalidInputError, match=says) as caught:
        save_stitch(stitch, tmp_path / "half", dtype="float16")
    assert "save in float32" in caught.value.message
    assert not (tmp_path / "half").exists()
    assert load_stitch(save_stitch(stitch, tmp_path / "full")).info == stitch.info  # float32
    # centred data: its means (~1e-17) round to 0 in float16 and change nothing (refused,
    # as 100 % of their size, by a first version of the check)
    X, Y = X - X.mean(axis=0), Y - Y.mean(axis=0)
    save_stitch(fit_stitch(X, Y, "ridge"), tmp_path / "centred", dtype="float16")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("source_model", 5),
        ("target_model", None),
        ("target_model", " "),
        ("source_normalized", 1),
        ("target_revision", 2),
        ("fit", []),
        ("scorecard", "good"),
    ],
)
def test_stitch_info_refuses_what_config_json_could_not_load_back(field: str, value: Any) -> None:
    """A saved stitch whose model was 5 could only fail at load_stitch (found by an
    adversarial pass): StitchInfo itself refuses it, before anything is fitted or saved."""
    with pytest.raises(InvalidInputError, match=f"StitchInfo.{field} must be") as refused:
        StitchInfo(**{field: value})
    assert refused.value.param == field
