"""The local stitch: a weighted global map plus the nearest training pairs' residuals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lead._apply import apply_stitch
from lead.artifacts import load_stitch, save_stitch
from lead.batch_invariance import forward_batch_invariant
from lead.errors import InvalidInputError, ShapeMismatchError, StitchFormatError
from lead.fitting import fit_stitch
from lead.local import fit_local
from lead.stitches import LocalStitch, StitchInfo

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _cosines(stitch: Any, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    pred = apply_stitch(stitch, torch.from_numpy(X)).numpy()
    return np.sum(_unit(pred) * _unit(Y), axis=1)


def test_an_exact_rotation_leaves_nothing_to_correct() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6))
    Q = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    stitch = fit_local(X, X @ Q.T + 3.0, k=5)
    assert stitch.memory == 200 and stitch.k == 5
    assert float(stitch.values.abs().max()) < 1e-4  # no residual in memory
    with torch.no_grad():
        out = stitch(torch.from_numpy(X[:20]).float()).double().numpy()
    np.testing.assert_allclose(out, X[:20] @ Q.T + 3.0, atol=1e-4)


def test_the_memory_corrects_what_the_global_map_cannot(scifact_small: Any) -> None:
    """Real MiniLM -> mpnet document vectors: on held-out documents the local stitch is
    closer to the native vectors than its own global map (strength 0) and than Procrustes."""
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    train, test = np.arange(300), np.arange(300, 400)
    local = fit_stitch(X[train], Y[train], "local")
    global_only = fit_stitch(X[train], Y[train], "local", strength=0.0)
    procrustes = fit_stitch(X[train], Y[train], "procrustes")
    local_cos = _cosines(local, X[test], Y[test]).mean()
    assert local_cos > _cosines(global_only, X[test], Y[test]).mean() + 0.005
    assert local_cos > _cosines(procrustes, X[test], Y[test]).mean()


def test_weights_shape_the_global_map_and_zero_weight_rows_stay_out() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 5))
    Q = np.linalg.qr(rng.normal(size=(5, 5)))[0]
    Y = X @ Q.T
    Y[200:] = rng.normal(size=(100, 5))  # rows that contradict the map
    w = np.r_[np.ones(200), np.zeros(100)]
    stitch = fit_stitch(X, Y, "local", sample_weight=w, strength=0.0)
    assert stitch.memory == 200
    np.testing.assert_allclose(stitch.weight.double().numpy(), Q, atol=1e-4)
    unweighted = fit_stitch(X, Y, "local", strength=0.0)
    assert np.abs(unweighted.weight.double().numpy() - Q).max() > 0.05


def test_an_input_far_from_the_memory_keeps_the_global_answer() -> None:
    rng = np.random.default_rng(2)
    X = np.abs(rng.normal(size=(100, 8)))  # all in the positive orthant
    Y = X @ rng.normal(size=(8, 8)) + rng.normal(size=(100, 8))
    stitch = fit_local(X, Y, k=5)
    far = -np.abs(rng.normal(size=(4, 8)))  # cosine < 0 to every memory row
    with torch.no_grad():
        corrected = stitch(torch.from_numpy(far).float())
        stitch.strength = 0.0
        plain = stitch(torch.from_numpy(far).float())
    assert float((corrected - plain).abs().max()) < 1e-6


def test_rows_are_batch_invariant_and_survive_save_and_load(
    scifact_small: Any, tmp_path: Path
) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    info = StitchInfo(source_model="a", target_model="b")
    stitch = fit_stitch(X[:300], Y[:300], "local", info=info, k=7, max_memory=250)
    assert stitch.memory == 250
    save_stitch(stitch, tmp_path / "s")
    loaded = load_stitch(tmp_path / "s")
    assert isinstance(loaded, LocalStitch)
    assert (loaded.memory, loaded.k, loaded.sink) == (250, 7, stitch.sink)
    x = torch.from_numpy(scifact_small.queries["minilm"][:37])
    with torch.inference_mode():
        whole = forward_batch_invariant(loaded, x)
        alone = torch.cat([forward_batch_invariant(loaded, x[i : i + 1]) for i in range(37)])
        assert torch.equal(whole, alone)
        assert torch.equal(whole, forward_batch_invariant(stitch, x))


@pytest.mark.parametrize(("temperature", "sink"), [(1e-3, 0.6), (0.05, 100.0)])
def test_far_inputs_stay_finite_whatever_the_temperature_and_sink(
    temperature: float, sink: float
) -> None:
    """Every exponential of the softmax underflowed to 0 for an input far from the memory
    with a small temperature (0 / 0: NaN at serve time, for a stitch that fitted), and a
    sink far above 1 overflowed ``math.exp`` (the fit failed with 'math range error')."""
    rng = np.random.default_rng(5)
    X = np.abs(rng.normal(size=(100, 8)))
    Y = X @ rng.normal(size=(8, 8)) + rng.normal(size=(100, 8))
    stitch = fit_stitch(X, Y, "local", k=5, temperature=temperature, sink=sink)
    far = torch.from_numpy(-np.abs(rng.normal(size=(4, 8)))).float()
    with torch.no_grad():
        corrected = stitch(far)
        stitch.strength = 0.0
        plain = stitch(far)
    assert bool(torch.isfinite(corrected).all())
    assert float((corrected - plain).abs().max()) < 1e-6


def test_a_stitch_file_with_bad_local_settings_is_refused(
    scifact_small: Any, tmp_path: Path
) -> None:
    X, Y = scifact_small.corpus["minilm"][:60], scifact_small.corpus["mpnet"][:60]
    info = StitchInfo(source_model="a", target_model="b")
    save_stitch(fit_stitch(X, Y, "local", info=info, k=5), tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    build = "cannot build a local stitch"
    for key, value, message in (
        ("k", 2.5, build),
        ("sink", float("inf"), "Infinity is not JSON"),  # json.dumps writes Infinity
        ("sink", 1e300, build),
        ("temperature", 1e-300, build),
    ):
        (tmp_path / "s" / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(StitchFormatError, match=message):
            load_stitch(tmp_path / "s")


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"k": 0}, "k"),
        ({"temperature": 1e-7}, "temperature"),
        ({"k": 10, "max_memory": 5}, "k"),
        ({"temperature": 10**400}, "temperature"),  # float() raised OverflowError in the fit
        ({"sink": 10**400}, "sink"),
        ({"alpha": 10**400}, "alpha"),
        ({"k": 1.5}, "k"),
        ({"k": 500}, "k"),
        ({"base": "mlp"}, "base"),
        ({"temperature": 0}, "temperature"),
        ({"strength": float("nan")}, "strength"),
        ({"max_memory": 0}, "max_memory"),
        ({"memory": 3}, "memory"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], param: str) -> None:
    X = np.random.default_rng(3).normal(size=(40, 4))
    with pytest.raises(InvalidInputError) as caught:
        fit_stitch(X, X, "local", **options)
    assert caught.value.param == param


def test_bad_sample_weights_are_refused() -> None:
    X = np.random.default_rng(4).normal(size=(40, 4))
    with pytest.raises(ShapeMismatchError):
        fit_stitch(X, X, "local", sample_weight=np.ones(39))
    for bad in (np.r_[-1.0, np.ones(39)], np.zeros(40), np.r_[np.nan, np.ones(39)]):
        with pytest.raises(InvalidInputError) as caught:
            fit_stitch(X, X, "local", sample_weight=bad)
        assert caught.value.param == "sample_weight"
    with pytest.raises(InvalidInputError, match="methods local and gated only"):
        fit_stitch(X, X, "ridge", sample_weight=np.ones(40))
