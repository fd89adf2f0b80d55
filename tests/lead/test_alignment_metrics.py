"""Unbiased CKA, CKNNA, cycle k-NN, SVCCA and PWCCA of ``lead.metrics``.

Each score is checked against a direct numpy transcription of its reference definition
(full ``(n, n)`` matrices, covariance whitening by ``eigh``: other code paths than the
library's), on known values, invariances, degenerate sets, bad options and real embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import lead._metric_inputs as lm
from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError, TooFewPairsError
from lead.metrics import (
    cknna_score,
    cycle_knn_score,
    linear_cka_score,
    mutual_knn_score,
    pwcca_score,
    svcca_score,
    unbiased_cka_score,
)


def _random(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def _rotation(d: int, seed: int = 1) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


def _related(n: int, da: int, db: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two sets sharing a 3-dimensional latent, with their own noise: middling scores."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 3))
    a = z @ rng.normal(size=(3, da)) + 0.8 * rng.normal(size=(n, da)) + 2.0
    b = z @ rng.normal(size=(3, db)) + 0.8 * rng.normal(size=(n, db)) - 1.0
    return a, b


# ------------------------------------------------------------ reference transcriptions
def _hsic1(K: np.ndarray, L: np.ndarray) -> float:
    """Song et al. (2012) eq. 5, literally (as ``hsic_unbiased`` in platonic-rep)."""
    n = K.shape[0]
    Kt, Lt = K.copy(), L.copy()
    np.fill_diagonal(Kt, 0.0)
    np.fill_diagonal(Lt, 0.0)
    one = np.ones(n)
    value = (
        np.trace(Kt @ Lt)
        + (one @ Kt @ one) * (one @ Lt @ one) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * (one @ Kt @ Lt @ one)
    )
    return float(value / (n * (n - 3)))


def _reference_unbiased_cka(A: np.ndarray, B: np.ndarray) -> float:
    K, L = A @ A.T, B @ B.T  # uncentred, as in the reference
    return _hsic1(K, L) / math.sqrt(_hsic1(K, K) * _hsic1(L, L))


def _unit(A: np.ndarray) -> np.ndarray:
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def _reference_knn(A: np.ndarray, k: int) -> np.ndarray:
    S = _unit(A) @ _unit(A).T
    np.fill_diagonal(S, -np.inf)
    return np.argsort(-S, axis=1, kind="stable")[:, :k]


def _mask(knn: np.ndarray) -> np.ndarray:
    n = knn.shape[0]
    m = np.zeros((n, n))
    m[np.arange(n)[:, None], knn] = 1.0
    return m


def _reference_cknna(A: np.ndarray, B: np.ndarray, k: int) -> float:
    K, L = _unit(A) @ _unit(A).T, _unit(B) @ _unit(B).T
    mk, ml = _mask(_reference_knn(A, k)), _mask(_reference_knn(B, k))
    kl = _hsic1(mk * ml * K, mk * ml * L)
    kk = _hsic1(mk * K, mk * K)
    ll = _hsic1(ml * L, ml * L)
    return kl / math.sqrt(kk * ll)


def _reference_cycle_knn(A: np.ndarray, B: np.ndarray, k: int) -> float:
    knn_a, knn_b = _reference_knn(A, k), _reference_knn(B, k)
    n = A.shape[0]
    back = knn_a[knn_b]  # (n, k, k): A-neighbours of each B-neighbour
    return float((back == np.arange(n)[:, None, None]).reshape(n, -1).any(axis=1).mean())


def _inverse_sqrt(S: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(S)
    return (v / np.sqrt(w)) @ v.T


def _reference_cca(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correlations, X-side canonical variates (n, r) and centred X, by covariance whitening
    as in google/svcca cca_core.py (full-rank X, Y)."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    n = X.shape[0]
    Sxx, Syy, Sxy = Xc.T @ Xc / (n - 1), Yc.T @ Yc / (n - 1), Xc.T @ Yc / (n - 1)
    Wx = _inverse_sqrt(Sxx)
    u, rho, _ = np.linalg.svd(Wx @ Sxy @ _inverse_sqrt(Syy), full_matrices=False)
    H = Xc @ Wx @ u  # canonical variates
    return rho, H, Xc


def _reference_svcca(A: np.ndarray, B: np.ndarray, p: int, q: int) -> float:
    reduced = []
    for M, m in ((A, p), (B, q)):
        Mc = M - M.mean(0)
        _, _, vt = np.linalg.svd(Mc, full_matrices=False)
        reduced.append(Mc @ vt[:m].T)  # coordinates on the m leading directions
    rho, _, _ = _reference_cca(*reduced)
    return float(rho.mean())


def _reference_pwcca(A: np.ndarray, B: np.ndarray) -> float:
    """Morcos et al. 2018 eqs. 2-3, weights from the side with fewer neurons (A on a tie)."""
    if B.shape[1] < A.shape[1]:
        A, B = B, A
    rho, H, Xc = _reference_cca(A, B)
    H = H / np.linalg.norm(H, axis=0)
    alpha = np.abs(H.T @ Xc).sum(axis=1)
    return float((alpha * rho).sum() / alpha.sum())


# ------------------------------------------------------------ agreement with the references
def test_unbiased_cka_matches_song_et_al_formula() -> None:
    A, B = _related(60, 5, 8)
    assert unbiased_cka_score(A, B) == pytest.approx(_reference_unbiased_cka(A, B), abs=1e-6)
    A, B = _related(12, 30, 20, seed=1)  # n < d: the Gram form
    assert unbiased_cka_score(A, B) == pytest.approx(_reference_unbiased_cka(A, B), abs=1e-6)
    A, B = _random(4, 3, seed=2), _random(4, 2, seed=3)  # the smallest n
    assert unbiased_cka_score(A, B) == pytest.approx(_reference_unbiased_cka(A, B), abs=1e-6)


@pytest.mark.parametrize("k", [2, 5, 39])
def test_cknna_matches_platonic_definition(k: int) -> None:
    A, B = _related(40, 6, 9, seed=4)
    assert cknna_score(A, B, k=k) == pytest.approx(_reference_cknna(A, B, k), abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_cycle_knn_matches_platonic_definition(k: int) -> None:
    A, B = _related(50, 4, 7, seed=5)
    assert cycle_knn_score(A, B, k=k) == _reference_cycle_knn(A, B, k)
    assert cycle_knn_score(B, A, k=k) == _reference_cycle_knn(B, A, k)


@pytest.mark.parametrize(("keep", "p", "q"), [(3, 3, 3), (5, 5, 5), (1.0, 6, 8), (2, 2, 2)])
def test_svcca_matches_svd_then_whitened_cca(keep: int | float, p: int, q: int) -> None:
    A, B = _related(80, 6, 8, seed=6)
    assert svcca_score(A, B, keep=keep) == pytest.approx(_reference_svcca(A, B, p, q), abs=1e-6)


def test_svcca_variance_share_picks_the_fewest_directions_that_reach_it() -> None:
    A, B = _related(200, 6, 8, seed=7)
    share_a, share_b = (
        np.cumsum(np.linalg.svd(M - M.mean(0), compute_uv=False) ** 2) for M in (A, B)
    )
    share_a, share_b = share_a / share_a[-1], share_b / share_b[-1]
    cut = 0.5 * (share_a[1] + share_a[2])  # midway: A keeps 3 directions
    p = int(np.argmax(share_a >= cut)) + 1
    q = int(np.argmax(share_b >= cut)) + 1
    assert p == 3 and np.abs(share_b - cut).min() > 0.01  # no near-tie in B either
    expected = _reference_svcca(A, B, p, q)
    assert svcca_score(A, B, keep=float(cut)) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("da", "db"), [(4, 7), (7, 4), (5, 5)])
def test_pwcca_matches_morcos_et_al_definition(da: int, db: int) -> None:
    A, B = _related(90, da, db, seed=8)
    assert pwcca_score(A, B) == pytest.approx(_reference_pwcca(A, B), abs=1e-6)


def test_pwcca_weights_differ_from_the_plain_mean() -> None:
    A, B = _related(200, 4, 6, seed=9)
    rho, _, _ = _reference_cca(A, B)
    # A real weighting: the weighted mean is not the plain mean of the correlations.
    assert abs(pwcca_score(A, B) - rho.mean()) > 0.01


# ------------------------------------------------------------ known values and invariances
def test_unbiased_cka_identity_invariances_symmetry() -> None:
    A, B = _related(100, 12, 5, seed=10)
    assert unbiased_cka_score(A, A) == pytest.approx(1.0, abs=1e-12)
    assert unbiased_cka_score(A, 7.0 * A @ _rotation(12) - 4.0) == pytest.approx(1.0, abs=1e-12)
    value = unbiased_cka_score(A, B)
    assert 0.05 < value < 0.95
    assert unbiased_cka_score(B, A) == pytest.approx(value, abs=1e-12)
    assert unbiased_cka_score(0.1 * A @ _rotation(12, seed=3), 9.0 * B) == pytest.approx(value)


def test_unbiased_cka_has_no_small_sample_bias() -> None:
    # Biased linear CKA of unrelated sets grows as n shrinks; the unbiased one stays near 0.
    values = [
        unbiased_cka_score(_random(30, 20, seed=s), _random(30, 20, seed=s + 50)) for s in range(20)
    ]
    assert abs(float(np.mean(values))) < 0.03
    assert min(values) < 0 < max(values)
    assert linear_cka_score(_random(30, 20), _random(30, 20, seed=50)) > 0.3


def test_cknna_identity_rotation_and_scaling_score_one() -> None:
    A, B = _related(60, 8, 5, seed=11)
    assert cknna_score(A, A) == pytest.approx(1.0, abs=1e-12)
    assert cknna_score(A, 3.0 * A @ _rotation(8)) == pytest.approx(1.0, abs=1e-9)
    assert 0.0 < cknna_score(A, B) < 0.9


def test_cknna_with_every_neighbour_is_unbiased_cka_of_unit_rows() -> None:
    A, B = _related(30, 5, 7, seed=12)
    n = A.shape[0]
    expected = unbiased_cka_score(_unit(A), _unit(B))
    assert cknna_score(A, B, k=n - 1) == pytest.approx(expected, abs=1e-9)


def test_cycle_knn_of_clusters_is_one_and_of_shuffled_pairs_is_near_chance() -> None:
    rng = np.random.default_rng(13)
    centres = 10.0 * rng.normal(size=(20, 6))
    A = np.repeat(centres, 4, axis=0) + 0.01 * rng.normal(size=(80, 6))  # clusters of k+1
    assert cycle_knn_score(A, A, k=3) == 1.0
    assert cycle_knn_score(A, 5.0 * A @ _rotation(6), k=3) == 1.0
    n, k = 400, 5
    X = _random(n, 16, seed=14)
    chance = 1 - (1 - k / (n - 1)) ** k
    assert cycle_knn_score(X, _random(n, 16, seed=15), k=k) < 3 * chance
    assert cycle_knn_score(X, X, k=k) > 0.9


def test_cycle_knn_by_hand() -> None:
    # A's nearest neighbours: 0<->1, 2<->3. B moves row 0 next to 2 and 3.
    A = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    B = np.array([[0.05, 0.95], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    # k = 1 in B (by angle: 87°, 6°, 90°, 84°): 0 -> 2, 1 -> 3, 2 -> 0, 3 -> 0.
    # Back in A: N_A(2) = {3} ∌ 0, N_A(3) = {2} ∌ 1, N_A(0) = {1} ∌ 2, 3: no cycle closes.
    assert cycle_knn_score(A, B, k=1) == 0.0
    assert cycle_knn_score(A, A, k=1) == 1.0
    assert cycle_knn_score(B, A, k=1) == 0.0  # A-step 0 -> 1, 1 -> 0, 2 -> 3, 3 -> 2; none back


def test_svcca_invariances() -> None:
    A, B = _related(150, 6, 9, seed=16)
    value = svcca_score(A, B)
    assert 0.1 < value < 0.95
    assert svcca_score(A, A) == pytest.approx(1.0, abs=1e-12)
    # Rotation, isotropic scaling and translation keep the singular directions.
    moved = 4.0 * A @ _rotation(6) + 3.0
    assert svcca_score(moved, B) == pytest.approx(value, abs=1e-9)
    # With every direction kept, SVCCA is CCA: invariant to any invertible linear map.
    full = svcca_score(A, B, keep=1.0)
    M = np.random.default_rng(17).normal(size=(9, 9))
    assert abs(np.linalg.det(M)) > 1e-3
    assert svcca_score(A, B @ M, keep=1.0) == pytest.approx(full, abs=1e-9)
    assert svcca_score(A @ M[:6, :6], B, keep=1.0) == pytest.approx(full, abs=1e-9)


def test_pwcca_identity_and_invariances() -> None:
    A, B = _related(150, 5, 8, seed=18)  # A has fewer directions: its columns weigh
    value = pwcca_score(A, B)
    assert 0.1 < value < 0.95
    assert pwcca_score(A, A) == pytest.approx(1.0, abs=1e-12)
    M = np.random.default_rng(19).normal(size=(8, 8))
    assert pwcca_score(A, B @ M + 5.0) == pytest.approx(value, abs=1e-9)  # the other side
    flips = A[:, [3, 0, 4, 2, 1]] * np.array([1.0, -1.0, 1.0, -1.0, -1.0])
    assert pwcca_score(3.0 * flips - 2.0, B) == pytest.approx(value, abs=1e-9)
    # Not invariant to rotating the weighted side: the weights sum |<h_i, a_j>| over columns.
    assert pwcca_score(A @ _rotation(5), B) != pytest.approx(value, abs=1e-6)


def test_cca_scores_refuse_too_few_pairs_for_their_directions() -> None:
    A, B = _random(20, 8), _random(20, 12, seed=1)
    with pytest.raises(TooFewPairsError) as info:
        pwcca_score(A, B)  # 8 + 12 directions, 20 pairs: the subspaces must meet
    assert (info.value.minimum, info.value.got, info.value.param) == (21, 20, "A")
    with pytest.raises(TooFewPairsError):
        svcca_score(A, B, keep=1.0)
    assert 0.0 <= svcca_score(A, B, keep=5) <= 1.0  # 5 + 5 < 20


# ------------------------------------------------------------ degenerate inputs
SCORES: dict[str, Callable[[Any, Any], float]] = {
    "unbiased_cka_score": unbiased_cka_score,
    "cknna_score": lambda a, b: cknna_score(a, b, k=2),
    "cycle_knn_score": lambda a, b: cycle_knn_score(a, b, k=2),
    "svcca_score": lambda a, b: svcca_score(a, b, keep=1),
    "pwcca_score": pwcca_score,
}
LOWEST = {"unbiased_cka_score": -1.0, "cknna_score": -1.0}


def _degenerate() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20)
    rank1 = np.outer(rng.normal(size=8), rng.normal(size=5))
    return {
        "constant": np.full((8, 5), 3.0),
        "zeros": np.zeros((8, 5)),
        "duplicated rows": np.repeat(rng.normal(size=(2, 5)), 4, axis=0),
        "rank 1": rank1,
        "rank 1 plus an offset": rank1 + 7.0,
        "float32 rank 1": (rank1 + 7.0).astype(np.float32),
        "tiny": 1e-300 * rng.normal(size=(8, 3)),  # 3 + 3 directions < 8 pairs
        "huge": 1e200 * rng.normal(size=(8, 3)),
    }


@pytest.mark.parametrize("name", sorted(SCORES))
@pytest.mark.parametrize("kind", sorted(_degenerate()))
def test_degenerate_sets_give_a_finite_value_in_range(name: str, kind: str) -> None:
    f, flat = SCORES[name], _degenerate()[kind]
    other = _random(8, 2, seed=21)  # 2 directions: CCA of 8 pairs stays possible
    for a, b in ((flat, other), (other, flat), (flat, flat)):
        value = f(a, b)
        assert isinstance(value, float) and math.isfinite(value), (kind, value)
        assert LOWEST.get(name, 0.0) <= value <= 1.0


@pytest.mark.parametrize("name", sorted(SCORES))
def test_constant_set_scores_zero(name: str) -> None:
    assert SCORES[name](np.full((8, 5), 3.0), _random(8, 2)) == 0.0


def test_four_pairs_are_enough() -> None:
    A = np.array([[0.0, 1.0], [1.0, 0.2], [2.0, 0.1], [3.0, 1.5]])
    for name, f in SCORES.items():
        value = f(A, A[:, :1] ** 2)  # CCA: ranks 2 + 1 < 4
        assert math.isfinite(value) and LOWEST.get(name, 0.0) <= value <= 1.0, name
    assert unbiased_cka_score(A, A) == pytest.approx(1.0)
    assert cknna_score(A, A, k=2) == pytest.approx(1.0)
    assert svcca_score(A, A, keep=1) == pytest.approx(1.0)
    assert pwcca_score(A, 2.0 * A[:, 1:]) == pytest.approx(1.0)  # B lies in A's span


def test_rank_cut_off_ignores_float32_rounding_noise() -> None:
    rng = np.random.default_rng(22)
    rank1 = np.outer(rng.normal(size=50), rng.normal(size=6)) + 7.0
    B = _random(50, 3, seed=23)
    exact = pwcca_score(rank1, B)
    assert pwcca_score(rank1.astype(np.float32), B) == pytest.approx(exact, abs=1e-6)
    assert svcca_score(rank1.astype(np.float32), B, keep=1.0) == pytest.approx(exact, abs=1e-6)


def test_knn_scores_are_the_same_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    A, B = _related(60, 6, 4, seed=24)
    whole = (cknna_score(A, B, k=5), cycle_knn_score(A, B, k=5))
    monkeypatch.setattr(lm, "_BLOCK_ELEMENTS", 7 * 60)
    assert (cknna_score(A, B, k=5), cycle_knn_score(A, B, k=5)) == whole


# ------------------------------------------------------------ errors and options
@pytest.mark.parametrize("name", sorted(SCORES))
def test_input_errors(name: str) -> None:
    f = SCORES[name]
    good = _random(6, 3)
    bad = good.copy()
    bad[2, 1] = np.nan
    with pytest.raises(NonFiniteError):
        f(good, bad)
    with pytest.raises(TooFewPairsError) as few:
        f(good[:3], good[:3])
    assert few.value.minimum == 4 and few.value.got == 3
    with pytest.raises(ShapeMismatchError):
        f(good, good[:5])
    with pytest.raises(ShapeMismatchError):
        f(good[0], good[0])


@pytest.mark.parametrize(
    ("score", "lowest"), [(cknna_score, 2), (cycle_knn_score, 1), (mutual_knn_score, 1)]
)
@pytest.mark.parametrize("k", [True, 2.5, 3.0, None, "3", 0, 1, 12, 13, -2])
def test_k_is_validated(score: Callable[..., float], lowest: int, k: Any) -> None:
    A = _random(12, 3)
    if isinstance(k, int) and not isinstance(k, bool) and lowest <= k < 12:
        assert math.isfinite(score(A, A, k=k))
        return
    with pytest.raises(InvalidInputError) as info:
        score(A, A, k=k)
    assert info.value.param == "k"


@pytest.mark.parametrize("keep", [True, False, None, "0.9", 0, -1, 0.0, -0.5, 1.5, 10.0, math.nan])
def test_keep_is_validated(keep: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        svcca_score(_random(30, 4), _random(30, 4, seed=1), keep=keep)
    assert info.value.param == "keep"


def test_keep_accepts_numpy_numbers() -> None:
    A, B = _related(60, 5, 5, seed=25)
    assert svcca_score(A, B, keep=np.int64(3)) == svcca_score(A, B, keep=3)
    assert svcca_score(A, B, keep=np.float64(1.0)) == svcca_score(A, B, keep=1.0)


# ------------------------------------------------------------ real embeddings
def test_real_models_score_below_themselves(scifact_small: Any) -> None:
    minilm, pml3, mpnet = (scifact_small.corpus[k] for k in ("minilm", "pml3", "mpnet"))
    shuffled = pml3[np.random.default_rng(0).permutation(len(pml3))]
    for name, f in {
        "unbiased_cka_score": unbiased_cka_score,
        "cknna_score": cknna_score,
        "cycle_knn_score": cycle_knn_score,
        "svcca_score": svcca_score,
    }.items():
        own, cross, far = f(minilm, minilm), f(minilm, pml3), f(minilm, shuffled)
        assert 0.0 < cross < 1.0, name
        assert own > cross > far, name
    # Measured on these 400 documents: minilm is closer to mpnet than to pml3 by every score.
    assert unbiased_cka_score(minilm, mpnet) > unbiased_cka_score(minilm, pml3)
    assert cknna_score(minilm, mpnet) > cknna_score(minilm, pml3)


def test_real_models_pwcca(scifact_small: Any) -> None:
    minilm, pml3 = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    with pytest.raises(TooFewPairsError) as info:
        pwcca_score(minilm, pml3)  # ~380 + 384 directions, 400 pairs
    assert info.value.minimum > 400
    a, b = minilm[:, :64], pml3[:, :64]  # 64 real coordinates each: 128 < 400
    shuffled = b[np.random.default_rng(0).permutation(400)]
    assert pwcca_score(a, a) == pytest.approx(1.0)
    assert 0.0 < pwcca_score(a, b) < 1.0
    assert pwcca_score(a, b) > pwcca_score(a, shuffled)
    assert pwcca_score(a, b) == pytest.approx(_reference_pwcca(a.astype(np.float64), b), abs=1e-6)
