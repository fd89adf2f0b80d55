"""Alignability scores of ``lead.alignment`` on synthetic and real paired embeddings."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest

import lead.alignment as la
from lead import metrics
from lead.alignment import alignment_scores
from lead.errors import (
    IllConditionedError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)

KEYS = [
    "pairs",
    "linear_cka_score",
    "unbiased_cka_score",
    "mutual_knn_score",
    "cknna_score",
    "cycle_knn_score",
    "svcca_score",
    "pwcca_score",
    "ridge_r2_score",
    "folds",
    "k",
    "distinct_pairs",
    "shuffled_baseline",
]


def test_doctests() -> None:
    result = doctest.testmod(la)
    assert result.failed == 0 and result.attempted > 0


def test_identical_and_linearly_related_sets_score_one() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 6))
    same = alignment_scores(X, X)
    assert list(same) == KEYS
    assert same["pairs"] == 120 and same["folds"] == 5
    assert same["linear_cka_score"] == pytest.approx(1.0)
    assert same["mutual_knn_score"] == 1.0
    for key in ("unbiased_cka_score", "cknna_score", "svcca_score", "pwcca_score"):
        assert same[key] == pytest.approx(1.0), key
    assert 0.5 < same["cycle_knn_score"] <= 1.0  # k-NN is not symmetric: below 1 even here
    assert same["ridge_r2_score"] == pytest.approx(1.0, abs=1e-6)
    mixed = alignment_scores(X, X @ rng.normal(size=(6, 9)) + 5.0)  # any linear map, wider
    assert mixed["ridge_r2_score"] == pytest.approx(1.0, abs=1e-6)


def test_unrelated_sets_are_not_alignable() -> None:
    rng = np.random.default_rng(1)
    out = alignment_scores(rng.normal(size=(300, 8)), rng.normal(size=(300, 8)), folds=3)
    assert out["folds"] == 3
    assert -0.2 < out["ridge_r2_score"] < 0.05
    assert out["linear_cka_score"] < 0.1 and out["mutual_knn_score"] < 0.15
    assert abs(out["unbiased_cka_score"]) < 0.05 and abs(out["cknna_score"]) < 0.1
    # CCA of 8 + 8 directions on 300 pairs: only chance correlations, about sqrt(8 / 300).
    assert out["svcca_score"] < 0.25 and out["pwcca_score"] < 0.25


def test_real_models_are_partly_alignable(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    out = alignment_scores(X, Y, max_pairs=300, seed=0)
    assert out["pairs"] == 300
    # Measured: R² 0.30 (240 training pairs in 384 dims), CKA 0.77, mutual kNN 0.42.
    assert 0.2 < out["ridge_r2_score"] < 0.95
    assert 0.5 < out["linear_cka_score"] < 1.0
    assert 0.2 < out["mutual_knn_score"] < 1.0
    for key in ("unbiased_cka_score", "cknna_score", "svcca_score"):
        assert 0.2 < out[key] < 1.0, key
    assert out["pwcca_score"] is None  # ~380 + 384 directions, 300 pairs: CCA is undefined
    # The same pair with the rows shuffled apart has nothing left to align (CKA keeps a
    # small-sample bias: 0.18 here).
    shuffled = alignment_scores(X, Y[np.random.default_rng(0).permutation(400)], max_pairs=300)
    assert shuffled["ridge_r2_score"] < 0.05 and shuffled["mutual_knn_score"] < 0.1
    assert shuffled["linear_cka_score"] < out["linear_cka_score"] - 0.3


def test_max_pairs_subsamples_deterministically() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(50, 4))
    Y = X + 0.5 * rng.normal(size=(50, 4))
    a = alignment_scores(X, Y, max_pairs=20, seed=3)
    assert a == alignment_scores(X, Y, max_pairs=20, seed=3)
    assert a["pairs"] == 20
    assert alignment_scores(X, Y, max_pairs=500)["pairs"] == 50


def test_errors() -> None:
    X = np.random.default_rng(3).normal(size=(20, 3))
    bad = X.copy()
    bad[4, 2] = np.nan
    with pytest.raises(NonFiniteError):
        alignment_scores(X, bad)
    with pytest.raises(ShapeMismatchError):
        alignment_scores(X, X[:19])
    with pytest.raises(TooFewPairsError):
        alignment_scores(X[:3], X[:3])
    with pytest.raises(TooFewPairsError):
        alignment_scores(X[:4], X[:4], folds=5)
    with pytest.raises(InvalidInputError):
        alignment_scores(X, X, folds=1)
    with pytest.raises(InvalidInputError):
        alignment_scores(X, X, max_pairs=3)


def test_one_huge_cell_is_named_not_mistaken_for_a_set_that_does_not_vary() -> None:
    X, Y = (
        np.random.default_rng(8).normal(size=(40, 4)),
        np.random.default_rng(9).normal(size=(40, 3)),
    )
    X[3, 2] = 1e200  # its square overflowed float64: "the source vectors do not vary"
    with pytest.raises(NonFiniteError, match=r"X holds 1e\+200 in row 3, column 2") as info:
        alignment_scores(X, Y)
    assert "do not vary" not in info.value.message


def test_data_beyond_float32_or_ill_conditioned_is_refused_not_scored_nan() -> None:
    X, Y = (
        np.random.default_rng(10).normal(size=(60, 6)),
        np.random.default_rng(11).normal(size=(60, 4)),
    )
    with pytest.raises(NonFiniteError, match="beyond the float32 range"):
        alignment_scores(X * np.logspace(-150, 150, 6), Y)  # ridge R² used to be NaN
    with pytest.raises(IllConditionedError, match="ill-conditioned") as info:
        alignment_scores(X, Y * np.logspace(-19, 19, 4))
    assert info.value.param == "Y"


@pytest.mark.parametrize("name", ["folds", "seed", "k", "max_pairs"])
@pytest.mark.parametrize("value", [True, None, 2.0, 3.5, "5", -1])
def test_integer_options_are_validated(name: str, value: Any) -> None:
    X = np.random.default_rng(3).normal(size=(20, 3))
    if name == "max_pairs" and value is None:
        return  # None means "all pairs"
    with pytest.raises(InvalidInputError) as info:
        alignment_scores(X, X, **{name: value})
    assert info.value.param == name


def test_scores_are_the_metrics_of_the_same_pairs() -> None:
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 5))
    Y = X @ rng.normal(size=(5, 3)) + 0.7 * rng.normal(size=(40, 3))
    out = alignment_scores(X, Y, k=4)
    assert out["unbiased_cka_score"] == metrics.unbiased_cka_score(X, Y)
    assert out["mutual_knn_score"] == metrics.mutual_knn_score(X, Y, k=4)
    assert out["cknna_score"] == metrics.cknna_score(X, Y, k=4)
    assert out["cycle_knn_score"] == metrics.cycle_knn_score(X, Y, k=4)
    assert out["svcca_score"] == metrics.svcca_score(X, Y)  # 5 + 3 directions < 40 pairs
    assert out["pwcca_score"] == metrics.pwcca_score(X, Y)
    small = alignment_scores(X[:8], Y[:8], folds=2)  # k = 10 lowered to n - 2 = 6
    assert small["cknna_score"] == metrics.cknna_score(X[:8], Y[:8], k=6)
    assert small["svcca_score"] is None and small["pwcca_score"] is None  # 5 + 3 >= 8


def test_too_few_pairs_per_training_fold_is_refused_up_front() -> None:
    X = np.random.default_rng(4).normal(size=(7, 3))
    with pytest.raises(TooFewPairsError, match="at least 8 pairs") as info:
        alignment_scores(X, X, folds=2)  # folds of 4 and 3: a training part of 3 pairs
    assert (info.value.minimum, info.value.got, info.value.param) == (8, 7, "X")
    assert alignment_scores(np.vstack([X, X[:1] + 1.0]), np.vstack([X, X[:1]]), folds=2)
    with pytest.raises(TooFewPairsError, match="fewer folds"):
        alignment_scores(np.eye(6), np.eye(6), folds=10)  # a fold would be empty


@pytest.mark.parametrize("side", ["X", "Y"])
@pytest.mark.parametrize("kind", ["zeros", "one row repeated", "constant plus rounding noise"])
def test_sets_that_do_not_vary_are_refused(side: str, kind: str) -> None:
    rng = np.random.default_rng(5)
    good = rng.normal(size=(30, 4))
    flat = {
        "zeros": np.zeros((30, 4)),
        "one row repeated": np.tile(good[:1] * 1e3, (30, 1)),
        "constant plus rounding noise": 1.0 + 1e-17 * rng.normal(size=(30, 4)),
    }[kind]
    X, Y = (flat, good) if side == "X" else (good, flat)
    with pytest.raises(InvalidInputError, match="vectors do not vary") as info:
        alignment_scores(X, Y)
    assert info.value.param == side
    tiny_but_varying = 1e-6 * good  # small scale is fine: the check is relative
    assert alignment_scores(tiny_but_varying, good)["linear_cka_score"] == pytest.approx(1.0)


def test_the_shuffled_baseline_shows_what_chance_scores(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    real = alignment_scores(X, Y, folds=2)
    assert real["k"] == 10 and real["distinct_pairs"] == 400
    base = real["shuffled_baseline"]
    for key in ("unbiased_cka_score", "mutual_knn_score", "cknna_score", "cycle_knn_score"):
        assert real[key] > base[key] + 0.2, key
    # a dozen rows: k drops to 10 and chance alone scores high, which the baseline shows
    few = alignment_scores(X[:12], Y[:12], folds=2)
    assert few["k"] == 10 and few["shuffled_baseline"]["cycle_knn_score"] >= 0.5
    # repeated rows are counted
    repeated = alignment_scores(np.repeat(X[:20], 5, axis=0), np.repeat(Y[:20], 5, axis=0))
    assert repeated["pairs"] == 100 and repeated["distinct_pairs"] == 20
