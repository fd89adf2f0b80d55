"""Closed-form stitch fits from paired embeddings: ridge and orthogonal Procrustes.

:func:`lead.fitting.fit_stitch` picks a method by name; the trained methods (MLP,
invertible) start from these fits. They run in float64 with ``torch.linalg`` eigen/singular value
decompositions (never an explicit inverse), so rank-deficient data gives a finite,
minimum-norm answer instead of NaN. The fitted stitches hold float32 parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lead._options import check_float_option
from lead._validation import check_bool, check_fitted, check_pairs
from lead.errors import FitError, InvalidInputError, TooFewPairsError
from lead.splits import holdout_split
from lead.stitches import AffineStitch, OrthogonalStitch

__all__ = ["DEFAULT_RIDGE_ALPHAS", "ProgressCallback", "fit_procrustes", "fit_ridge"]

#: ``progress(stage, step, total)``; may raise :class:`~lead.errors.JobCancelledError`.
ProgressCallback = Callable[[str, int, int], None]

#: Ridge strengths tried on held-out pairs, in units of the mean squared norm of the
#: source rows (1 for unit-length vectors), so that the choice does not depend on the
#: source vectors' scale.
DEFAULT_RIDGE_ALPHAS: tuple[float, ...] = tuple(10.0 ** (k / 2) for k in range(-14, 3))

_RIDGE_HOLDOUT = 0.2
_FALLBACK_ALPHA = 1e-3


def _centre(X: Tensor, Y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mean_x, mean_y = X.mean(dim=0), Y.mean(dim=0)
    return X - mean_x, Y - mean_y, mean_x, mean_y


def _ridge_factors(Xc: Tensor, Yc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Eigenvalues ``lam``, eigenvectors ``V`` of ``C = Xcᵀ Xc / n`` and ``P = Vᵀ Xcᵀ Yc / n``.

    With fewer rows than columns (``n < d``), only the ``n`` directions of the rows' span,
    from the thin SVD of ``Xc`` (``O(n² d)`` instead of the ``O(d³)`` of ``C``'s
    eigendecomposition: 8 pairs of dimension 3,000 took 48 s in ``POST /v1/align``). The
    other eigenvalues of ``C`` are 0 and ``P``'s rows there are 0, so the ridge weight is
    the same. The SVD is of the tall ``Xcᵀ`` (its left vectors are ``V``): the same
    factors, 3-5x faster than of the wide ``Xc`` (80 x 16,384: 0.13 s instead of 0.5 s;
    800 x 4,096: 2.6 s instead of 7.5 s)."""
    n, d = Xc.shape
    try:
        if n < d:
            V, S, _ = torch.linalg.svd(Xc.T, full_matrices=False)
            lam = S**2 / n
        else:
            lam, V = torch.linalg.eigh(Xc.T @ Xc / n)
    except RuntimeError as error:  # torch.linalg.LinAlgError
        raise FitError(f"ridge eigendecomposition failed: {error}") from None
    P = V.T @ (Xc.T @ Yc / n)
    return lam.clamp_min(0.0), V, P


def _inverse(lam: Tensor, alpha: float) -> Tensor:
    """``1 / (lam + alpha)``, with 0 where the denominator is numerically zero (pseudo-inverse)."""
    denom = lam + alpha
    tol = max(float(lam.max()) * lam.shape[0] * torch.finfo(lam.dtype).eps, 1e-300)
    keep = denom > tol
    return torch.where(keep, 1.0 / torch.where(keep, denom, 1.0), 0.0)


def _ridge_weight(lam: Tensor, V: Tensor, P: Tensor, alpha: float) -> Tensor:
    """``Wᵀ = V diag(1 / (lam + alpha)) P`` of shape (d_src, d_tgt)."""
    return V @ (_inverse(lam, alpha)[:, None] * P)


def _check_alpha(alpha: Any, param: str) -> float:
    return check_float_option(alpha, param, minimum=0.0)


def _select_alpha(X: Tensor, Y: Tensor, alphas: Sequence[float], seed: int) -> dict[str, Any]:
    train_idx, test_idx = holdout_split(X.shape[0], _RIDGE_HOLDOUT, seed)
    tr, te = torch.from_numpy(train_idx), torch.from_numpy(test_idx)
    Xc, Yc, mean_x, mean_y = _centre(X[tr], Y[tr])
    lam, V, P = _ridge_factors(Xc, Yc)
    Z = (X[te] - mean_x) @ V  # held-out rows in the eigenbasis, (n_test, d_src)
    Y_test = Y[te] - mean_y
    errors = []
    for alpha in alphas:
        prediction = Z @ (_inverse(lam, alpha)[:, None] * P)
        errors.append(float(((prediction - Y_test) ** 2).mean()))
    best = min(range(len(alphas)), key=lambda i: (errors[i], -alphas[i]))
    return {
        "alpha": float(alphas[best]),
        "alpha_selection": "holdout",
        "alpha_holdout_fraction": _RIDGE_HOLDOUT,
        "alpha_holdout_mse": {f"{a:.3g}": e for a, e in zip(alphas, errors, strict=True)},
    }


