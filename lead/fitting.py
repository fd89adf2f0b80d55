"""Fit stitches from paired embeddings: ridge, orthogonal Procrustes, or a trained MLP.

The closed-form fits run in float64 with ``torch.linalg`` eigen/singular value
decompositions (never an explicit inverse), so rank-deficient data gives a finite,
minimum-norm answer instead of NaN. The fitted stitches hold float32 parameters.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lead._validation import as_matrix, check_pairs
from lead.errors import FitError, InvalidInputError, LeadError, NonFiniteError, TooFewPairsError
from lead.splits import holdout_split
from lead.stitches import AffineStitch, OrthogonalStitch, Stitch, StitchInfo

__all__ = [
    "DEFAULT_RIDGE_ALPHAS",
    "METHODS",
    "ProgressCallback",
    "check_method_options",
    "fit_procrustes",
    "fit_ridge",
    "fit_stitch",
]

#: ``progress(stage, step, total)``; may raise :class:`~lead.errors.JobCancelledError`.
ProgressCallback = Callable[[str, int, int], None]

#: Ridge strengths tried on held-out pairs, on the per-pair (mean squared) scale.
DEFAULT_RIDGE_ALPHAS: tuple[float, ...] = tuple(10.0 ** (k / 2) for k in range(-14, 3))

#: Method name (and alias) → canonical method.
METHODS: dict[str, str] = {
    "ridge": "ridge",
    "affine": "ridge",
    "procrustes": "procrustes",
    "orthogonal": "procrustes",
    "mlp": "mlp",
    "invertible": "invertible",
    "anchors": "anchors",
    "unsupervised": "unsupervised",
}

_RIDGE_HOLDOUT = 0.2
_FALLBACK_ALPHA = 1e-3


def _lead_version() -> str:
    from lead import __version__  # late import: lead/__init__ imports this module

    return __version__


def _centre(X: Tensor, Y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    mean_x, mean_y = X.mean(dim=0), Y.mean(dim=0)
    return X - mean_x, Y - mean_y, mean_x, mean_y


def _ridge_factors(Xc: Tensor, Yc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Eigenvalues ``lam``, eigenvectors ``V`` of ``C = Xcᵀ Xc / n`` and ``P = Vᵀ Xcᵀ Yc / n``."""
    n = Xc.shape[0]
    try:
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
    if isinstance(alpha, bool):
        raise InvalidInputError(f"{param} must be a number, got {alpha!r}", param=param)
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{param} must be a number, got {alpha!r}", param=param) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{param} must be finite and >= 0, got {alpha!r}", param=param)
    return value


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
        Candidate strengths when ``alpha`` is None.
    seed : int, default 0
        Seed of the held-out split used to choose ``alpha``.

    Returns
    -------
    AffineStitch
        float32 parameters (gradients off); ``info.fit`` holds the chosen ``alpha`` and
        how it was chosen.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        For inputs that are not finite 2-D pairs, or fewer than 4 pairs.
    InvalidInputError
        For a negative or non-finite ``alpha``.
    FitError
        If the eigendecomposition fails.

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
        grid = _check_alphas(alphas)
        try:
            details = _select_alpha(X, Y, grid, seed)
        except TooFewPairsError:
            details = {"alpha": _FALLBACK_ALPHA, "alpha_selection": "fallback (too few pairs)"}
    Xc, Yc, mean_x, mean_y = _centre(X, Y)
    lam, V, P = _ridge_factors(Xc, Yc)
    weight = _ridge_weight(lam, V, P, details["alpha"]).T
    stitch = AffineStitch(X.shape[1], Y.shape[1])
    with torch.no_grad():
        stitch.weight.copy_(weight)
        stitch.source_mean.copy_(mean_x)
        stitch.target_mean.copy_(mean_y)
    stitch.info.fit = details
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
        For inputs that are not finite 2-D pairs, or fewer than 4 pairs.
    FitError
        If the singular value decomposition fails.

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
    return stitch.requires_grad_(False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _keyword_options(function: Callable[..., Any]) -> set[str]:
    """The keyword-only options of a fitting function, except ``seed``."""
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.kind is p.KEYWORD_ONLY} - {"seed", "progress"}


