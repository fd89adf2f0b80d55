"""Deterministic hold-out and k-fold splits."""

from __future__ import annotations

import numpy as np
import pytest

from lead.errors import InvalidInputError, TooFewPairsError
from lead.splits import early_stopping_split, holdout_split, kfold_indices


def test_holdout_split_follows_the_documented_permutation() -> None:
    train, test = holdout_split(100, 0.2, seed=7)
    order = np.random.default_rng(7).permutation(100)
    assert np.array_equal(test, np.sort(order[:20]))
    assert np.array_equal(train, np.sort(order[20:]))
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(100))


def test_holdout_split_is_deterministic_and_seed_dependent() -> None:
    a, b, c = holdout_split(50, 0.3, 1), holdout_split(50, 0.3, 1), holdout_split(50, 0.3, 2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])
    assert len(a[1]) == 15 and np.all(np.diff(a[0]) > 0)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_holdout_split_rejects_fractions_outside_zero_one(fraction: float) -> None:
    with pytest.raises(InvalidInputError):
        holdout_split(100, fraction)


@pytest.mark.parametrize(("n", "fraction"), [(10, 0.2), (10, 0.8), (7, 0.5)])
def test_holdout_split_needs_four_rows_per_side(n: int, fraction: float) -> None:
    with pytest.raises(TooFewPairsError) as info:
        holdout_split(n, fraction)
    assert info.value.minimum == 4


def test_kfold_indices_partition_the_rows() -> None:
    folds = kfold_indices(23, folds=5, seed=3)
    assert len(folds) == 5
    assert sorted(len(f) for f in folds) == [4, 4, 5, 5, 5]
    assert np.array_equal(np.sort(np.concatenate(folds)), np.arange(23))
    again = kfold_indices(23, folds=5, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(folds, again, strict=True))


def test_kfold_indices_errors() -> None:
    with pytest.raises(InvalidInputError):
        kfold_indices(10, folds=1)
    with pytest.raises(TooFewPairsError):
        kfold_indices(3, folds=5)


def test_a_methods_early_stopping_split_says_how_many_pairs_it_needs() -> None:
    """The MLP's own 10 % early-stopping rows were reported as the caller's hold-out
    ("cannot hold out 0.1 of 16 pairs"), naming no way out."""
    from lead.fitting import fit_stitch

    X = np.random.default_rng(0).normal(size=(16, 4))
    with pytest.raises(TooFewPairsError, match="needs at least 35") as caught:
        fit_stitch(X, X, "mlp", max_epochs=1)
    assert caught.value.minimum == 35 and caught.value.got == 16
    train, held = early_stopping_split(35, 0.1, 0, method="MLP")  # enough: 31 + 4
    assert (len(train), len(held)) == (31, 4)


@pytest.mark.parametrize("fraction", [1e-310, 5e-324, 1e-12])
def test_a_vanishing_early_stopping_share_is_too_few_pairs_not_an_overflow(
    fraction: float,
) -> None:
    """``holdout_fraction=1e-310`` divided into infinity: an OverflowError (a job's 500)."""
    with pytest.raises(TooFewPairsError, match="too small a share") as caught:
        early_stopping_split(80, fraction, 0, method="MLP")
    assert caught.value.param == "holdout_fraction"