def fit_ridge(
    X: Any,
    Y: Any,
    *,
    alpha: float | None = None,
    alphas: Sequence[float] = DEFAULT_RIDGE_ALPHAS,
    seed: int = 0,
) -> AffineStitch:
    r"""Fit an affine stitch by centred ridge least squares.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors, ``n >= 4``.
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    alpha : float, optional
        Ridge strength on the per-pair scale (see Notes); ``0`` gives ordinary (minimum-norm)
        least squares. When omitted, each of ``alphas`` is fitted on 80 % of the pairs and
        the one with the lowest mean squared error on the other 20 % (split by ``seed``)
        is refitted on all pairs.
    alphas : sequence of float, default :data:`DEFAULT_RIDGE_ALPHAS` (1e-7 … 10, log grid)
        Candidate strengths when ``alpha`` is None, in units of the mean squared row norm
        :math:`s^2 = \frac1n \sum_i \lVert x_i \rVert^2` of ``X`` (1 for unit-length
        vectors): each is tried as ``a * s**2``, so scaling ``X`` by ``c`` scales the
        strengths by ``c**2`` and the held-out choice, and the fit's predictions, stay
        the same. At most :data:`MAX_ALPHAS`.
    seed : int, default 0
        Seed of the held-out split used to choose ``alpha``.

    Returns
    -------
    AffineStitch
        float32 parameters (gradients off); ``info.fit`` holds the chosen ``alpha``, how
        it was chosen and, when chosen from ``alphas``, their unit ``alpha_unit`` (s²).

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        For inputs that are not finite 2-D pairs (within the float32 range), or fewer
        than 4 pairs.
    IllConditionedError
        If the column spreads of ``X`` or ``Y`` are too far apart for float32.
    InvalidInputError
        For a negative or non-finite ``alpha``, or ``alphas`` empty, longer than
        :data:`MAX_ALPHAS` or holding such a value.
    FitError
        If the eigendecomposition fails, or the float32 stitch would hold or produce NaN
        or infinity.

    Notes
    -----
    With :math:`X_c = X - \bar x`, :math:`Y_c = Y - \bar y`, the weight minimises
    :math:`\frac1n\lVert Y_c - X_c W^\top\rVert_F^2 + \alpha\lVert W\rVert_F^2`, so
    :math:`W^\top = (C + \alpha I)^{+} X_c^\top Y_c / n` with :math:`C = X_c^\top X_c / n`.
    It is computed from the eigendecomposition :math:`C = V \Lambda V^\top`; directions
    whose :math:`\lambda + \alpha` is below :math:`\lambda_{max}\, d_{src}\, \epsilon` are
    dropped (pseudo-inverse), which keeps rank-deficient data finite.

    References
    ----------
    .. [1] Hoerl, A. E. and Kennard, R. W. (1970). Ridge regression: biased estimation for
       nonorthogonal problems. Technometrics 12(1), 55-67. doi:10.1080/00401706.1970.10488634

    Examples
    --------
    >>> X = torch.randn(50, 3, dtype=torch.float64)
    >>> scale = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    >>> stitch = fit_ridge(X, X * scale, alpha=0.0)
    >>> torch.allclose(stitch.weight.diag(), scale.float(), atol=1e-5)
    True
    """
    X, Y = check_pairs(X, Y)
    if alpha is not None:
        details: dict[str, Any] = {
            "alpha": _check_alpha(alpha, "alpha"),
            "alpha_selection": "given",
        }
    else:
        unit = float((X**2).sum(dim=1).mean())  # s², > 0 (check_pairs: X varies)
        grid = [a * unit for a in _check_alphas(alphas)]
        try:
            details = _select_alpha(X, Y, grid, seed)
        except TooFewPairsError:
            details = {
                "alpha": _FALLBACK_ALPHA * unit,
                "alpha_selection": "fallback (too few pairs)",
            }
        details["alpha_unit"] = unit
    Xc, Yc, mean_x, mean_y = _centre(X, Y)
    lam, V, P = _ridge_factors(Xc, Yc)
    weight = _ridge_weight(lam, V, P, details["alpha"]).T
    stitch = AffineStitch(X.shape[1], Y.shape[1])
    with torch.no_grad():
        stitch.weight.copy_(weight)
        stitch.source_mean.copy_(mean_x)
        stitch.target_mean.copy_(mean_y)
    stitch.info.fit = details
    check_fitted(stitch, X, method="ridge")
    return stitch.requires_grad_(False)


