"""Known answers, invariances, degenerate inputs and errors of ``lead.metrics``."""

from __future__ import annotations

import doctest
import math
import time
from typing import Any

import numpy as np
import pytest
import torch

import lead._metric_inputs as lm
import lead.metrics
import lead.similarity
from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError, TooFewPairsError
from lead.metrics import (
    linear_cka_score,
    mean_cosine_similarity,
    mean_rank_error,
    mean_squared_error,
    mutual_knn_score,
    r2_score,
    top1_accuracy_score,
)


def _random(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def _rotation(d: int, seed: int = 1) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


# Every metric as f(a, b) for the shared error and no-NaN checks.
PAIRED = {
    "mean_squared_error": mean_squared_error,
    "r2_score": lambda a, b: r2_score(a, b, reference_mean=np.zeros(np.shape(a)[-1])),
    "mean_cosine_similarity": mean_cosine_similarity,
    "top1_accuracy_score": top1_accuracy_score,
    "mean_rank_error": mean_rank_error,
    "mutual_knn_score": lambda a, b: mutual_knn_score(a, b, k=2),
    "linear_cka_score": linear_cka_score,
}


@pytest.mark.parametrize("module", [lead.metrics, lead.similarity])
def test_doctests(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


def test_mean_squared_error_by_hand() -> None:
    Y = np.zeros((4, 2))
    P = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [1.0, 1.0]])
    assert mean_squared_error(Y, P) == pytest.approx((1 + 4 + 0 + 2) / 8)
    assert mean_squared_error(Y, Y) == 0.0


def test_r2_perfect_prediction_is_one() -> None:
    Y = _random(50, 6)
    assert r2_score(Y, Y, reference_mean=Y[:10].mean(axis=0)) == 1.0


def test_r2_of_training_mean_prediction_is_zero() -> None:
    train, test = _random(200, 8, seed=0), _random(50, 8, seed=1) + 0.3
    mu = train.mean(axis=0)
    assert r2_score(test, np.tile(mu, (50, 1)), reference_mean=mu) == pytest.approx(0.0, abs=1e-12)
    # Predicting the held-out mean beats the training mean a little, never by much.
    held = r2_score(test, np.tile(test.mean(axis=0), (50, 1)), reference_mean=mu)
    assert 0.0 < held < 0.2


def test_r2_is_pooled_over_dimensions() -> None:
    Y = np.array([[0.0, 0.0], [2.0, 20.0], [4.0, 40.0], [6.0, 60.0]])
    P = Y.copy()
    P[:, 0] = 3.0  # the low-variance dimension is predicted by its mean only
    mu = Y.mean(axis=0)
    variance = ((Y - mu) ** 2).mean()
    assert r2_score(Y, P, reference_mean=mu) == pytest.approx(1 - ((Y - P) ** 2).mean() / variance)
    assert r2_score(Y, P, reference_mean=mu) > 0.98


def test_r2_can_be_negative_and_constant_targets_are_defined() -> None:
    Y = _random(20, 3)
    assert r2_score(Y, -Y, reference_mean=Y.mean(axis=0)) < 0
    const = np.ones((5, 3))
    assert r2_score(const, const, reference_mean=np.ones(3)) == 1.0
    assert r2_score(const, const + 1, reference_mean=np.ones(3)) == 0.0


def test_r2_reference_mean_shape_is_checked() -> None:
    Y = _random(6, 3)
    with pytest.raises(ShapeMismatchError) as info:
        r2_score(Y, Y, reference_mean=np.zeros(4))
    assert info.value.param == "reference_mean"
    with pytest.raises(NonFiniteError):
        r2_score(Y, Y, reference_mean=np.array([0.0, np.nan, 0.0]))


def test_mean_cosine_similarity() -> None:
    Y = _random(30, 5)
    assert mean_cosine_similarity(Y, 3.0 * Y) == pytest.approx(1.0)
    assert mean_cosine_similarity(Y, -Y) == pytest.approx(-1.0)
    P = Y.copy()
    P[0] = 0.0  # a zero row counts as cosine 0
    assert mean_cosine_similarity(Y, P) == pytest.approx(29 / 30)


def test_top1_and_mean_rank_of_identical_sets() -> None:
    Y = _random(100, 16)
    assert top1_accuracy_score(Y, Y) == 1.0
    assert mean_rank_error(Y, Y) == 1.0


