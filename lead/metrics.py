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
:func:`linear_cka_score`.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import torch
from torch import Tensor

from lead._validation import as_matrix
from lead.errors import InvalidInputError, ShapeMismatchError, TooFewPairsError

__all__ = [
    "MIN_PAIRS",
    "linear_cka_score",
    "mean_cosine_similarity",
    "mean_rank_error",
    "mean_squared_error",
    "mutual_knn_score",
    "r2_score",
    "top1_accuracy_score",
]

#: numpy array or torch tensor, converted to float64 by :func:`lead._validation.as_matrix`.
Matrix: TypeAlias = "np.ndarray | Tensor"

#: Fewest paired rows any metric accepts.
MIN_PAIRS = 4
#: Largest number of float64 similarities held at once by the blocked computations.
_BLOCK_ELEMENTS = 1 << 22
#: A set whose spread is below this fraction of its size counts as constant.
_CONSTANT_TOL = 1e-9


def _pair(a: Matrix, b: Matrix, names: tuple[str, str], *, same_dim: bool) -> tuple[Tensor, Tensor]:
    """Validate two paired matrices; return them as float64 tensors on ``a``'s device."""
    A = as_matrix(a, name=names[0])
    B = as_matrix(b, name=names[1]).to(A.device)
    if A.shape[0] != B.shape[0]:
        raise ShapeMismatchError(
            f"{names[0]} has {A.shape[0]} rows but {names[1]} has {B.shape[0]}; "
            "paired sets need the same row count",
            expected=A.shape[0],
            got=B.shape[0],
            param=names[1],
        )
    if same_dim and A.shape[1] != B.shape[1]:
        raise ShapeMismatchError(
            f"{names[0]} has {A.shape[1]} columns but {names[1]} has {B.shape[1]}",
            expected=A.shape[1],
            got=B.shape[1],
            param=names[1],
        )
    if A.shape[0] < MIN_PAIRS:
        raise TooFewPairsError(
            f"need at least {MIN_PAIRS} paired rows, got {A.shape[0]}",
            minimum=MIN_PAIRS,
            got=A.shape[0],
            param=names[0],
        )
    return A, B


def _unit_rows(A: Tensor) -> Tensor:
    """L2-normalise rows; an all-zero row stays zero (cosine 0 with everything).

    Rows are first divided by their largest entry, so that neither huge (1e200) nor tiny
    (1e-300) finite values overflow or underflow when squared.
    """
    A = A / A.abs().amax(dim=1, keepdim=True).clamp_min(1e-300)
    return torch.nn.functional.normalize(A, dim=1, eps=1e-300)


def _common_scale(*mats: Tensor) -> float:
    """Largest absolute entry of the matrices (1 when all are zero)."""
    scale = max(float(M.abs().max()) for M in mats)
    return scale if scale > 0 else 1.0


