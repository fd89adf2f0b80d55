"""fit_unsupervised: rotations recovered from shuffled rows, real unpaired embeddings."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import lead.unsupervised as lu
from lead.artifacts import load_stitch, save_stitch
from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError, TooFewPairsError
from lead.metrics import top1_accuracy_score
from lead.stitches import OrthogonalStitch
from lead.unsupervised import fit_unsupervised

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: small, fast settings for synthetic clouds (a few hundred points in a few dimensions)
FAST = {"epsilon": 0.01, "rounds": 10, "neighbours": 10}


def _predict(stitch: torch.nn.Module, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return stitch(torch.from_numpy(X).float()).double().numpy()


def _orthonormal(rows: int, cols: int, seed: int) -> np.ndarray:
    """A (rows, cols) matrix with orthonormal columns (rows >= cols) or rows."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(max(rows, cols),) * 2))
    return q[:rows, :cols]


def _cloud(n: int, d: int, seed: int) -> np.ndarray:
    """Points around 6 fixed random centres: a lopsided cloud without mirror symmetries.

    (A symmetric cloud, such as one Gaussian, looks the same after a reflection, so no
    method can tell the true map from a reflected one without pairs.)
    """
    centres = np.random.default_rng(1000 + d).normal(scale=3.0, size=(6, d))
    rng = np.random.default_rng(seed)
    return centres[rng.integers(0, 6, n)] + rng.normal(size=(n, d))


def test_doctests() -> None:
    result = doctest.testmod(lu)
    assert result.failed == 0 and result.attempted > 0


def test_recovers_a_rotation_from_shuffled_noisy_rows() -> None:
    X = _cloud(200, 8, seed=0)
    Q = _orthonormal(8, 8, seed=1)
    noise = np.random.default_rng(2).normal(scale=0.02, size=(200, 8))
    Y = (X @ Q.T + noise)[np.random.default_rng(3).permutation(200)]
    stitch = fit_unsupervised(X, Y, **FAST)
    assert isinstance(stitch, OrthogonalStitch)
    np.testing.assert_allclose(stitch.weight.numpy(), Q, atol=0.05)
    X_new = _cloud(100, 8, seed=4)
    assert top1_accuracy_score(_predict(stitch, X_new), X_new @ Q.T) > 0.9


@pytest.mark.parametrize(("d_src", "d_tgt"), [(5, 9), (9, 5)])
def test_different_dimensions_and_row_counts(d_src: int, d_tgt: int) -> None:
    # both sides hold the same 5-dimensional cloud; the wider one embeds it isometrically
    Z = _cloud(220, 5, seed=5)
    X = Z @ _orthonormal(d_src, 5, seed=6).T
    Y = Z @ _orthonormal(d_tgt, 5, seed=7).T
    Y = Y[np.random.default_rng(8).permutation(220)[:180]]  # fewer rows, shuffled
    stitch = fit_unsupervised(X, Y, **FAST)
    assert (stitch.d_src, stitch.d_tgt) == (d_src, d_tgt)
    assert tuple(stitch.weight.shape) == (d_tgt, d_src)
    assert stitch.info.fit["unpaired_rows"] == [220, 180]
    Z_new = _cloud(100, 5, seed=9)
    X_new = Z_new @ _orthonormal(d_src, 5, seed=6).T
    Y_new = Z_new @ _orthonormal(d_tgt, 5, seed=7).T
    assert top1_accuracy_score(_predict(stitch, X_new), Y_new) > 0.9