def test_top1_and_mean_rank_by_hand() -> None:
    T = np.eye(4)
    # Rows 0, 1 hit; row 2 points at target 3 (own target ranks 2nd); row 3 points at 0.
    P = np.array(
        [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 0.5, 1.0], [1.0, 0, 0, 0.2]], dtype=np.float64
    )
    assert top1_accuracy_score(P, T) == 0.5
    # ranks: 1, 1, 2, 2 (row 3: target 0 is higher, targets 1 and 2 are lower)
    assert mean_rank_error(P, T) == pytest.approx(1.5)


def test_constant_prediction_scores_chance_level() -> None:
    n = 40
    T = _random(n, 8)
    const = np.tile(T.mean(axis=0) + 0.5, (n, 1))
    assert top1_accuracy_score(const, T) == pytest.approx(1 / n)
    assert mean_rank_error(const, T) == pytest.approx((n + 1) / 2)
    zeros = np.zeros((n, 8))  # every target ties: ties count as failure
    assert top1_accuracy_score(zeros, T) == 0.0
    assert mean_rank_error(zeros, T) == pytest.approx((n + 1) / 2)


def test_ranking_is_the_same_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    T = _random(60, 6, seed=3)
    P = T + 0.8 * _random(60, 6, seed=4)
    whole = (top1_accuracy_score(P, T), mean_rank_error(P, T), mutual_knn_score(P, T, k=5))
    monkeypatch.setattr(lm, "_BLOCK_ELEMENTS", 7 * 60)
    assert (top1_accuracy_score(P, T), mean_rank_error(P, T), mutual_knn_score(P, T, k=5)) == whole


def test_mutual_knn_identical_and_invariant_sets_score_one() -> None:
    A = _random(80, 12)
    assert mutual_knn_score(A, A) == 1.0
    assert mutual_knn_score(A, 2.5 * A @ _rotation(12)) == 1.0
    assert mutual_knn_score(A, A[:, :3] @ np.ones((3, 30))) < 1.0  # different dims are fine


def test_mutual_knn_of_unrelated_sets_is_near_chance() -> None:
    n, k = 400, 10
    score = mutual_knn_score(_random(n, 16, seed=5), _random(n, 16, seed=6), k=k)
    assert score < 5 * k / (n - 1)


def test_mutual_knn_by_hand() -> None:
    A = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    B = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]])
    # k = 1: A's nearest neighbours are 0↔1 and 2↔3, B's are 0↔2 and 1↔3: none agree.
    assert mutual_knn_score(A, B, k=1) == 0.0
    assert mutual_knn_score(A, A[:, [1, 0]], k=1) == 1.0


def test_mutual_knn_k_is_checked_and_constant_set_scores_zero() -> None:
    A = _random(10, 4)
    for k in (0, 10, 11):
        with pytest.raises(InvalidInputError):
            mutual_knn_score(A, A, k=k)
    assert mutual_knn_score(A, np.ones((10, 3)), k=3) == 0.0


def test_cka_self_rotation_scaling() -> None:
    A = _random(300, 20)
    assert linear_cka_score(A, A) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka_score(A, 7.0 * A @ _rotation(20)) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka_score(A, A + 3.0) == pytest.approx(1.0, abs=1e-12)  # centred


def test_cka_known_value_and_symmetry() -> None:
    A = _random(500, 2)
    # With near-identity covariance, CKA(A, A[:, :1]) ≈ s11² / (s11 · sqrt(s11² + s22²)) = 1/√2.
    assert linear_cka_score(A, A[:, :1]) == pytest.approx(1 / math.sqrt(2), abs=0.05)
    C = _random(500, 7, seed=9)
    assert linear_cka_score(A, C) == pytest.approx(linear_cka_score(C, A), abs=1e-12)


def test_cka_gram_and_feature_forms_agree() -> None:
    A, B = _random(12, 50, seed=1), _random(12, 40, seed=2)  # n < d: Gram form
    Ac, Bc = A - A.mean(0), B - B.mean(0)
    feature = np.linalg.norm(Bc.T @ Ac) ** 2 / (
        np.linalg.norm(Ac.T @ Ac) * np.linalg.norm(Bc.T @ Bc)
    )
    assert linear_cka_score(A, B) == pytest.approx(feature, rel=1e-10)


def test_cka_unrelated_is_small_and_constant_is_zero() -> None:
    assert linear_cka_score(_random(2000, 5, seed=1), _random(2000, 5, seed=2)) < 0.02
    assert linear_cka_score(_random(10, 3), np.full((10, 3), 2.0)) == 0.0


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_errors(name: str) -> None:
    f = PAIRED[name]
    good = _random(6, 3)
    bad = good.copy()
    bad[2, 1] = np.nan
    with pytest.raises(NonFiniteError):
        f(good, bad)
    bad[2, 1] = np.inf
    with pytest.raises(NonFiniteError):
        f(bad, good)
    with pytest.raises(TooFewPairsError) as few:
        f(good[:3], good[:3])
    assert few.value.minimum == 4 and few.value.got == 3
    with pytest.raises(ShapeMismatchError):
        f(good, good[:5])
    with pytest.raises(ShapeMismatchError):
        f(good[0], good[0])


