r"""Alignment metrics between paired embedding sets: regression, ranking and similarity.

Every function accepts numpy arrays or torch tensors, computes in float64 on the input's
device, returns a Python ``float`` and never returns NaN: inputs are validated (2-D,
finite, equal row counts, at least :data:`MIN_PAIRS` rows) and every denominator that can
vanish has a documented value. Pairwise similarities are computed in row blocks, so memory
stays bounded for large ``n``.

Regression (``Y_pred`` against ``Y_true``, both ``(n, d_tgt)``):
:func:`mean_squared_error`, :func:`r2_score`, :func:`mean_cosine_similarity`.
Ranking among the ``n`` held-out targets: :func:`top1_accuracy_score`, :func:`mean_rank_error`.
Representation similarity (any two dimensions): :func:`mutual_knn_score`,
:func:`linear_cka_score`, :func:`unbiased_cka_score`, :func:`cknna_score`,
:func:`cycle_knn_score`, :func:`svcca_score`, :func:`pwcca_score`. The k-NN scores rank
neighbours by cosine; the CCA scores (:func:`svcca_score`, :func:`pwcca_score`) work on the
singular directions of each centred set and need more pairs than directions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lead._metric_inputs import (
    MIN_PAIRS,
    Matrix,
    _block_rows,
    _common_scale,
    _pair,
    _unit_rows,
)
from lead._validation import as_matrix
from lead.errors import NonFiniteError, ShapeMismatchError
from lead.similarity import (
    cknna_score,
    cycle_knn_score,
    linear_cka_score,
    mutual_knn_score,
    pwcca_score,
    svcca_score,
    unbiased_cka_score,
)

__all__ = [
    "MIN_PAIRS",
    "cknna_score",
    "cycle_knn_score",
    "linear_cka_score",
    "mean_cosine_similarity",
    "mean_rank_error",
    "mean_squared_error",
    "mutual_knn_score",
    "pwcca_score",
    "r2_score",
    "spearman_score",
    "svcca_score",
    "top1_accuracy_score",
    "unbiased_cka_score",
]


def spearman_score(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two score vectors (average ranks for ties).

    Parameters
    ----------
    a, b : array_like of shape (n,)
        Scores of the same ``n`` items (e.g. each translated vector's confidence and its
        true cosine to the native vector).

    Returns
    -------
    float
        In [-1, 1]; 1 when the two order the items alike; 0 when either is constant.

    Raises
    ------
    ShapeMismatchError
        If ``a`` and ``b`` are not 1-D of the same length.
    NonFiniteError
        NaN or infinity in either (NaN ranked as a value scored 1.0 against anything).

    References
    ----------
    .. [1] C. Spearman, "The proof and measurement of association between two things",
       American Journal of Psychology 15(1), 72-101 (1904). doi:10.2307/1412159
    """
    try:
        va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ShapeMismatchError(
            f"spearman_score takes two 1-D arrays of numbers: {str(error)[:120]}",
            expected="(n,)",
            got=None,
        ) from None
    if va.ndim != 1 or va.shape != vb.shape:
        raise ShapeMismatchError(
            f"spearman_score takes two 1-D arrays of one length, got {va.shape} and {vb.shape}",
            expected=va.shape,
            got=vb.shape,
        )
    if not (np.isfinite(va).all() and np.isfinite(vb).all()):
        raise NonFiniteError("spearman_score's inputs hold NaN or infinity")

    def ranks(v: np.ndarray) -> np.ndarray:
        _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
        ends = np.cumsum(counts)
        return np.asarray((ends - (counts - 1) / 2.0)[inverse], dtype=np.float64)

    ra, rb = ranks(va), ranks(vb)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(np.sqrt((ra @ ra) * (rb @ rb)))
    return float(ra @ rb / denom) if denom > 0 else 0.0


def mean_squared_error(Y_true: Matrix, Y_pred: Matrix) -> float:
    r"""Mean squared error over all ``n * d_tgt`` entries.

    Parameters
    ----------
    Y_true : array or Tensor of shape (n, d_tgt)
        Target-model vectors.
    Y_pred : array or Tensor of shape (n, d_tgt)
        Translated vectors, row ``i`` paired with ``Y_true[i]``.

    Returns
    -------
    float
        In ``[0, inf)``; best 0. Infinite only if squared differences overflow float64
        (entries beyond about 1e154); every other metric here is scale-safe.

    Raises
    ------
    ShapeMismatchError
        Not 2-D, or row / column counts that differ.
    NonFiniteError
        NaN or infinity in an input.
    TooFewPairsError
        Fewer than 4 rows.

    Notes
    -----
    :math:`\mathrm{MSE} = \frac{1}{n d} \sum_{i,j} (Y_{ij} - \hat Y_{ij})^2`, the same
    normalisation as the pooled variance of :func:`r2_score`.

    Examples
    --------
    >>> import numpy as np
    >>> Y = np.eye(4)
    >>> mean_squared_error(Y, Y + 0.5)
    0.25
    """
    T, P = _pair(Y_true, Y_pred, ("Y_true", "Y_pred"), same_dim=True)
    return float(((T - P) ** 2).mean())


