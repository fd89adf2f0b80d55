"""How alignable two embedding spaces are, from paired vectors alone (no stitch needed).

:func:`alignment_scores` reports the representation-similarity scores of
:mod:`lead.metrics` (linear and unbiased CKA; mutual k-NN, CKNNA and cycle k-NN; SVCCA and
PWCCA) and the cross-validated R² of a ridge stitch: the share of the target space's
variance that a linear map from the source space explains on pairs it did not see.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import Any

import numpy as np
import torch

from lead import metrics, similarity
from lead._validation import check_pairs
from lead.closed_form import fit_ridge
from lead.errors import FitError, InvalidInputError, TooFewPairsError
from lead.splits import kfold_indices

__all__ = ["alignment_scores"]

#: Default neighbourhood size of the k-NN scores (Huh et al. 2024).
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


def _check_int(value: object, name: str, minimum: int) -> int:
    """``value`` as an int ``>= minimum``, else InvalidInputError naming it (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}", param=name)
    if value < minimum:
        raise InvalidInputError(f"{name} must be at least {minimum}, got {value}", param=name)
    return int(value)


def _check_folds(n: int, folds: int) -> None:
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
    """Refuse a set whose rows are (nearly) all the same: every score would be 0 / 0.

    ``M`` is divided by its largest entry first, so that squares neither overflow (an
    infinite spread compared with an infinite total would read as "does not vary") nor
    underflow.
    """
    M = M / M.abs().max().clamp_min(1e-300)
    spread = float(((M - M.mean(dim=0)) ** 2).sum())
    if spread <= 1e3 * np.finfo(np.float64).eps * float((M**2).sum()):
        raise InvalidInputError(
            f"the {side} vectors do not vary; alignment is undefined (all rows are the same)",
            param=name,
        )


