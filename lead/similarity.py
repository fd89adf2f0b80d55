r"""Representation similarity between two embedding sets of the same items (any dimensions).

:func:`mutual_knn_score`, :func:`linear_cka_score`, :func:`unbiased_cka_score`,
:func:`cknna_score`, :func:`cycle_knn_score`, :func:`svcca_score`, :func:`pwcca_score`
(all also in :mod:`lead.metrics`). Inputs are validated as there (2-D, finite, equal row
counts, at least 4 rows); nothing returns NaN. The k-NN scores rank neighbours by cosine;
the CCA scores work on the singular directions of each centred set and need more pairs
than directions.
"""

from __future__ import annotations

import contextlib
import math
from numbers import Integral, Real
from typing import TypeAlias

import torch
from torch import Tensor

from lead._metric_inputs import (
    Matrix,
    _block_rows,
    _centred_unit,
    _check_k,
    _is_constant,
    _pair,
    _unit_rows,
)
from lead.errors import InvalidInputError, TooFewPairsError

__all__ = [
    "cknna_score",
    "cycle_knn_score",
    "linear_cka_score",
    "mutual_knn_score",
    "pwcca_score",
    "svcca_score",
    "unbiased_cka_score",
]

#: Singular directions below this fraction of the largest singular value are rounding noise
#: (float32 storage alone leaves about 1e-7) and take no part in CCA.
_RANK_RTOL = 1e-6