def _block_rows(n: int) -> int:
    return max(1, _BLOCK_ELEMENTS // max(n, 1))


def _is_constant(A: Tensor) -> bool:
    """True when every row equals the first (up to ``_CONSTANT_TOL`` of the set's size)."""
    spread = float((A - A[:1]).abs().max())
    return spread <= _CONSTANT_TOL * max(float(A.abs().max()), 1e-300)


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


def _knn(A: Tensor, k: int) -> Tensor:
    """Indices (n, k) of each row's k nearest other rows by cosine."""
    U = _unit_rows(A)
    n = U.shape[0]
    out = torch.empty(n, k, dtype=torch.int64, device=U.device)
    step = _block_rows(n)
    for start in range(0, n, step):
        stop = min(start + step, n)
        S = U[start:stop] @ U.T
        S[torch.arange(stop - start), torch.arange(start, stop)] = -torch.inf
        out[start:stop] = torch.topk(S, k, dim=1).indices
    return out


def mutual_knn_score(A: Matrix, B: Matrix, *, k: int = 10) -> float:
    r"""Mutual k-nearest-neighbour alignment of two paired sets (Huh et al. 2024).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.
    k : int, default 10
        Neighbourhood size, ``1 <= k < n``.

    Returns
    -------
    float
        In ``[0, 1]``; best 1. Two unrelated sets score about ``k / (n - 1)``.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error` (columns may differ).
    InvalidInputError
        If ``k < 1`` or ``k >= n``.

    Notes
    -----
    :math:`\frac{1}{n}\sum_i |N^A_k(i) \cap N^B_k(i)| / k`, where :math:`N^A_k(i)` are the
    ``k`` rows of ``A`` with the highest cosine to row ``i``, itself excluded. Ties among
    neighbours are broken by ``torch.topk``. A set whose rows are all equal has no
    neighbourhood structure and scores 0 (the mean-estimator baseline).

    References
    ----------
    .. [1] M. Huh, B. Cheung, T. Wang, P. Isola, "The Platonic Representation Hypothesis",
       ICML 2024, arXiv:2405.07987.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.random.default_rng(0).normal(size=(20, 5))
    >>> mutual_knn_score(A, A, k=3)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    n = X.shape[0]
    if not 1 <= k < n:
        raise InvalidInputError(f"k must satisfy 1 <= k < n={n}, got k={k}", param="k")
    if _is_constant(_unit_rows(X)) or _is_constant(_unit_rows(Y)):
        return 0.0
    na, nb = _knn(X, k), _knn(Y, k)
    shared = (na.unsqueeze(2) == nb.unsqueeze(1)).sum(dim=(1, 2))
    return float(shared.double().mean() / k)


def linear_cka_score(A: Matrix, B: Matrix) -> float:
    r"""Linear centred kernel alignment of two paired sets (Kornblith et al. 2019).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.

    Returns
    -------
    float
        In ``[0, 1]``; best 1. Invariant to rotations and isotropic scaling of either set.
        A set with no variance (all rows equal) scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error` (columns may differ).

    Notes
    -----
    With column-centred :math:`X` and :math:`Y`,

    .. math::

        \mathrm{CKA}(X, Y) = \frac{\|Y^\top X\|_F^2}{\|X^\top X\|_F\,\|Y^\top Y\|_F}.

    The feature-space form costs :math:`O(n d^2)`, cheap for :math:`n \gg d`; when ``n`` is
    smaller than the dimensions the equal Gram form
    :math:`\langle XX^\top, YY^\top\rangle_F / (\|XX^\top\|_F \|YY^\top\|_F)` is used.

    References
    ----------
    .. [1] S. Kornblith, M. Norouzi, H. Lee, G. Hinton, "Similarity of Neural Network
       Representations Revisited", ICML 2019, arXiv:1905.00414.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.random.default_rng(0).normal(size=(50, 8))
    >>> round(linear_cka_score(A, 3.0 * A), 12)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    n, dx, dy = X.shape[0], X.shape[1], Y.shape[1]
    centred = []
    for M in (X, Y):
        M = M / _common_scale(M)  # CKA is scale-invariant; keeps squares finite
        C = M - M.mean(dim=0, keepdim=True)
        size, spread = float(torch.linalg.norm(M)), float(torch.linalg.norm(C))
        if spread <= _CONSTANT_TOL * size or spread == 0.0:
            return 0.0
        centred.append(C / spread)  # CKA is scale-invariant; unit norm keeps sums tame
    Xc, Yc = centred
    if n * n * (dx + dy) < n * (dx * dy + dx * dx + dy * dy):
        Kx, Ky = Xc @ Xc.T, Yc @ Yc.T
        cross, xx, yy = (Kx * Ky).sum(), torch.linalg.norm(Kx), torch.linalg.norm(Ky)
    else:
        cross = (Yc.T @ Xc).pow(2).sum()
        xx, yy = torch.linalg.norm(Xc.T @ Xc), torch.linalg.norm(Yc.T @ Yc)
    return float((cross / (xx * yy)).clamp(0.0, 1.0))