def check_method_options(method: Any, options: dict[str, Any]) -> str:
    """Check a method name, its option names and their values, before any fitting.

    Parameters
    ----------
    method : str
        A key of :data:`METHODS` (any case).
    options : dict
        Option names and values, as :func:`fit_stitch` takes them.

    Returns
    -------
    str
        The canonical method name.

    Raises
    ------
    InvalidInputError
        For an unknown method (``param="method"``), an unknown option or a bad value
        (``param`` names the option).
    """
    canonical = METHODS.get(str(method).lower())
    if canonical is None:
        raise InvalidInputError(
            f"unknown method {method!r}; choose one of {', '.join(METHODS)}", param="method"
        )
    from lead.anchors import check_anchor_options, fit_anchors  # late: they import fitting
    from lead.invertible import InvertibleConfig
    from lead.training import MLPConfig
    from lead.unsupervised import check_unsupervised_options, fit_unsupervised

    configs = {"mlp": MLPConfig, "invertible": InvertibleConfig}
    functions: dict[str, Callable[..., Stitch]] = {
        "anchors": fit_anchors,
        "unsupervised": fit_unsupervised,
    }
    allowed = {
        "ridge": {"alpha", "alphas"},
        "procrustes": {"scaling"},
        **{name: {f.name for f in dataclasses.fields(c)} - {"seed"} for name, c in configs.items()},
        **{name: _keyword_options(f) for name, f in functions.items()},
    }[canonical]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidInputError(
            f"unknown option(s) for method {canonical!r}: {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}",
            param=unknown[0],
        )
    if canonical == "ridge":
        if options.get("alpha") is not None:  # None: chosen on held-out pairs
            _check_alpha(options["alpha"], "alpha")
        if "alphas" in options:
            _check_alphas(options["alphas"])
    elif canonical == "procrustes":
        _check_scaling(options.get("scaling", False))
    elif canonical in configs:
        configs[canonical](**options)  # the configs validate every value
    elif canonical == "anchors":
        check_anchor_options(**options)
    else:
        check_unsupervised_options(**options)
    return canonical


def _check_alphas(alphas: Any) -> list[float]:
    if isinstance(alphas, str | bytes) or not isinstance(alphas, Sequence):
        raise InvalidInputError(f"alphas must be a list of numbers, got {alphas!r}", param="alphas")
    grid = [_check_alpha(a, "alphas") for a in alphas]
    if not grid:
        raise InvalidInputError("alphas must not be empty", param="alphas")
    return grid


def _check_scaling(scaling: Any) -> bool:
    if not isinstance(scaling, bool):
        raise InvalidInputError("scaling must be true or false", param="scaling")
    return scaling


