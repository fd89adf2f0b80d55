"""Deterministic train / held-out splits of paired rows.

The same ``(n, fraction, seed)`` always gives the same split, on every machine, so a
scorecard can name its held-out rows by these three numbers alone.
"""

from __future__ import annotations

import math

import numpy as np

from lead._options import MAX_SEED, check_float_option, check_int_option
from lead.errors import InvalidInputError, TooFewPairsError

__all__ = ["MIN_SPLIT_SIDE", "early_stopping_split", "holdout_split", "kfold_indices"]

#: Fewest rows allowed on each side of a hold-out split.
MIN_SPLIT_SIDE = 4


def holdout_split(
    n: int, holdout_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into training and held-out row indices.

    Parameters
    ----------
    n : int
        Number of paired rows.
    holdout_fraction : float, default 0.2
        Share of rows held out, strictly between 0 and 1.
    seed : int, default 0
        Seed of ``np.random.default_rng``.

    Returns
    -------
    train_idx, test_idx : ndarray of int64, sorted
        Disjoint, together ``range(n)``. ``test_idx`` are the first
        ``round(n * holdout_fraction)`` entries of ``default_rng(seed).permutation(n)``.

    Raises
    ------
    InvalidInputError
        If ``holdout_fraction`` is not in (0, 1), or ``n`` or ``seed`` is not an integer
        >= 0.
    TooFewPairsError
        If either side would have fewer than 4 rows.

    Examples
    --------
    >>> train, test = holdout_split(10, 0.4, seed=0)
    >>> len(train), len(test)
    (6, 4)
    """
    n = check_int_option(n, "n", minimum=0)
    seed = check_int_option(seed, "seed", minimum=0, maximum=MAX_SEED)
    fraction = check_float_option(holdout_fraction, "holdout_fraction", minimum=0.0, maximum=1.0)
    if not 0.0 < fraction < 1.0:
        raise InvalidInputError(
            f"holdout_fraction must be between 0 and 1 (exclusive), got {holdout_fraction}",
            param="holdout_fraction",
        )
    n_test = round(n * float(holdout_fraction))
    if n_test < MIN_SPLIT_SIDE or n - n_test < MIN_SPLIT_SIDE:
        raise TooFewPairsError(
            f"cannot hold out {holdout_fraction:g} of {n} pairs: each side needs at least "
            f"{MIN_SPLIT_SIDE} (train {n - n_test}, held out {n_test})",
            minimum=MIN_SPLIT_SIDE,
            got=min(n_test, n - n_test),
            param="holdout_fraction",
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def early_stopping_split(
    n: int,
    holdout_fraction: float,
    seed: int,
    *,
    method: str,
    option: str | None = "holdout_fraction",
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`holdout_split` of a trained method's own early-stopping rows, whose error
    says how many pairs the method needs (not the caller's hold-out, which it is not),
    and, when the share is the caller's to change, the ``option`` that sets it (None: a
    fixed share, such as the gated stitch's MLP's).

    Raises
    ------
    InvalidInputError
        If ``holdout_fraction`` is not in (0, 1), or ``n`` or ``seed`` is not an integer
        >= 0.
    TooFewPairsError
        If ``n`` pairs are too few (the message gives the fewest that are enough).
    """
    try:
        return holdout_split(n, holdout_fraction, seed)
    except TooFewPairsError:
        fraction = float(holdout_fraction)
        if fraction * 10**9 < MIN_SPLIT_SIDE:  # ~1e-310: no number of pairs would do
            raise TooFewPairsError(
                f"the {method} fit's early stopping holds out {holdout_fraction:g} of its "
                f"training pairs, too small a share to hold out {MIN_SPLIT_SIDE} of any "
                f"realistic number (raise its {option} option)",
                minimum=MIN_SPLIT_SIDE,
                got=n,
                param="holdout_fraction",
            ) from None
        start = max(n + 1, math.ceil((MIN_SPLIT_SIDE - 0.5) / fraction))
        need = next(
            (
                m
                for m in range(start, start + 1000)
                if MIN_SPLIT_SIDE <= round(m * fraction) <= m - MIN_SPLIT_SIDE
            ),
            start,
        )
        advice = f"add pairs, or raise its {option} option" if option else "add pairs"
        raise TooFewPairsError(
            f"the {method} fit holds out {holdout_fraction:g} of its {n} training pairs for "
            f"early stopping and needs at least {need} of them ({advice})",
            minimum=need,
            got=n,
            param="holdout_fraction",
        ) from None


def kfold_indices(n: int, folds: int = 5, seed: int = 0) -> list[np.ndarray]:
    """Partition ``range(n)`` into ``folds`` held-out index sets of near-equal size.

    Parameters
    ----------
    n : int
        Number of paired rows.
    folds : int, default 5
        Number of folds, at least 2.
    seed : int, default 0
        Seed of ``np.random.default_rng``.

    Returns
    -------
    list of ndarray of int64
        ``folds`` sorted, disjoint index arrays covering ``range(n)``; fold ``k`` is
        the ``k``-th chunk of ``np.array_split(default_rng(seed).permutation(n), folds)``.
        The training rows of fold ``k`` are all the others.

    Raises
    ------
    InvalidInputError
        If ``folds`` is not an integer >= 2, or ``n`` or ``seed`` not one >= 0.
    TooFewPairsError
        If ``n < folds``.
    """
    n = check_int_option(n, "n", minimum=0)
    folds = check_int_option(folds, "folds", minimum=2)
    seed = check_int_option(seed, "seed", minimum=0, maximum=MAX_SEED)
    if n < folds:
        raise TooFewPairsError(
            f"cannot split {n} pairs into {folds} folds", minimum=folds, got=int(n), param="folds"
        )
    order = np.random.default_rng(seed).permutation(int(n))
    return [np.sort(chunk) for chunk in np.array_split(order, folds)]