@pytest.mark.parametrize(
    "name", ["mean_squared_error", "mean_cosine_similarity", "top1_accuracy_score"]
)
def test_column_mismatch_is_an_error(name: str) -> None:
    with pytest.raises(ShapeMismatchError):
        PAIRED[name](_random(6, 3), _random(6, 4))


@pytest.mark.parametrize("name", sorted(PAIRED))
def test_never_nan_on_degenerate_input(name: str) -> None:
    f = PAIRED[name]
    zeros, ones, data = np.zeros((6, 3)), np.ones((6, 3)), _random(6, 3)
    for a, b in [(zeros, zeros), (ones, ones), (zeros, data), (data, ones), (1e-300 * data, data)]:
        value = f(a, b)
        assert isinstance(value, float) and math.isfinite(value), (a, b, value)


@pytest.mark.parametrize("scale", [1e-300, 1e200])
def test_extreme_magnitudes_neither_overflow_nor_underflow(scale: float) -> None:
    A = _random(20, 4)
    B = A @ _rotation(4)
    assert mean_cosine_similarity(scale * A, A) == pytest.approx(1.0)
    assert r2_score(scale * A, scale * A, reference_mean=np.zeros(4)) == 1.0
    assert r2_score(scale * A, scale * B, reference_mean=scale * A.mean(0)) == pytest.approx(
        r2_score(A, B, reference_mean=A.mean(0))
    )
    assert linear_cka_score(scale * A, B) == pytest.approx(1.0)
    assert top1_accuracy_score(scale * A, A) == 1.0
    assert mutual_knn_score(scale * A, B, k=3) == 1.0


def test_torch_float32_inputs() -> None:
    Y = torch.randn(20, 5, generator=torch.Generator().manual_seed(0))
    assert mean_squared_error(Y, Y) == 0.0
    assert top1_accuracy_score(Y, Y.double()) == 1.0
    assert r2_score(Y, Y, reference_mean=Y.mean(dim=0)) == 1.0


def test_scoring_1000_pairs_of_768_dims_is_fast() -> None:
    rng = np.random.default_rng(0)
    T = torch.from_numpy(rng.normal(size=(1000, 768)))
    P = T + torch.from_numpy(rng.normal(size=(1000, 768)))
    mu = T.mean(dim=0)
    linear_cka_score(P[:50], T[:50])  # warm up the BLAS threads
    start = time.perf_counter()
    scores = [
        mean_squared_error(T, P),
        r2_score(T, P, reference_mean=mu),
        mean_cosine_similarity(T, P),
        top1_accuracy_score(P, T),
        mean_rank_error(P, T),
        mutual_knn_score(P, T),
        linear_cka_score(P, T),
    ]
    elapsed = time.perf_counter() - start
    assert all(math.isfinite(s) for s in scores)
    # About 0.35 s on 2 idle cores; the bound only catches an algorithmic regression (a
    # Python loop over pairs takes minutes) without failing on a busy machine.
    assert elapsed < 10.0, f"{elapsed:.2f} s"


def test_spearman_score_ranks_with_ties() -> None:
    from lead.metrics import spearman_score

    a = np.array([0.1, 0.4, 0.2, 0.9])
    assert spearman_score(a, a**3) == pytest.approx(1.0)
    assert spearman_score(a, -a) == pytest.approx(-1.0)
    assert spearman_score(a, np.ones(4)) == 0.0
    # ties get average ranks: [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    assert spearman_score([1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(
        0.9486833, abs=1e-6
    )


def test_spearman_score_refuses_what_it_cannot_rank() -> None:
    """Lengths 2 and 3 were a NumPy matmul error, and a NaN ranked as a value scored 1.0."""
    from lead.errors import NonFiniteError, ShapeMismatchError
    from lead.metrics import spearman_score

    with pytest.raises(ShapeMismatchError, match=r"got \(2,\) and \(3,\)"):
        spearman_score([1, 2], [1, 2, 3])
    with pytest.raises(ShapeMismatchError, match="1-D"):
        spearman_score(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(NonFiniteError):
        spearman_score([1, 2, float("nan")], [1, 2, 3])
    with pytest.raises(ShapeMismatchError, match="arrays of numbers"):
        spearman_score(["a", "b"], [1, 2])
