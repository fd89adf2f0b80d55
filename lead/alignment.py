"""How alignable two embedding spaces are, from paired vectors alone (no stitch needed).

:func:`alignment_scores` reports two representation-similarity scores (linear CKA and
mutual k-NN) and the cross-validated R² of a ridge stitch: the share of the target space's
variance that a linear map from the source space explains on pairs it did not see.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lead import metrics
from lead._validation import check_pairs
from lead.errors import InvalidInputError, TooFewPairsError
from lead.fitting import fit_ridge
from lead.splits import kfold_indices

__all__ = ["alignment_scores"]

#: Neighbourhood size of the mutual k-NN score (Huh et al. 2024).
MUTUAL_KNN_K = 10


def _ridge_r2(X: torch.Tensor, Y: torch.Tensor, folds: int, seed: int) -> float:
    """Pooled k-fold R² of ridge predictions, each fold against its training mean."""
    residual = reference = 0.0
    parts = kfold_indices(X.shape[0], folds, seed)
    for f, test in enumerate(parts):
        train = torch.from_numpy(np.concatenate([p for g, p in enumerate(parts) if g != f]))
        test_rows = torch.from_numpy(test)
        stitch = fit_ridge(X[train], Y[train], seed=seed).to(torch.float64)
        with torch.no_grad():
            prediction = stitch(X[test_rows])
        residual += float(((Y[test_rows] - prediction) ** 2).sum())
        reference += float(((Y[test_rows] - Y[train].mean(dim=0)) ** 2).sum())
    scale = float((Y**2).sum())
    if reference <= np.finfo(np.float64).eps * scale:  # constant targets: 0 / 0
        return 1.0 if residual == 0.0 else 0.0
    return 1.0 - residual / reference


def _min_pairs_for(folds: int) -> int:
    """Fewest pairs whose every training part (all folds but one) has MIN_PAIRS rows."""
    n = metrics.MIN_PAIRS
    while n - -(-n // folds) < metrics.MIN_PAIRS:
        n += 1
    return n


def _check_folds(n: int, folds: int) -> None:
    if folds < 2:
        raise InvalidInputError(f"folds must be at least 2, got {folds}", param="folds")
    needed = max(_min_pairs_for(folds), folds)
    if n < needed:
        raise TooFewPairsError(
            f"{n} pairs are too few for {folds} folds: every fold needs a pair and every "
            f"training part (the pairs outside one fold) at least {metrics.MIN_PAIRS}; send at "
            f"least {needed} pairs or use fewer folds",
            minimum=needed,
            got=n,
            param="X",
        )


def _check_varies(M: torch.Tensor, name: str, side: str) -> None:
    """Refuse a set whose rows are (nearly) all the same: every score would be 0 / 0."""
    spread = float(((M - M.mean(dim=0)) ** 2).sum())
    if spread <= 1e3 * np.finfo(np.float64).eps * float((M**2).sum()):
        raise InvalidInputError(
            f"the {side} vectors do not vary; alignment is undefined (all rows are the same)",
            param=name,
        )


def alignment_scores(
    X: Any, Y: Any, *, folds: int = 5, seed: int = 0, max_pairs: int | None = None
) -> dict[str, Any]:
    r"""Alignment of two embedding spaces measured on paired vectors.

    Parameters
    ----------
    X : array or Tensor of shape (n, d_src)
        Items embedded by the source model.
    Y : array or Tensor of shape (n, d_tgt)
        The same items embedded by the target model.
    folds : int, default 5
        Folds of the cross-validated ridge R² (at least 2).
    seed : int, default 0
        Seed of the subsample, the fold split and the ridge strength selection.
    max_pairs : int, optional
        Use a seeded random subset of this many pairs when ``n`` is larger (at least 4).

    Returns
    -------
    dict
        ``{"pairs": rows used, "linear_cka_score": [0, 1], "mutual_knn_score": [0, 1],
        "ridge_r2_score": (-inf, 1], "folds": folds}``; all best at 1.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        Bad shapes, non-finite input, fewer than 4 pairs, or so few that a training fold
        (all pairs but one fold) has fewer than 4.
    InvalidInputError
        If ``folds < 2`` or ``max_pairs < 4``, or if ``X`` or ``Y`` does not vary (total
        variance zero up to rounding, e.g. all-zero or repeated rows): the scores would be
        0 / 0.

    Notes
    -----
    ``ridge_r2_score`` is
    :math:`1 - \sum_f \lVert Y_{F_f} - s_{-f}(X_{F_f})\rVert_F^2 /
    \sum_f \lVert Y_{F_f} - \bar y_{-f}\rVert_F^2`, where :math:`s_{-f}` is a ridge stitch
    (strength chosen on its own training pairs) fitted without fold :math:`F_f` and
    :math:`\bar y_{-f}` that fold's training mean: pooled over folds, so 0 is the
    mean-estimator baseline. ``mutual_knn_score`` uses ``k = min(10, n - 2)``.

    References
    ----------
    .. [1] S. Kornblith et al., "Similarity of Neural Network Representations Revisited",
       ICML 2019, arXiv:1905.00414.
    .. [2] M. Huh et al., "The Platonic Representation Hypothesis", ICML 2024,
       arXiv:2405.07987.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 4))
    >>> Q = np.linalg.qr(rng.normal(size=(4, 4)))[0]  # a rotation
    >>> s = alignment_scores(X, 2.0 * X @ Q)
    >>> s["pairs"], s["mutual_knn_score"]
    (60, 1.0)
    >>> round(s["linear_cka_score"], 6), round(s["ridge_r2_score"], 6)
    (1.0, 1.0)
    """
    A, B = check_pairs(X, Y)
    if max_pairs is not None:
        if max_pairs < metrics.MIN_PAIRS:
            raise InvalidInputError(
                f"max_pairs must be at least {metrics.MIN_PAIRS}, got {max_pairs}",
                param="max_pairs",
            )
        if A.shape[0] > max_pairs:
            keep = np.sort(np.random.default_rng(seed).permutation(A.shape[0])[:max_pairs])
            rows = torch.from_numpy(keep).to(A.device)
            A, B = A[rows], B[rows]
    n = A.shape[0]
    folds = int(folds)
    _check_folds(n, folds)
    _check_varies(A, "X", "source")
    _check_varies(B, "Y", "target")
    ridge_r2 = _ridge_r2(A.cpu(), B.cpu(), folds, seed)
    return {
        "pairs": n,
        "linear_cka_score": metrics.linear_cka_score(A, B),
        "mutual_knn_score": metrics.mutual_knn_score(A, B, k=max(1, min(MUTUAL_KNN_K, n - 2))),
        "ridge_r2_score": ridge_r2,
        "folds": int(folds),
    }
