"""fit_anchors: the folded relative-representation decoder, known answers, real anchors."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import lead.anchors as la
from lead.anchors import fit_anchors
from lead.artifacts import load_stitch, save_stitch
from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError, TooFewPairsError
from lead.fitting import fit_ridge
from lead.metrics import top1_accuracy_score
from lead.stitches import AffineStitch

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _predict(stitch: torch.nn.Module, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return stitch(torch.from_numpy(X).float()).double().numpy()


def test_doctests() -> None:
    result = doctest.testmod(la)
    assert result.failed == 0 and result.attempted > 0


def test_recovers_an_affine_map_from_more_anchors_than_dimensions() -> None:
    rng = np.random.default_rng(0)
    M, b = rng.normal(size=(6, 4)), rng.normal(size=4)
    X = rng.normal(size=(40, 6))
    stitch = fit_anchors(X, X @ M + b, alpha=0.0)
    assert isinstance(stitch, AffineStitch) and stitch.weight.dtype == torch.float32
    X_new = rng.normal(size=(10, 6))
    np.testing.assert_allclose(_predict(stitch, X_new), X_new @ M + b, atol=1e-4)
    assert stitch.info.fit["anchors"] == 40 and stitch.info.fit["relative_rank"] == 6
    assert stitch.info.fit["anchor_r2"] == pytest.approx(1.0, abs=1e-9)


def test_the_stitch_equals_the_explicit_relative_representation_and_decoder() -> None:
    # the folded AffineStitch must equal: relative coordinates to the anchors, then the
    # ridge decoder fitted on the anchors' own coordinates (written out here directly)
    rng = np.random.default_rng(1)
    k, alpha = 12, 0.05
    X, Y = rng.normal(size=(k, 20)), rng.normal(size=(k, 7))
    mx, my = X.mean(axis=0), Y.mean(axis=0)
    A, B = X - mx, Y - my
    R = A @ A.T  # relative coordinates of the anchors, (k, k)
    G = R.T @ R / k
    s = np.trace(G) / k
    decoder_t = np.linalg.solve(G + alpha * s * np.eye(k), R.T @ B / k)
    X_new = rng.normal(size=(5, 20))
    expected = ((X_new - mx) @ A.T) @ decoder_t + my
    stitch = fit_anchors(X, Y, alpha=alpha)
    np.testing.assert_allclose(_predict(stitch, X_new), expected, rtol=1e-4, atol=1e-4)


def test_larger_alpha_shrinks_the_map() -> None:
    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(30, 10)), rng.normal(size=(30, 5))
    norms = [float(fit_anchors(X, Y, alpha=a).weight.norm()) for a in (0.0, 0.01, 1.0, 100.0)]
    assert norms == sorted(norms, reverse=True) and norms[-1] < 0.1 * norms[0]


def test_100_real_anchors_translate_far_above_chance_and_beat_ridge(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    order = np.random.default_rng(0).permutation(len(X))
    anchors, held_out = order[:100], order[100:]
    stitch = fit_anchors(X[anchors], Y[anchors])
    top1 = top1_accuracy_score(_predict(stitch, X[held_out]), Y[held_out])
    ridge = fit_ridge(X[anchors], Y[anchors])
    ridge_top1 = top1_accuracy_score(_predict(ridge, X[held_out]), Y[held_out])
    assert top1 > 100 / len(held_out)  # chance is 1 / 300
    assert top1 > ridge_top1  # ridge's alpha is chosen for squared error, not ranking
    json.dumps(stitch.info.fit)


def test_different_dimensions_on_real_anchors(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]  # 384 -> 768
    stitch = fit_anchors(X[:150], Y[:150])
    assert (stitch.d_src, stitch.d_tgt) == (384, 768)
    assert tuple(stitch.weight.shape) == (768, 384)
    assert top1_accuracy_score(_predict(stitch, X[150:]), Y[150:]) > 0.3  # chance 0.004


def test_deterministic_and_records_its_options() -> None:
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(20, 8)), rng.normal(size=(20, 8))
    first, second = fit_anchors(X, Y, seed=5), fit_anchors(X, Y, seed=5)
    assert torch.equal(first.weight, second.weight)
    assert first.info.fit["seed"] == 5 and first.info.fit["alpha"] == 0.01


def test_save_load_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    stitch = fit_anchors(rng.normal(size=(20, 6)), rng.normal(size=(20, 3)))
    loaded = load_stitch(save_stitch(stitch, tmp_path / "anchors"))
    x = torch.from_numpy(rng.normal(size=(4, 6))).float()
    assert torch.equal(loaded(x), stitch(x))
    assert loaded.info.fit == stitch.info.fit


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("alpha", -0.1),
        ("alpha", math.nan),
        ("alpha", math.inf),
        ("alpha", None),
        ("alpha", True),
        ("alpha", "0.1"),
        ("seed", -1),
        ("seed", 1.0),
        ("seed", True),
        ("seed", None),
    ],
)
def test_bad_options_name_the_option(option: str, value: Any) -> None:
    X = np.random.default_rng(5).normal(size=(10, 3))
    with pytest.raises(InvalidInputError) as info:
        fit_anchors(X, X, **{option: value})
    assert info.value.param == option


def test_bad_inputs() -> None:
    X = np.random.default_rng(6).normal(size=(10, 3))
    with pytest.raises(TooFewPairsError):
        fit_anchors(X[:3], X[:3])
    with pytest.raises(ShapeMismatchError):
        fit_anchors(X, X[:9])
    with pytest.raises(ShapeMismatchError):
        fit_anchors(X[:, 0], X)
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(NonFiniteError):
        fit_anchors(bad, X)