def fit_stitch(
    X: Any,
    Y: Any,
    method: str = "ridge",
    *,
    info: StitchInfo | None = None,
    normalize_output: bool | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    **options: Any,
) -> Stitch:
    """Fit a stitch from paired vectors with the named method.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors.
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    method : str, default "ridge"
        ``ridge`` (alias ``affine``), ``procrustes`` (alias ``orthogonal``), ``mlp``,
        ``invertible`` (an :class:`~lead.stitches.InvertibleStitch`, with ``.inverse(y)``),
        ``anchors`` (zero-shot from a few anchor pairs, :func:`lead.anchors.fit_anchors`)
        or ``unsupervised`` (no pairs: :func:`lead.unsupervised.fit_unsupervised`; the
        rows of ``Y`` are shuffled by ``seed`` first, so their order carries no
        information, and ``X`` and ``Y`` may have different row counts).
    info : StitchInfo, optional
        Models and provenance; not modified (a copy is stored). Its ``fit`` dict is kept
        and extended with ``method``, ``options``, ``pairs``, ``seed``, ``lead_version``
        and what the method reports (ridge ``alpha``, training epochs, ...).
    normalize_output : bool, optional
        L2-normalise the stitch's outputs; defaults to ``info.target_normalized``.
    seed : int, default 0
        Seed of every random choice (ridge hold-out split, MLP init and shuffling).
    progress : callable, optional
        ``progress(stage, step, total)``; ``("fit", 0, 1)`` / ``("fit", 1, 1)`` around a
        closed-form fit, ``("train", epoch, max_epochs)`` while training (mlp,
        invertible). An
        exception it raises (e.g. :class:`~lead.errors.JobCancelledError`) propagates.
    **options
        ridge: ``alpha``, ``alphas``; procrustes: ``scaling``; mlp: the fields of
        :class:`lead.training.MLPConfig` except ``seed``; invertible: those of
        :class:`lead.invertible.InvertibleConfig` except ``seed``; anchors and
        unsupervised: the keyword options of their functions except ``seed``.

    Returns
    -------
    Stitch
        On the CPU with float32 parameters, in eval mode, gradients off (call
        ``requires_grad_()`` to fine-tune it).

    Raises
    ------
    InvalidInputError
        For an unknown method or option, or a bad option value.
    ShapeMismatchError, NonFiniteError, TooFewPairsError, FitError
        As raised by the method.
    """
    canonical = check_method_options(method, options)
    from lead.anchors import fit_anchors  # late: these modules import fitting
    from lead.invertible import InvertibleConfig, train_invertible
    from lead.training import MLPConfig, train_mlp
    from lead.unsupervised import fit_unsupervised

    trained = {"mlp": MLPConfig, "invertible": InvertibleConfig}
    keyword: dict[str, Callable[..., Stitch]] = {
        "anchors": fit_anchors,
        "unsupervised": fit_unsupervised,
    }
    info = dataclasses.replace(info) if info is not None else StitchInfo()
    if normalize_output is None:
        normalize_output = info.target_normalized
    if canonical == "unsupervised":
        X, Y = as_matrix(X, name="X"), as_matrix(Y, name="Y")
        # the row order of Y must carry no information: shuffle it
        order = torch.randperm(Y.shape[0], generator=torch.Generator().manual_seed(seed))
        Y = Y[order.to(Y.device)]
    else:
        X, Y = check_pairs(X, Y)
    closed_form = canonical not in trained
    if progress is not None and closed_form:
        progress("fit", 0, 1)
    stitch: Stitch
    try:
        if canonical == "ridge":
            stitch = fit_ridge(X, Y, seed=seed, **options)
        elif canonical == "procrustes":
            _check_scaling(options.get("scaling", False))
            stitch = fit_procrustes(X, Y, **options)
        elif canonical == "unsupervised":
            stitch = fit_unsupervised(X, Y, seed=seed, progress=progress, **options)
        elif canonical in keyword:
            stitch = keyword[canonical](X, Y, seed=seed, **options)
        elif canonical == "mlp":
            config = MLPConfig(**options, seed=seed)
            stitch = train_mlp(X, Y, config, progress, normalize_output=bool(normalize_output))
        else:
            stitch = train_invertible(
                X,
                Y,
                InvertibleConfig(**options, seed=seed),
                progress,
                normalize_output=bool(normalize_output),
                normalize_inverse_output=info.source_normalized,
            )
    except NonFiniteError as error:  # the inputs were checked above: an intermediate value
        raise FitError(
            f"the {canonical} fit met a non-finite intermediate value ({error}); the inputs "
            "may span too many orders of magnitude"
        ) from None
    except (RuntimeError, OverflowError) as error:
        if isinstance(error, LeadError):  # FitError, JobCancelledError, ...
            raise
        raise FitError(f"the {canonical} fit failed: {error}") from None
    if progress is not None and closed_form:
        progress("fit", 1, 1)
    info.fit = {
        **info.fit,
        "method": canonical,
        "options": {k: _jsonable(v) for k, v in sorted(options.items())},
        "pairs": 0 if canonical == "unsupervised" else int(X.shape[0]),
        "seed": int(seed),
        "lead_version": _lead_version(),
        **stitch.info.fit,
    }
    stitch.info = info
    stitch.normalize_output = bool(normalize_output)
    return stitch.requires_grad_(False).eval()