def r2_score(Y_true: Matrix, Y_pred: Matrix, *, reference_mean: Matrix) -> float:
    r"""Coefficient of determination against the pooled variance around the training mean.

    Parameters
    ----------
    Y_true : array or Tensor of shape (n, d_tgt)
        Held-out target vectors.
    Y_pred : array or Tensor of shape (n, d_tgt)
        Translated vectors.
    reference_mean : array or Tensor of shape (d_tgt,)
        Mean of the TRAINING targets: the prediction of the mean-estimator baseline.

    Returns
    -------
    float
        In ``(-inf, 1]``; best 1. Predicting ``reference_mean`` for every row scores 0
        exactly; predicting the held-out mean scores slightly above 0.

    Raises
    ------
    ShapeMismatchError
        Bad shapes, including ``reference_mean`` not of length ``d_tgt``.
    NonFiniteError
        NaN or infinity in an input.
    TooFewPairsError
        Fewer than 4 rows.

    Notes
    -----
    .. math::

        R^2 = 1 - \frac{\mathrm{MSE}(Y, \hat Y)}
                       {\frac{1}{n d}\sum_{i,j} (Y_{ij} - \bar y^{\,\mathrm{train}}_j)^2}

    Both terms are averaged over all ``n * d`` entries ("pooled"), so dimensions with more
    variance weigh more, unlike scikit-learn's uniform average of per-dimension R². When
    the denominator is zero (every held-out row equals the training mean, to float64
    precision) the score is 1 for a perfect prediction and 0 otherwise, as in
    scikit-learn's ``force_finite``.

    Examples
    --------
    >>> import numpy as np
    >>> Y = np.array([[0.0, 1.0], [1.0, 0.0], [2.0, 1.0], [1.0, 2.0]])
    >>> r2_score(Y, Y, reference_mean=Y.mean(axis=0))
    1.0
    >>> r2_score(Y, np.tile(Y.mean(axis=0), (4, 1)), reference_mean=Y.mean(axis=0))
    0.0
    """
    T, P = _pair(Y_true, Y_pred, ("Y_true", "Y_pred"), same_dim=True)
    raw = reference_mean if isinstance(reference_mean, Tensor) else np.asarray(reference_mean)
    mu = as_matrix(raw.reshape(1, -1), name="reference_mean").to(T.device)
    if mu.shape[1] != T.shape[1]:
        raise ShapeMismatchError(
            f"reference_mean has {mu.shape[1]} entries, expected d_tgt={T.shape[1]}",
            expected=T.shape[1],
            got=mu.shape[1],
            param="reference_mean",
        )
    c = _common_scale(T, P, mu)  # R² is scale-invariant; keeps squares finite
    T, P, mu = T / c, P / c, mu / c
    mse = float(((T - P) ** 2).mean())
    variance = float(((T - mu) ** 2).mean())
    if variance <= np.finfo(np.float64).eps * float((T**2).mean()):  # constant targets: 0 / 0
        return 1.0 if mse == 0.0 else 0.0
    return 1.0 - mse / variance


def mean_cosine_similarity(Y_true: Matrix, Y_pred: Matrix) -> float:
    r"""Mean cosine similarity of paired rows.

    Parameters
    ----------
    Y_true, Y_pred : array or Tensor of shape (n, d_tgt)
        Paired vectors.

    Returns
    -------
    float
        In ``[-1, 1]``; best 1. An all-zero row has cosine 0 with its partner.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error`.

    Notes
    -----
    :math:`\frac{1}{n}\sum_i \frac{\langle y_i, \hat y_i\rangle}{\|y_i\|\,\|\hat y_i\|}`.
    Beware: for anisotropic target spaces (all cosines near 0.8, as for E5) a poor map
    still scores high; read it together with :func:`r2_score` and
    :func:`top1_accuracy_score`.

    Examples
    --------
    >>> import numpy as np
    >>> mean_cosine_similarity(np.eye(4), 2 * np.eye(4))
    1.0
    """
    T, P = _pair(Y_true, Y_pred, ("Y_true", "Y_pred"), same_dim=True)
    cos = (_unit_rows(T) * _unit_rows(P)).sum(dim=1).clamp(-1.0, 1.0)
    return float(cos.mean())