def fit_procrustes(X: Any, Y: Any, *, scaling: bool = False) -> OrthogonalStitch:
    r"""Fit a centred orthogonal stitch (orthogonal Procrustes), optionally with scaling.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors, ``n >= 4``.
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    scaling : bool, default False
        After the rotation, fit one least-squares scale per target dimension.

    Returns
    -------
    OrthogonalStitch
        ``weight`` of shape (d_tgt, d_src) with orthonormal columns when
        ``d_tgt >= d_src`` and orthonormal rows otherwise; float32 parameters (gradients off).

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        For inputs that are not finite 2-D pairs (within the float32 range), or fewer
        than 4 pairs.
    IllConditionedError
        If the column spreads of ``X`` or ``Y`` are too far apart for float32.
    FitError
        If the singular value decomposition fails, or the float32 stitch would hold or
        produce NaN or infinity (e.g. a ``scaling`` beyond float32).
    InvalidInputError
        If ``scaling`` is not a bool.

    Notes
    -----
    With centred :math:`X_c, Y_c` and the thin SVD :math:`Y_c^\top X_c = U S V^\top`,
    :math:`R = U V^\top` minimises :math:`\lVert Y_c - X_c R^\top\rVert_F` over matrices
    with orthonormal rows or columns. This equals zero-padding the smaller space to the
    larger dimension and solving the square problem. With ``scaling`` the scale of
    dimension ``j`` is :math:`s_j = \langle z_j, y_j\rangle / \lVert z_j\rVert^2` for
    :math:`Z = X_c R^\top` (1 where :math:`z_j` is zero).

    References
    ----------
    .. [1] Schönemann, P. H. (1966). A generalized solution of the orthogonal Procrustes
       problem. Psychometrika 31(1), 1-10. doi:10.1007/BF02289451
    .. [2] Conneau, A. et al. (2018). Word translation without parallel data. ICLR.
       arXiv:1710.04087

    Examples
    --------
    >>> X = torch.randn(40, 3, dtype=torch.float64)
    >>> Q = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64)).Q
    >>> torch.allclose(fit_procrustes(X, X @ Q.T).weight, Q.float(), atol=1e-5)
    True
    """
    scaling = check_bool(scaling, "scaling")
    X, Y = check_pairs(X, Y)
    Xc, Yc, mean_x, mean_y = _centre(X, Y)
    try:
        U, _, Vh = torch.linalg.svd(Yc.T @ Xc, full_matrices=False)
    except RuntimeError as error:  # torch.linalg.LinAlgError
        raise FitError(f"Procrustes SVD failed: {error}") from None
    rotation = U @ Vh  # (d_tgt, d_src)
    scale = torch.ones(Y.shape[1], dtype=torch.float64)
    if scaling:
        Z = Xc @ rotation.T
        num, den = (Z * Yc).sum(dim=0), (Z * Z).sum(dim=0)
        floor = max(float(den.max()), 1e-300) * 1e-12
        scale = torch.where(den > floor, num / den.clamp_min(floor), 1.0)
    stitch = OrthogonalStitch(X.shape[1], Y.shape[1], scaling=scaling)
    with torch.no_grad():
        stitch.weight.copy_(rotation)
        stitch.scale.copy_(scale)
        stitch.source_mean.copy_(mean_x)
        stitch.target_mean.copy_(mean_y)
    check_fitted(stitch, X, method="procrustes")
    return stitch.requires_grad_(False)


#: The most candidate strengths ``alphas`` may hold (the default grid has 17): each costs a
#: held-out prediction, and a job of 15 million of them held the job slot for hours.
MAX_ALPHAS = 100


def _check_alphas(alphas: Any) -> list[float]:
    if isinstance(alphas, str | bytes) or not isinstance(alphas, Sequence):
        raise InvalidInputError(
            f"alphas must be a list of numbers, got {alphas!r:.80}", param="alphas"
        )
    if len(alphas) > MAX_ALPHAS:
        raise InvalidInputError(
            f"alphas holds {len(alphas)} strengths; give at most {MAX_ALPHAS}", param="alphas"
        )
    grid = [_check_alpha(a, "alphas") for a in alphas]
    if not grid:
        raise InvalidInputError("alphas must not be empty", param="alphas")
    return grid