def _knn(A: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Cosines and indices, both (n, k), of each row's k nearest other rows (best first)."""
    U = _unit_rows(A)
    n = U.shape[0]
    values = torch.empty(n, k, dtype=U.dtype, device=U.device)
    indices = torch.empty(n, k, dtype=torch.int64, device=U.device)
    step = _block_rows(n)
    for start in range(0, n, step):
        stop = min(start + step, n)
        S = U[start:stop] @ U.T
        S[torch.arange(stop - start), torch.arange(start, stop)] = -torch.inf
        values[start:stop], indices[start:stop] = torch.topk(S, k, dim=1)
    return values, indices


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
        If ``k`` is not an integer (a bool is not), or ``k < 1`` or ``k >= n``.

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
    k = _check_k(k, X.shape[0])
    if _is_constant(_unit_rows(X)) or _is_constant(_unit_rows(Y)):
        return 0.0
    return _mutual_knn(_knn(X, k)[1], _knn(Y, k)[1])


def _mutual_knn(na: Tensor, nb: Tensor) -> float:
    shared = (na.unsqueeze(2) == nb.unsqueeze(1)).sum(dim=(1, 2))
    return float(shared.double().mean() / na.shape[1])


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
    Xc, Yc = _centred_unit(X), _centred_unit(Y)
    if Xc is None or Yc is None:
        return 0.0
    if n * n * (dx + dy) < n * (dx * dy + dx * dx + dy * dy):
        Kx, Ky = Xc @ Xc.T, Yc @ Yc.T
        cross, xx, yy = (Kx * Ky).sum(), torch.linalg.norm(Kx), torch.linalg.norm(Ky)
    else:
        cross = (Yc.T @ Xc).pow(2).sum()
        xx, yy = torch.linalg.norm(Xc.T @ Xc), torch.linalg.norm(Yc.T @ Yc)
    return float((cross / (xx * yy)).clamp(0.0, 1.0))


def _unbiased_hsic(Xc: Tensor, Yc: Tensor, inner: Tensor) -> Tensor:
    """HSIC_1 of column-centred ``Xc``, ``Yc`` given ``inner`` = <X Xᵀ, Y Yᵀ>_F."""
    n = Xc.shape[0]
    dx, dy = (Xc**2).sum(dim=1), (Yc**2).sum(dim=1)  # the kernel diagonals
    # Song et al.'s terms with the diagonal removed simplify for centred linear kernels:
    # 1ᵀK̃1 = -tr K and K̃1 = -diag K.
    value = inner + dx.sum() * dy.sum() / ((n - 1) * (n - 2)) - n / (n - 2) * (dx @ dy)
    return value / (n * (n - 3))


def unbiased_cka_score(A: Matrix, B: Matrix) -> float:
    r"""Linear CKA with the unbiased HSIC estimator (Song et al. 2012; Nguyen et al. 2021).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.

    Returns
    -------
    float
        In ``[-1, 1]``; best 1 (identical sets up to rotation, isotropic scaling and
        translation). Unlike :func:`linear_cka_score` it has no small-sample bias: two
        unrelated sets score about 0, slightly negative as often as positive. A set whose
        unbiased self-HSIC vanishes (all rows equal) scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error` (columns may differ); ``n >= 4`` is what the
        estimator needs.

    Notes
    -----
    With linear kernels :math:`K = AA^\top`, :math:`L = BB^\top` and :math:`\tilde K`,
    :math:`\tilde L` the same with a zeroed diagonal, the unbiased estimator [1]_ (eq. 5) is

    .. math::

        \mathrm{HSIC}_1(K, L) = \frac{1}{n(n-3)} \Big[ \operatorname{tr}(\tilde K \tilde L)
        + \frac{\mathbf 1^\top \tilde K \mathbf 1 \, \mathbf 1^\top \tilde L \mathbf 1}
               {(n-1)(n-2)}
        - \frac{2}{n-2} \mathbf 1^\top \tilde K \tilde L \mathbf 1 \Big],

    and the score is :math:`\mathrm{HSIC}_1(K, L) / \sqrt{\mathrm{HSIC}_1(K, K)\,
    \mathrm{HSIC}_1(L, L)}` [2]_, as ``unbiased_cka`` / ``hsic_unbiased`` in
    ``minyoungg/platonic-rep`` ``metrics.py`` [3]_ without its ``+ 1e-6`` in the denominator
    (which made the score depend on the scale of the vectors). The estimator is invariant to
    translating either set, so the columns are centred first; then every term comes from
    :math:`\|B^\top A\|_F^2` and the row norms, in :math:`O(n\,d_{src} d_{tgt})` without an
    ``(n, n)`` matrix (the Gram form is used when ``n`` is smaller than the dimensions).

    References
    ----------
    .. [1] L. Song, A. Smola, A. Gretton, J. Bedo, K. Borgwardt, "Feature Selection via
       Dependence Maximization", JMLR 13 (2012) 1393-1434.
    .. [2] T. Nguyen, M. Raghu, S. Kornblith, "Do Wide and Deep Networks Learn the Same
       Things?", ICLR 2021, arXiv:2010.15327.
    .. [3] M. Huh, B. Cheung, T. Wang, P. Isola, "The Platonic Representation Hypothesis",
       ICML 2024, arXiv:2405.07987; code: github.com/minyoungg/platonic-rep.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.random.default_rng(0).normal(size=(50, 8))
    >>> round(unbiased_cka_score(A, 3.0 * A + 1.0), 12)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    Xc, Yc = _centred_unit(X), _centred_unit(Y)
    if Xc is None or Yc is None:
        return 0.0
    n, dx, dy = X.shape[0], X.shape[1], Y.shape[1]
    if n * n * (dx + dy) < n * (dx * dy + dx * dx + dy * dy):
        Kx, Ky = Xc @ Xc.T, Yc @ Yc.T
        xy, xx, yy = (Kx * Ky).sum(), (Kx**2).sum(), (Ky**2).sum()
    else:
        xy = (Yc.T @ Xc).pow(2).sum()
        xx, yy = (Xc.T @ Xc).pow(2).sum(), (Yc.T @ Yc).pow(2).sum()
    hxx, hyy = _unbiased_hsic(Xc, Xc, xx), _unbiased_hsic(Yc, Yc, yy)
    # HSIC_1(K, K) is a sum of squares (Székely & Rizzo's U-centring); rounding aside it is
    # 0 only when the kernel has no off-diagonal structure left.
    if float(hxx) <= 1e-12 * float(xx) or float(hyy) <= 1e-12 * float(yy):
        return 0.0
    value = _unbiased_hsic(Xc, Yc, xy) / torch.sqrt(hxx * hyy)
    return float(value.clamp(-1.0, 1.0))


def _sparse_hsic(n: int, rows: Tensor, cols: Tensor, k_vals: Tensor, l_vals: Tensor) -> float:
    """HSIC_1 (Song et al. eq. 5) of two ``(n, n)`` matrices with a zero diagonal that are
    zero except ``K[rows, cols] = k_vals`` and ``L[rows, cols] = l_vals`` (no repeats)."""
    if rows.numel() == 0:
        return 0.0
    ordered = torch.sort(rows * n + cols).values
    transposed = cols * n + rows
    at = torch.searchsorted(ordered, transposed).clamp_max(ordered.numel() - 1)
    mirrored = ordered[at] == transposed  # (j, i) is also in the pattern
    # tr(K L) = Σ K_ij L_ji, and L_ji = L_ij where both are in the pattern (L is symmetric).
    trace = (k_vals[mirrored] * l_vals[mirrored]).sum()
    k_cols = torch.zeros(n, dtype=k_vals.dtype, device=k_vals.device).index_add_(0, cols, k_vals)
    l_rows = torch.zeros(n, dtype=l_vals.dtype, device=l_vals.device).index_add_(0, rows, l_vals)
    value = (
        trace
        + k_vals.sum() * l_vals.sum() / ((n - 1) * (n - 2))
        - 2.0 * (k_cols @ l_rows) / (n - 2)
    )
    return float(value) / (n * (n - 3))


def cknna_score(A: Matrix, B: Matrix, *, k: int = 10) -> float:
    r"""Centred kernel nearest-neighbour alignment, CKNNA (Huh et al. 2024).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.
    k : int, default 10
        Neighbourhood size, ``2 <= k < n`` (the reference refuses ``k < 2``).

    Returns
    -------
    float
        In ``[-1, 1]``; best 1 (identical neighbourhoods and similarities, e.g. ``B`` a
        rotation or rescaling of ``A``). Unrelated sets score about 0. A set whose rows all
        point the same way, or whose masked self-HSIC is not positive, scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error` (columns may differ).
    InvalidInputError
        If ``k`` is not an integer (a bool is not), or ``k < 2`` or ``k >= n``.

    Notes
    -----
    Rows are L2-normalised first, as the reference pipeline (``measure_alignment.py``) does
    before every metric, so :math:`K_{ij} = \cos(a_i, a_j)` and :math:`L_{ij} = \cos(b_i,
    b_j)`. With :math:`N^K_k(i)` the ``k`` largest :math:`K_{ij}`, :math:`j \ne i`, and the
    mask :math:`M^{KL}_{ij} = [j \in N^K_k(i)]\,[j \in N^L_k(i)]`,

    .. math::

        \mathrm{CKNNA} = \frac{\mathrm{HSIC}_1(M^{KL} \odot K, M^{KL} \odot L)}
        {\sqrt{\mathrm{HSIC}_1(M^{KK} \odot K, M^{KK} \odot K)\,
               \mathrm{HSIC}_1(M^{LL} \odot L, M^{LL} \odot L)}}

    with :math:`\mathrm{HSIC}_1` the unbiased estimator of :func:`unbiased_cka_score` (the
    masks are not symmetric; :math:`\operatorname{tr}(KL) = \sum_{ij} K_{ij} L_{ji}` as in
    the reference). This is ``cknna`` of ``minyoungg/platonic-rep`` ``metrics.py`` with its
    defaults (``unbiased=True``, ``distance_agnostic=False``), without the ``+ 1e-6`` in the
    denominator, and clipped to ``[-1, 1]`` (the masks differ between numerator and
    denominator, so Cauchy-Schwarz does not bound it). Each mask has at most ``k`` entries
    per row and is kept sparse: memory is :math:`O(nk)` beyond the blocked k-NN search. With
    ``k = n - 1`` every off-diagonal pair is kept and the score equals
    :func:`unbiased_cka_score` of the L2-normalised rows. Ties among neighbours are broken
    by ``torch.topk``.

    References
    ----------
    .. [1] M. Huh, B. Cheung, T. Wang, P. Isola, "The Platonic Representation Hypothesis",
       ICML 2024, arXiv:2405.07987; code: github.com/minyoungg/platonic-rep.
    .. [2] L. Song et al., "Feature Selection via Dependence Maximization", JMLR 13 (2012).

    Examples
    --------
    >>> import numpy as np
    >>> A = np.random.default_rng(0).normal(size=(40, 6))
    >>> round(cknna_score(A, 2.0 * A, k=5), 12)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    n = X.shape[0]
    k = _check_k(k, n, minimum=2)
    if _is_constant(_unit_rows(X)) or _is_constant(_unit_rows(Y)):
        return 0.0
    return _cknna(_knn(X, k), _knn(Y, k))


def _cknna(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> float:
    """CKNNA from each side's k-NN ``(cosines, indices)``, both of shape (n, k)."""
    (ka, na), (kb, nb) = a, b
    n, k = na.shape
    rows = torch.arange(n, device=na.device).repeat_interleave(k)
    kk = _sparse_hsic(n, rows, na.reshape(-1), ka.reshape(-1), ka.reshape(-1))
    ll = _sparse_hsic(n, rows, nb.reshape(-1), kb.reshape(-1), kb.reshape(-1))
    if kk <= 0.0 or ll <= 0.0:
        return 0.0
    same = na.unsqueeze(2) == nb.unsqueeze(1)  # (n, k, k): A's m-th neighbour is B's l-th
    shared = same.any(dim=2).reshape(-1)
    kb_at_na = (same * kb.unsqueeze(1)).sum(dim=2).reshape(-1)  # L at A's neighbours
    kl = _sparse_hsic(
        n, rows[shared], na.reshape(-1)[shared], ka.reshape(-1)[shared], kb_at_na[shared]
    )
    return min(1.0, max(-1.0, kl / math.sqrt(kk * ll)))


def cycle_knn_score(A: Matrix, B: Matrix, *, k: int = 10) -> float:
    r"""Cycle k-nearest-neighbour consistency from ``A`` through ``B`` (Huh et al. 2024).

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
        In ``[0, 1]``; best 1. Not symmetric in ``A`` and ``B``. Even ``B = A`` scores
        below 1 when the k-NN relation is not symmetric (``j`` among ``i``'s neighbours but
        not ``i`` among ``j``'s); two unrelated sets score about
        :math:`1 - (1 - k/(n-1))^k \approx k^2/n`. A set whose rows all point the same
        way has no neighbourhood structure and scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As :func:`mean_squared_error` (columns may differ).
    InvalidInputError
        If ``k`` is not an integer (a bool is not), or ``k < 1`` or ``k >= n``.

    Notes
    -----
    Item ``i`` completes a cycle when some :math:`j \in N^B_k(i)` has
    :math:`i \in N^A_k(j)`: going to a neighbour in ``B`` and back to a neighbour in ``A``
    can return to ``i``. The score is the fraction of items that do,

    .. math::

        \frac{1}{n} \sum_i \big[\exists\, j \in N^B_k(i) : i \in N^A_k(j)\big],

    ``cycle_knn`` of ``minyoungg/platonic-rep`` ``metrics.py``
    (``compute_knn_accuracy(knn_A[knn_B])``), with neighbours by cosine (the reference
    pipeline L2-normalises rows first) and ties broken by ``torch.topk``. Membership is
    looked up in sorted neighbour lists: :math:`O(nk \log nk)` beyond the k-NN search.

    References
    ----------
    .. [1] M. Huh, B. Cheung, T. Wang, P. Isola, "The Platonic Representation Hypothesis",
       ICML 2024, arXiv:2405.07987; code: github.com/minyoungg/platonic-rep.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> cycle_knn_score(A, A, k=1)  # mutual nearest pairs 0-1 and 2-3
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    n = X.shape[0]
    k = _check_k(k, n)
    if _is_constant(_unit_rows(X)) or _is_constant(_unit_rows(Y)):
        return 0.0
    return _cycle_knn(_knn(X, k)[1], _knn(Y, k)[1])


def _cycle_knn(na: Tensor, nb: Tensor) -> float:
    n, k = na.shape
    items = torch.arange(n, device=na.device).unsqueeze(1)
    edges = torch.sort((items * n + na).reshape(-1)).values  # j -> l for l in N_A(j)
    back = (nb * n + items).reshape(-1)  # j -> i for j in N_B(i)
    at = torch.searchsorted(edges, back).clamp_max(edges.numel() - 1)
    closed = (edges[at] == back).reshape(n, k).any(dim=1)
    return float(closed.double().mean())


def _singular_directions(M: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD ``U, s, Vh`` of the centred, unit-norm ``M`` without the directions below
    ``_RANK_RTOL`` of the largest; empty (rank 0) when ``M`` does not vary."""
    C = _centred_unit(M)
    if C is None:
        return M[:, :0], M.new_zeros(0), M[:0]
    U, s, Vh = torch.linalg.svd(C, full_matrices=False)
    r = int((s > _RANK_RTOL * s[0]).sum())
    return U[:, :r], s[:r], Vh[:r]


def _check_cca_pairs(n: int, p: int, q: int) -> None:
    """CCA of ``p`` and ``q`` directions needs ``n > p + q`` pairs (Kornblith et al. 2019)."""
    if n <= p + q:
        raise TooFewPairsError(
            f"CCA between {p} and {q} directions needs more than {p + q} pairs, got {n}: with "
            "fewer, the two centred subspaces must share directions and canonical "
            "correlations of 1 appear by construction; send more pairs (or, for SVCCA, keep "
            "fewer directions)",
            minimum=p + q + 1,
            got=n,
            param="A",
        )


def _check_keep(keep: object) -> int | float:
    """An int ``>= 1`` (directions) or a float in ``(0, 1]`` (variance share)."""
    if isinstance(keep, bool) or not isinstance(keep, Real):
        raise InvalidInputError(f"keep must be an int or a float, got {keep!r}", param="keep")
    if isinstance(keep, Integral):
        if keep < 1:
            raise InvalidInputError(
                f"keep as a number of directions must be at least 1, got {keep}", param="keep"
            )
        return int(keep)
    share = float(keep)
    if not 0.0 < share <= 1.0:  # NaN fails too
        raise InvalidInputError(
            f"keep as a share of variance must be in (0, 1], got {keep!r} (an int counts "
            "directions)",
            param="keep",
        )
    return share


def _kept(s: Tensor, keep: int | float) -> int:
    """Leading singular directions to keep: ``keep`` of them, or the fewest whose share of
    the variance (sum of squared singular values) reaches ``keep``."""
    if isinstance(keep, int):
        return min(keep, s.numel())
    share = torch.cumsum(s**2, dim=0) / (s**2).sum()
    return min(int(torch.searchsorted(share, keep)) + 1, s.numel())


def svcca_score(A: Matrix, B: Matrix, *, keep: int | float = 10) -> float:
    r"""Singular vector canonical correlation analysis, SVCCA (Raghu et al. 2017).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.
    keep : int or float, default 10
        Singular directions kept on each side before CCA: an int keeps that many (fewer if
        the set has fewer; 10 is ``cca_dim`` of the ``platonic-rep`` package), a float in
        ``(0, 1]`` keeps the fewest that explain that share of the variance (Raghu et al.
        used 0.99). As in scikit-learn's ``PCA(n_components=...)``, ``1`` means one
        direction and ``1.0`` all of them.

    Returns
    -------
    float
        In ``[0, 1]``; best 1. Invariant to rotations, isotropic scaling and translation of
        either set (and, with ``keep=1.0``, to any invertible linear map). A set with no
        variance scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError
        As :func:`mean_squared_error` (columns may differ).
    TooFewPairsError
        Fewer than 4 rows, or ``n <= p + q`` for the ``p`` and ``q`` kept directions: then
        correlations of 1 appear by construction.
    InvalidInputError
        If ``keep`` is not an int ``>= 1`` or a float in ``(0, 1]`` (a bool is neither).

    Notes
    -----
    Each set is centred and reduced by SVD, :math:`A - \bar a = U_A S_A V_A^\top`, to its
    first ``p`` left singular vectors :math:`U_A^{(p)}` (directions with a singular value
    below :math:`10^{-6}` of the largest are rounding noise and dropped first). Those are
    already whitened, so the canonical correlations :math:`\rho_1 \ge \dots \ge
    \rho_{\min(p, q)}` are the singular values of :math:`U_A^{(p)\top} U_B^{(q)}`
    (Björck & Golub's method: no covariance inverse, stable for rank-deficient sets), and

    .. math::

        \mathrm{SVCCA} = \frac{1}{\min(p, q)} \sum_i \rho_i .

    The ``svcca`` of ``minyoungg/platonic-rep`` ``metrics.py`` also standardises each
    column, uses a randomised SVD and scikit-learn's iterative CCA and adds noise against
    NaN; this is the exact, deterministic version of the definition in [1]_ and
    ``google/svcca`` ``cca_core.py``. CCA overfits when ``p + q`` approaches ``n``: the
    default ``keep=10`` stays meaningful from a few hundred pairs, ``0.99`` needs many more
    pairs than dimensions [3]_.

    References
    ----------
    .. [1] M. Raghu, J. Gilmer, J. Yosinski, J. Sohl-Dickstein, "SVCCA: Singular Vector
       Canonical Correlation Analysis for Deep Learning Dynamics and Interpretability",
       NeurIPS 2017, arXiv:1706.05806; code: github.com/google/svcca.
    .. [2] M. Huh, B. Cheung, T. Wang, P. Isola, "The Platonic Representation Hypothesis",
       ICML 2024, arXiv:2405.07987; code: github.com/minyoungg/platonic-rep.
    .. [3] S. Kornblith, M. Norouzi, H. Lee, G. Hinton, "Similarity of Neural Network
       Representations Revisited", ICML 2019, arXiv:1905.00414.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(100, 6))
    >>> round(svcca_score(A, A @ rng.normal(size=(6, 6)), keep=1.0), 12)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    keep = _check_keep(keep)
    return _svcca(_singular_directions(X), _singular_directions(Y), keep)


_Directions: TypeAlias = tuple[Tensor, Tensor, Tensor]


def _svcca(x: _Directions, y: _Directions, keep: int | float) -> float:
    (Ux, sx, _), (Uy, sy, _) = x, y
    if sx.numel() == 0 or sy.numel() == 0:
        return 0.0
    p, q = _kept(sx, keep), _kept(sy, keep)
    _check_cca_pairs(Ux.shape[0], p, q)
    rho = torch.linalg.svdvals(Ux[:, :p].T @ Uy[:, :q]).clamp(0.0, 1.0)
    return float(rho.mean())


def pwcca_score(A: Matrix, B: Matrix) -> float:
    r"""Projection-weighted canonical correlation analysis, PWCCA (Morcos et al. 2018).

    Parameters
    ----------
    A : array or Tensor of shape (n, d_src)
        One model's vectors.
    B : array or Tensor of shape (n, d_tgt)
        The other model's vectors of the same items; the dimension may differ.

    Returns
    -------
    float
        In ``[0, 1]``; best 1. The weights come from the set with fewer directions (``A``
        on a tie), so the score is not symmetric in general. Invariant to any invertible
        linear map of the other set, and to translation, isotropic scaling, permutation
        and sign flips of the columns of the weighted one (not to its rotations: the
        weights sum absolute values over its columns). A set with no variance scores 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError
        As :func:`mean_squared_error` (columns may differ).
    TooFewPairsError
        Fewer than 4 rows, or ``n <= r_A + r_B`` for the ranks of the centred sets: then
        the two subspaces share directions and correlations of 1 appear by construction
        (e.g. 400 pairs of 384- and 768-dimensional vectors).

    Notes
    -----
    CCA of all directions of the centred sets (rank ``r_A``, ``r_B`` after dropping
    singular values below :math:`10^{-6}` of the largest), computed as in
    :func:`svcca_score` from the SVD of :math:`U_A^\top U_B = P\,\mathrm{diag}(\rho)\,Q^\top`,
    gives correlations :math:`\rho_i` and, on the weighted side (say ``A``, :math:`r_A \le
    r_B`), unit canonical variates :math:`h_i = U_A p_i \in \mathbb R^n`. Each is weighted
    by how much of the set's columns :math:`a_{:,j}` (centred) it accounts for:

    .. math::

        \tilde\alpha_i = \sum_j |\langle h_i, a_{:,j}\rangle|, \qquad
        \mathrm{PWCCA} = \frac{\sum_i \tilde\alpha_i \rho_i}{\sum_i \tilde\alpha_i} .

    This is the definition of [1]_ (eqs. 2-3). ``compute_pwcca`` in ``google/svcca``
    ``pwcca.py`` differs: it projects the uncentred activations on ``coef_x`` without the
    whitening ``invsqrt_xx`` (then orthonormalises by QR), and when ``B`` is the smaller
    side it indexes ``A``'s activations (google/svcca pull request #9). Here the variates
    are the exact canonical variates, which are orthonormal already.

    References
    ----------
    .. [1] A. Morcos, M. Raghu, S. Bengio, "Insights on representational similarity in
       neural networks with canonical correlation", NeurIPS 2018, arXiv:1806.05759; code:
       github.com/google/svcca.
    .. [2] S. Kornblith, M. Norouzi, H. Lee, G. Hinton, "Similarity of Neural Network
       Representations Revisited", ICML 2019, arXiv:1905.00414.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.normal(size=(100, 4))
    >>> round(pwcca_score(A, A @ rng.normal(size=(4, 7))), 12)
    1.0
    """
    X, Y = _pair(A, B, ("A", "B"), same_dim=False)
    return _pwcca(_singular_directions(X), _singular_directions(Y))


def _pwcca(x: _Directions, y: _Directions) -> float:
    (Ux, sx, Vx), (Uy, sy, Vy) = x, y
    if sx.numel() == 0 or sy.numel() == 0:
        return 0.0
    _check_cca_pairs(Ux.shape[0], sx.numel(), sy.numel())
    if sy.numel() < sx.numel():  # weight by the side with fewer directions
        (Ux, sx, Vx), (Uy, sy, Vy) = (Uy, sy, Vy), (Ux, sx, Vx)
    P, rho, _ = torch.linalg.svd(Ux.T @ Uy, full_matrices=False)
    # <h_i, a_j> for h = U P and centred A = U S Vh: the rows of Pᵀ S Vh.
    alpha = (P.T @ (sx.unsqueeze(1) * Vx)).abs().sum(dim=1)
    return float((alpha * rho.clamp(0.0, 1.0)).sum() / alpha.sum())


_KNN_SCORES = ("mutual_knn_score", "cknna_score", "cycle_knn_score")
_Neighbours: TypeAlias = tuple[Tensor, Tensor]


def _knn_scores(X: Tensor, Y: Tensor, k: int) -> dict[str, float]:
    """:func:`mutual_knn_score`, :func:`cknna_score` and :func:`cycle_knn_score` (``X``
    through ``Y``) of two validated sets, from one k-NN search per side (``2 <= k < n``)."""
    return _knn_and_shuffled(X, Y, k, None)[0]


def _knn_and_shuffled(
    X: Tensor, Y: Tensor, k: int, shuffle: Tensor | None
) -> tuple[dict[str, float], dict[str, float] | None]:
    """:func:`_knn_scores` of ``(X, Y)`` and, with a row permutation ``shuffle``, of
    ``(X, Y[shuffle])`` too, sharing ``X``'s neighbour search. (``Y[shuffle]`` is searched
    again rather than relabelled: with tied similarities, e.g. repeated rows, the order of
    the ties decides which neighbours count.)"""
    if _is_constant(_unit_rows(X)) or _is_constant(_unit_rows(Y)):
        zeros = dict.fromkeys(_KNN_SCORES, 0.0)
        return zeros, None if shuffle is None else dict(zeros)
    a = _knn(X, k)
    scores = _knn_from(a, _knn(Y, k))
    return scores, None if shuffle is None else _knn_from(a, _knn(Y[shuffle], k))


def _knn_from(a: _Neighbours, b: _Neighbours) -> dict[str, float]:
    return {
        "mutual_knn_score": _mutual_knn(a[1], b[1]),
        "cknna_score": _cknna(a, b),
        "cycle_knn_score": _cycle_knn(a[1], b[1]),
    }


def _cca_scores(X: Tensor, Y: Tensor, *, keep: int | float = 10) -> dict[str, float | None]:
    """:func:`svcca_score` and :func:`pwcca_score` of two validated sets from one SVD per
    side; None for a score that has too few pairs for its directions."""
    return _cca_and_shuffled(X, Y, None, keep=keep)[0]


def _cca_and_shuffled(
    X: Tensor, Y: Tensor, shuffle: Tensor | None, *, keep: int | float = 10
) -> tuple[dict[str, float | None], dict[str, float | None] | None]:
    """:func:`_cca_scores` of ``(X, Y)`` and, with a row permutation ``shuffle``, of
    ``(X, Y[shuffle])`` too, from the same two SVDs (permuting rows permutes ``U``)."""
    x, y = _singular_directions(X), _singular_directions(Y)
    if shuffle is None:
        return _cca_from(x, y, keep), None
    return _cca_from(x, y, keep), _cca_from(x, (y[0][shuffle], y[1], y[2]), keep)


def _cca_from(x: _Directions, y: _Directions, keep: int | float) -> dict[str, float | None]:
    out: dict[str, float | None] = {"svcca_score": None, "pwcca_score": None}
    with contextlib.suppress(TooFewPairsError):
        out["svcca_score"] = _svcca(x, y, keep)
    with contextlib.suppress(TooFewPairsError):
        out["pwcca_score"] = _pwcca(x, y)
    return out