def _ranks(Y_pred: Matrix, Y_true: Matrix) -> tuple[Tensor, Tensor]:
    """Per row: (number of other targets scoring higher, number tying) by cosine."""
    P, T = _pair(Y_pred, Y_true, ("Y_pred", "Y_true"), same_dim=True)
    P, T = _unit_rows(P), _unit_rows(T)
    n = P.shape[0]
    if torch.equal(P, P[:1].expand_as(P)):
        # A constant prediction (the mean-estimator baseline) scores every target alike:
        # one similarity vector, ranked by sorting instead of an (n, n) product.
        s = T @ P[0]
        ordered = torch.sort(s).values
        above = n - torch.searchsorted(ordered, s, right=True)
        equal = torch.searchsorted(ordered, s, right=True) - torch.searchsorted(ordered, s)
        return above, equal - 1
    greater = torch.empty(n, dtype=torch.int64, device=P.device)
    ties = torch.empty(n, dtype=torch.int64, device=P.device)
    step = _block_rows(n)
    for start in range(0, n, step):
        stop = min(start + step, n)
        sims = P[start:stop] @ T.T
        own = sims[torch.arange(stop - start), torch.arange(start, stop)].unsqueeze(1)
        greater[start:stop] = (sims > own).sum(dim=1)
        ties[start:stop] = (sims == own).sum(dim=1) - 1  # minus the row itself
    return greater, ties


def top1_accuracy_score(Y_pred: Matrix, Y_true: Matrix) -> float:
    r"""Fraction of translated rows whose own target is the strictly nearest of all targets.

    Parameters
    ----------
    Y_pred : array or Tensor of shape (n, d_tgt)
        Translated vectors (the queries).
    Y_true : array or Tensor of shape (n, d_tgt)
        Target vectors (the pool of ``n`` candidates; row ``i`` is the right answer for
        ``Y_pred[i]``).

    Returns
    -------
    float
        In ``[0, 1]``; best 1. Chance level is ``1 / n``.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error`.

    Notes
    -----
    Row ``i`` is a hit when :math:`\cos(\hat y_i, y_i) > \cos(\hat y_i, y_j)` for every
    :math:`j \ne i`. A tie counts as a failure, so a degenerate prediction cannot score by
    luck of tie-breaking: a constant prediction scores ``1 / n`` (only the row whose target
    is nearest to the constant is a hit) or 0 (a zero vector ties everywhere).

    Examples
    --------
    >>> import numpy as np
    >>> top1_accuracy_score(np.eye(4), np.eye(4))
    1.0
    >>> top1_accuracy_score(np.ones((4, 4)), np.eye(4))  # every target ties
    0.0
    """
    greater, ties = _ranks(Y_pred, Y_true)
    return float(((greater + ties) == 0).double().mean())


def mean_rank_error(Y_pred: Matrix, Y_true: Matrix) -> float:
    r"""Mean rank of each translated row's own target among all ``n`` targets (1 = best).

    Parameters
    ----------
    Y_pred : array or Tensor of shape (n, d_tgt)
        Translated vectors.
    Y_true : array or Tensor of shape (n, d_tgt)
        Target vectors, the pool of candidates.

    Returns
    -------
    float
        In ``[1, n]``; best 1. Chance level is ``(n + 1) / 2``.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error`.

    Notes
    -----
    :math:`r_i = 1 + |\{j \ne i : s_{ij} > s_{ii}\}| + \tfrac12 |\{j \ne i : s_{ij} = s_{ii}\}|`
    with :math:`s_{ij} = \cos(\hat y_i, y_j)`: ties take the mean rank they would get under
    random tie-breaking, so a constant prediction scores the chance level ``(n + 1) / 2``.

    Examples
    --------
    >>> import numpy as np
    >>> mean_rank_error(np.eye(4), np.eye(4))
    1.0
    >>> mean_rank_error(np.ones((4, 4)), np.eye(4))
    2.5
    """
    greater, ties = _ranks(Y_pred, Y_true)
    return float((1.0 + greater.double() + 0.5 * ties.double()).mean())