def test_real_unpaired_documents_far_above_chance(scifact_small: Any) -> None:
    # minilm -> paraphrase-MiniLM-L3 on the 400 fixture documents, pml3 rows shuffled
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    shuffled = Y[np.random.default_rng(0).permutation(len(Y))]
    stitch = fit_unsupervised(X, shuffled, sample_size=400, rounds=20)
    top1 = top1_accuracy_score(_predict(stitch, X), Y)
    assert top1 > 0.5, stitch.info.fit  # chance is 1 / 400; measured 0.9 or more
    fit = json.loads(json.dumps(stitch.info.fit))
    assert fit["unpaired_rows"] == [400, 400] and fit["sample_size"] == 400
    assert fit["rounds"] == 20 and len(fit["neighbours_per_round"]) == 20
    assert 4 <= fit["gw_matched_pairs"] <= 400 and fit["matched_pairs"] > 200
    assert fit["seconds"] >= fit["gw_seconds"] > 0


def test_deterministic_given_the_seed() -> None:
    X = _cloud(300, 6, seed=10)
    Y = (X @ _orthonormal(6, 6, seed=11).T)[::-1].copy()
    options = {**FAST, "sample_size": 60, "refine_size": 200}
    first = fit_unsupervised(X, Y, seed=3, **options)
    second = fit_unsupervised(X, Y, seed=3, **options)
    assert torch.equal(first.weight, second.weight) and torch.equal(first.scale, second.scale)
    assert first.info.fit["seed"] == 3
    other = fit_unsupervised(X, Y, seed=4, **options)
    assert not torch.equal(first.weight, other.weight)  # the seed picks the samples


def test_save_load_round_trip(tmp_path: Path) -> None:
    X = _cloud(60, 4, seed=12)
    stitch = fit_unsupervised(X, X[::-1].copy(), **FAST)
    loaded = load_stitch(save_stitch(stitch, tmp_path / "unsupervised"))
    x = torch.from_numpy(X[:5]).float()
    assert torch.equal(loaded(x), stitch(x))
    assert loaded.info.fit == json.loads(json.dumps(stitch.info.fit))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("sample_size", 7),
        ("sample_size", 100.0),
        ("sample_size", True),
        ("epsilon", 0.0),
        ("epsilon", -0.01),
        ("epsilon", math.nan),
        ("epsilon", None),
        ("gw_max_iter", 0),
        ("rounds", -1),
        ("rounds", None),
        ("neighbours", 0),
        ("neighbours", 2.5),
        ("refine_size", 4),
        ("refine_size", "100"),
        ("seed", -1),
        ("seed", False),
    ],
)
def test_bad_options_name_the_option(option: str, value: Any) -> None:
    X = _cloud(20, 3, seed=13)
    with pytest.raises(InvalidInputError) as info:
        fit_unsupervised(X, X, **{option: value})
    assert info.value.param == option


def test_bad_inputs() -> None:
    X = _cloud(20, 3, seed=14)
    with pytest.raises(TooFewPairsError) as info:
        fit_unsupervised(X, X[:7])
    assert info.value.param == "Y" and info.value.minimum == 8
    with pytest.raises(TooFewPairsError) as info:
        fit_unsupervised(X[:5], X)
    assert info.value.param == "X"
    with pytest.raises(ShapeMismatchError):
        fit_unsupervised(X[:, 0], X)
    bad = X.copy()
    bad[3, 2] = np.inf
    with pytest.raises(NonFiniteError):
        fit_unsupervised(X, bad)


def test_progress_reports_every_round_and_can_stop_the_fit() -> None:
    from lead.errors import JobCancelledError

    X = _cloud(200, 6, seed=20)
    Y = (X @ _orthonormal(6, 6, seed=21).T)[::-1].copy()
    stages: list[tuple[str, int, int]] = []
    fit_unsupervised(X, Y, sample_size=60, rounds=3, progress=lambda *s: stages.append(s))
    # before each round, and once done (a bar then ends full)
    refine = [("refine", step, 3) for step in range(4)]
    assert stages == [("match", 0, 1), *refine]

    def cancel(stage: str, step: int, total: int) -> None:
        if stage == "refine":
            raise JobCancelledError("cancelled")

    with pytest.raises(JobCancelledError):
        fit_unsupervised(X, Y, sample_size=60, rounds=3, progress=cancel)
