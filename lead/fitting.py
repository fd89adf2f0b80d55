"""Fit a stitch by method name: :func:`fit_stitch` and the options each method takes.

The closed-form fits are in :mod:`lead.closed_form`, the trained ones in
:mod:`lead.training` (MLP) and :mod:`lead.invertible`, the zero-shot ones in
:mod:`lead.anchors` and :mod:`lead.unsupervised`; this module only dispatches, records how
the stitch was made, and checks names and values before any work starts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from lead._options import MAX_SEED, check_int_option, cut, echo
from lead._validation import (
    as_matrix,
    check_bool,
    check_callable,
    check_column_spread,
    check_fitted,
    check_float32_range,
    check_instance,
    check_pairs,
)
from lead._version import __version__
from lead.anchors import check_anchor_options, fit_anchors
from lead.calibration import fit_output_scale
from lead.closed_form import (
    DEFAULT_RIDGE_ALPHAS,
    ProgressCallback,
    _check_alpha,
    _check_alphas,
    fit_procrustes,
    fit_ridge,
)
from lead.errors import FitError, InvalidInputError, LeadError, NonFiniteError
from lead.gated import check_gated_options, fit_gated
from lead.invertible import InvertibleConfig, train_invertible
from lead.local import check_local_options, fit_local
from lead.stitches import Stitch, StitchInfo
from lead.training import MLPConfig, train_mlp
from lead.unsupervised import check_unsupervised_options, fit_unsupervised

__all__ = [
    "DEFAULT_RIDGE_ALPHAS",
    "METHODS",
    "ProgressCallback",
    "check_method_options",
    "fit_procrustes",
    "fit_ridge",
    "fit_stitch",
]

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
    "local": "local",
    "gated": "gated",
}
#: Methods that take per-row sample weights.
WEIGHTED = ("local", "gated")


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _unit_rows(M: torch.Tensor) -> bool:
    """Whether every row of ``M`` has unit L2 norm (to 1e-3)."""
    return bool(
        torch.allclose(M.norm(dim=1), torch.ones((), dtype=M.dtype, device=M.device), atol=1e-3)
    )


def _keyword_options(function: Callable[..., Any]) -> set[str]:
    """The keyword-only options of a fitting function, except ``seed``."""
    parameters = inspect.signature(function).parameters.values()
    skip = {"seed", "progress", "sample_weight", "calibrate_variance"}
    return {p.name for p in parameters if p.kind is p.KEYWORD_ONLY} - skip


#: Unknown option names that a message lists (the rest are counted).
_SHOWN_OPTIONS = 10


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
            f"unknown method {echo(str(method))}; choose one of {', '.join(METHODS)}",
            param="method",
        )
    configs = {"mlp": MLPConfig, "invertible": InvertibleConfig}
    functions: dict[str, Callable[..., Stitch]] = {
        "anchors": fit_anchors,
        "unsupervised": fit_unsupervised,
        "local": fit_local,
        "gated": fit_gated,
    }
    allowed = {
        "ridge": {"alpha", "alphas"},
        "procrustes": {"scaling"},
        **{name: {f.name for f in dataclasses.fields(c)} - {"seed"} for name, c in configs.items()},
        **{name: _keyword_options(f) for name, f in functions.items()},
    }[canonical]
    unknown = sorted(set(options) - allowed)
    if unknown:
        shown = ", ".join(cut(str(name)) for name in unknown[:_SHOWN_OPTIONS])
        more = f" and {len(unknown) - _SHOWN_OPTIONS} more" if len(unknown) > _SHOWN_OPTIONS else ""
        raise InvalidInputError(
            f"unknown option(s) for method {canonical!r}: {shown}{more}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}",
            param=cut(str(unknown[0])),
        )
    if canonical == "ridge":
        if options.get("alpha") is not None:  # None: chosen on held-out pairs
            _check_alpha(options["alpha"], "alpha")
        if "alphas" in options:
            _check_alphas(options["alphas"])
    elif canonical == "procrustes":
        check_bool(options.get("scaling", False), "scaling")
    elif canonical in configs:
        configs[canonical](**options)  # the configs validate every value
    elif canonical == "anchors":
        check_anchor_options(**options)
    elif canonical == "local":
        check_local_options(**options)
    elif canonical == "gated":
        check_gated_options(**options)
    else:
        check_unsupervised_options(**options)
    return canonical


def fit_stitch(
    X: Any,
    Y: Any,
    method: str = "ridge",
    *,
    info: StitchInfo | None = None,
    normalize_output: bool | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    sample_weight: Any = None,
    calibrate_variance: bool = False,
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
        ``local`` (a weighted global map plus the nearest training pairs' residuals:
        :func:`lead.local.fit_local`), ``gated`` (a local stitch on the in-domain pairs and
        a residual MLP elsewhere: :func:`lead.gated.fit_gated`),
        ``anchors`` (zero-shot from a few anchor pairs, :func:`lead.anchors.fit_anchors`)
        or ``unsupervised`` (no pairs: :func:`lead.unsupervised.fit_unsupervised`; the
        rows of ``Y`` are shuffled by ``seed`` first, so their order carries no
        information, and ``X`` and ``Y`` may have different row counts).
    info : StitchInfo, optional
        Models and provenance; not modified (a copy is stored). Its ``fit`` dict is kept
        and extended with ``method``, ``options``, ``pairs``, ``seed``, ``lead_version``
        and what the method reports (ridge ``alpha``, training epochs, ...).
    normalize_output : bool, optional
        L2-normalise the stitch's outputs; defaults to ``info.target_normalized``. The
        stored ``source_normalized`` / ``target_normalized`` follow the data: a side
        whose rows are not all of unit length (to 1e-3) is recorded as not normalised,
        whatever ``info`` said, so by default a stitch never normalises outputs that its
        targets were not.
    seed : int, default 0
        Seed of every random choice (ridge hold-out split, MLP init and shuffling).
    progress : callable, optional
        ``progress(stage, step, total)``; ``("fit", 0, 1)`` / ``("fit", 1, 1)`` around the
        other methods, ``("train", epoch, max_epochs)`` while training (mlp, invertible,
        gated's MLP;
        an early stop's last epoch reports ``("train", epochs, epochs)``;
        invertible also reports ``("init", layer, layers)``), and ``("match", 0, 1)`` /
        ``("refine", round, rounds)`` inside the unsupervised fit (and ``("refine", rounds,
        rounds)`` once done). An exception it raises
        (e.g. :class:`~lead.errors.JobCancelledError`) propagates.
    sample_weight : array_like of shape (n,), optional
        Non-negative weight of each pair (methods ``local`` and ``gated`` only): e.g. 1 for
        in-domain pairs and 0.05 for general-domain extra pairs; rescaled to mean 1.
    calibrate_variance : bool, default False
        After any method, fit the stitch's output scale on the training pairs
        (:func:`lead.calibration.fit_output_scale`) so that translated residuals have
        the native spread; recorded as ``fit["output_scale"]``. Off, the stitch is
        exactly what the method made. Not for ``unsupervised`` (no pairs). A ``gated``
        stitch scales each of its two experts instead.
    **options
        ridge: ``alpha``, ``alphas``; procrustes: ``scaling``; mlp: the fields of
        :class:`lead.training.MLPConfig` except ``seed``; invertible: those of
        :class:`lead.invertible.InvertibleConfig` except ``seed``; anchors,
        unsupervised, local and gated: the keyword options of their functions except
        ``seed``.

    Returns
    -------
    Stitch
        On the CPU with float32 parameters, in eval mode, gradients off (call
        ``requires_grad_()`` to fine-tune it).

    Raises
    ------
    InvalidInputError
        For an unknown method or option, or a bad option value; ``normalize_output`` or
        ``calibrate_variance`` not a bool, ``info`` not a :class:`~lead.stitches.StitchInfo`,
        ``progress`` not callable.
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As raised by the method; values beyond the float32 range are a NonFiniteError.
    IllConditionedError
        If the column spreads of ``X`` or ``Y`` are too far apart for float32.
    FitError
        As raised by the method, and whenever the fitted stitch holds NaN or infinity or
        produces them on ``X``.
    """
    canonical = check_method_options(method, options)  # names and values, before any work
    check_bool(calibrate_variance, "calibrate_variance")
    if normalize_output is not None:
        check_bool(normalize_output, "normalize_output")
    if info is not None:
        check_instance(info, StitchInfo, "info", what="a lead.StitchInfo", how="or None")
    check_callable(progress, "progress")
    if calibrate_variance and canonical == "unsupervised":
        raise InvalidInputError(
            "calibrate_variance needs paired vectors; the unsupervised method has none",
            param="calibrate_variance",
        )
    seed = check_int_option(seed, "seed", minimum=0, maximum=MAX_SEED)
    if sample_weight is not None and canonical not in WEIGHTED:
        raise InvalidInputError(
            f"sample weights are taken by methods {' and '.join(WEIGHTED)} only, not {canonical!r}",
            param="sample_weight",
        )
    info = dataclasses.replace(info) if info is not None else StitchInfo()
    if canonical == "unsupervised":
        X, Y = as_matrix(X, name="X"), as_matrix(Y, name="Y")
        for M, name in ((X, "X"), (Y, "Y")):
            check_float32_range(M, name=name)
            check_column_spread(M, name=name)
        # the row order of Y must carry no information: shuffle it
        order = torch.randperm(Y.shape[0], generator=torch.Generator().manual_seed(seed))
        Y = Y[order.to(Y.device)]
    else:
        X, Y = check_pairs(X, Y)
    # "normalised" is a claim about the data: it holds only where every row has unit length
    info.source_normalized = info.source_normalized and _unit_rows(X)
    info.target_normalized = info.target_normalized and _unit_rows(Y)
    if normalize_output is None:
        normalize_output = info.target_normalized
    closed_form = canonical not in ("mlp", "invertible", "gated")  # these report their own epochs
    if progress is not None and closed_form:
        progress("fit", 0, 1)
    stitch: Stitch
    try:
        if canonical == "ridge":
            stitch = fit_ridge(X, Y, seed=seed, **options)
        elif canonical == "procrustes":
            stitch = fit_procrustes(X, Y, **options)
        elif canonical == "unsupervised":
            stitch = fit_unsupervised(X, Y, seed=seed, progress=progress, **options)
        elif canonical == "anchors":
            stitch = fit_anchors(X, Y, seed=seed, **options)
        elif canonical == "local":
            stitch = fit_local(X, Y, sample_weight=sample_weight, seed=seed, **options)
        elif canonical == "gated":
            stitch = fit_gated(
                X,
                Y,
                sample_weight=sample_weight,
                calibrate_variance=calibrate_variance,
                seed=seed,
                progress=progress,
                **options,
            )
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
    if calibrate_variance and canonical != "gated":  # a gated stitch scales its experts
        stitch.info.fit["output_scale"] = fit_output_scale(stitch, X, Y)
    if progress is not None and closed_form:
        progress("fit", 1, 1)
    info.fit = {
        **info.fit,
        "method": canonical,
        "options": {k: _jsonable(v) for k, v in sorted(options.items())},
        "pairs": 0 if canonical == "unsupervised" else int(X.shape[0]),
        "seed": int(seed),
        "lead_version": __version__,
        **stitch.info.fit,
    }
    stitch.info = info
    stitch.normalize_output = bool(normalize_output)
    stitch.requires_grad_(False).eval()
    check_fitted(stitch, X, method=canonical)  # never NaN weights or outputs
    return stitch