def alignment_scores(
    X: Any,
    Y: Any,
    *,
    folds: int = 5,
    seed: int = 0,
    max_pairs: int | None = None,
    k: int = MUTUAL_KNN_K,
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
    k : int, default 10
        Neighbourhood size of the k-NN scores (at least 2); lowered to ``n - 2`` when there
        are fewer pairs.

    Returns
    -------
    dict
        ``{"pairs": rows used, "linear_cka_score": [0, 1], "unbiased_cka_score": [-1, 1],
        "mutual_knn_score": [0, 1], "cknna_score": [-1, 1], "cycle_knn_score": [0, 1],
        "svcca_score": [0, 1] or None, "pwcca_score": [0, 1] or None,
        "ridge_r2_score": (-inf, 1], "folds": folds, "k": int, "distinct_pairs": int,
        "shuffled_baseline": {...}}``; all best at 1. The two CCA scores are None when
        there are too few pairs for CCA (see Notes). ``k`` is the neighbourhood size used
        (``min(k, n - 2)``); ``distinct_pairs`` counts distinct (source, target) rows
        (repeated rows inflate every score); ``shuffled_baseline`` holds the same
        similarity scores with the target rows in a seeded random order: what unrelated
        sets of this size and shape score, so a score means something only well above it
        (few pairs, duplicates and CCA near its pair threshold all raise the baseline).

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        Bad shapes, non-finite input (or values beyond the float32 range, where the ridge
        stitches compute), fewer than 4 pairs, or so few that a training fold (all pairs
        but one fold) has fewer than 4.
    IllConditionedError
        If a column of ``X`` or ``Y`` spreads millions of times wider than its median
        column (float32 would round the others away), or a side varies only below the
        smallest float32 (see :func:`lead.data.check_embeddings`).
    FitError
        If a ridge fit fails, or a score comes out NaN or infinite (never returned).
    InvalidInputError
        If ``folds``, ``seed``, ``k`` or ``max_pairs`` is not an integer (a bool is not),
        ``folds < 2``, ``seed < 0``, ``k < 2`` or ``max_pairs < 4``, or if ``X`` or ``Y``
        does not vary (total variance zero up to rounding, e.g. all-zero or repeated
        rows): the scores would be 0 / 0.

    Notes
    -----
    ``ridge_r2_score`` is
    :math:`1 - \sum_f \lVert Y_{F_f} - s_{-f}(X_{F_f})\rVert_F^2 /
    \sum_f \lVert Y_{F_f} - \bar y_{-f}\rVert_F^2`, where :math:`s_{-f}` is a ridge stitch
    (strength chosen on its own training pairs) fitted without fold :math:`F_f` and
    :math:`\bar y_{-f}` that fold's training mean: pooled over folds, so 0 is the
    mean-estimator baseline. The k-NN scores (:func:`~lead.metrics.mutual_knn_score`,
    :func:`~lead.metrics.cknna_score`, :func:`~lead.metrics.cycle_knn_score` from ``X``
    through ``Y``) share one neighbour search per side with ``min(k, n - 2)`` neighbours.
    :func:`~lead.metrics.svcca_score` keeps 10 singular directions per side and
    :func:`~lead.metrics.pwcca_score` all of them; each is None when ``n`` is not larger
    than the directions of both sides together (e.g. 384- and 768-dimensional vectors need
    at least 1,153 pairs for PWCCA), where CCA gives correlations of 1 by construction.

    References
    ----------
    .. [1] S. Kornblith et al., "Similarity of Neural Network Representations Revisited",
       ICML 2019, arXiv:1905.00414.
    .. [2] M. Huh et al., "The Platonic Representation Hypothesis", ICML 2024,
       arXiv:2405.07987.
    .. [3] T. Nguyen, M. Raghu, S. Kornblith, "Do Wide and Deep Networks Learn the Same
       Things?", ICLR 2021, arXiv:2010.15327.
    .. [4] M. Raghu et al., "SVCCA", NeurIPS 2017, arXiv:1706.05806; A. Morcos, M. Raghu,
       S. Bengio, "Insights on representational similarity in neural networks with
       canonical correlation", NeurIPS 2018, arXiv:1806.05759.

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
    >>> [round(s[key], 6) for key in ("unbiased_cka_score", "svcca_score", "pwcca_score")]
    [1.0, 1.0, 1.0]
    """
    A, B = check_pairs(X, Y)
    folds = _check_int(folds, "folds", 2)
    seed = _check_int(seed, "seed", 0)
    k = _check_int(k, "k", 2)
    if max_pairs is not None:
        max_pairs = _check_int(max_pairs, "max_pairs", metrics.MIN_PAIRS)
        if A.shape[0] > max_pairs:
            keep = np.sort(np.random.default_rng(seed).permutation(A.shape[0])[:max_pairs])
            rows = torch.from_numpy(keep).to(A.device)
            A, B = A[rows], B[rows]
    n = A.shape[0]
    _check_folds(n, folds)
    _check_varies(A, "X", "source")
    _check_varies(B, "Y", "target")
    ridge_r2 = _ridge_r2(A.cpu(), B.cpu(), folds, seed)
    k = min(k, n - 2)
    shuffle = torch.from_numpy(np.random.default_rng(seed).permutation(n)).to(B.device)
    real, shuffled = _similarity(A, B, k, shuffle)
    scores = {**real, "ridge_r2_score": ridge_r2}
    for key, value in (*scores.items(), *shuffled.items()):
        if value is not None and not math.isfinite(value):  # never a NaN that reads as null
            raise FitError(
                f"{key} came out as {value}: the data is probably ill-conditioned; "
                "standardise or L2-normalise X and Y first"
            )
    return {
        "pairs": n,
        **scores,
        "folds": folds,
        "k": k,
        "distinct_pairs": int(torch.unique(torch.cat([A, B], dim=1), dim=0).shape[0]),
        "shuffled_baseline": shuffled,
    }


def _similarity(
    A: torch.Tensor, B: torch.Tensor, k: int, shuffle: torch.Tensor
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Every representation-similarity score of two validated sets (k-NN with ``k``), and
    the same with ``B``'s rows in the order ``shuffle`` (``A``'s neighbour search and both
    SVDs serve both)."""
    knn, knn_shuffled = similarity._knn_and_shuffled(A, B, k, shuffle)
    cca, cca_shuffled = similarity._cca_and_shuffled(A, B, shuffle)
    assert knn_shuffled is not None and cca_shuffled is not None
    B_shuffled = B[shuffle]
    real = {
        "linear_cka_score": metrics.linear_cka_score(A, B),
        "unbiased_cka_score": metrics.unbiased_cka_score(A, B),
        **knn,
        **cca,
    }
    baseline = {
        "linear_cka_score": metrics.linear_cka_score(A, B_shuffled),
        "unbiased_cka_score": metrics.unbiased_cka_score(A, B_shuffled),
        **knn_shuffled,
        **cca_shuffled,
    }
    return real, baseline
