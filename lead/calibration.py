"""Variance-restoring calibration: give translated vectors the spread of native ones.

A least-squares stitch predicts the conditional mean of the target vector, so its outputs
are shrunk toward the target mean: the residual :math:`\\hat y - \\mu_y` of a translation is
shorter than a native vector's :math:`y - \\mu_y` (ridge shrinks it further). Alone, that
costs nothing to cosine retrieval over an all-translated corpus when outputs are not
normalised; but once outputs are L2-normalised (``normalize_output``, every bundled stitch)
the mean dominates a short residual, and in a corpus that mixes translated and natively
re-embedded documents the two kinds no longer sit in the same distribution, so re-embedding
part of a corpus can make retrieval worse. One scalar per stitch, fitted so that the mean
squared residual norm of the translations equals that of the native targets, restores the
spread.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lead._validation import check_pairs
from lead.errors import FitError, ShapeMismatchError
from lead.stitches import Stitch

__all__ = ["fit_output_scale"]


def fit_output_scale(stitch: Stitch, X: Any, Y: Any) -> float:
    r"""Fit and attach the stitch's output scale so translations have the native spread.

    Parameters
    ----------
    stitch : Stitch
        A fitted stitch; modified in place (:meth:`lead.stitches.Stitch.set_output_scale`).
        Any output scale it already holds is replaced, not compounded.
    X : array or Tensor of shape (n, d_src)
        Source vectors, as the stitch's forward receives them (unit rows for a stitch
        fitted on unit rows).
    Y : array or Tensor of shape (n, d_tgt)
        Their native target vectors (only the spread of ``Y`` around the stitch's
        target mean is used).

    Returns
    -------
    float
        The scale :math:`s > 0`; 1 means the translations already have the native spread,
        above 1 that they were shrunk toward the mean.

    Raises
    ------
    ShapeMismatchError
        If the dimensions do not match the stitch.
    NonFiniteError, TooFewPairsError
        Non-finite input, fewer than 4 rows.
    FitError
        If every translated residual is zero (nothing to scale).

    Notes
    -----
    With :math:`g` the stitch's map of centred inputs (before the target mean is added and
    before any output normalisation),

    .. math:: s = \sqrt{\frac{\sum_i \lVert y_i - \mu_y \rVert^2}
                             {\sum_i \lVert g(x_i - \mu_x) \rVert^2}},

    and the calibrated stitch computes :math:`s\,g(x - \mu_x) + \mu_y`. Fitted on the
    training rows, it undoes the shrinkage the fit shows in-sample; out-of-sample
    translations are shrunk a little more, so :math:`s` errs on the small side.

    Examples
    --------
    A stitch that halves every residual gets a scale of 2.

    >>> import torch
    >>> from lead.stitches import AffineStitch
    >>> stitch = AffineStitch(3, 3)
    >>> _ = stitch.weight.data.copy_(0.5 * torch.eye(3))
    >>> X = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    >>> round(fit_output_scale(stitch, X, X), 6)
    2.0
    >>> torch.allclose(stitch(X), X, atol=1e-6)
    True
    """
    X_t, Y_t = check_pairs(X, Y)
    if X_t.shape[1] != stitch.d_src or Y_t.shape[1] != stitch.d_tgt:
        raise ShapeMismatchError(
            f"pairs of dimensions ({X_t.shape[1]}, {Y_t.shape[1]}) for a stitch mapping "
            f"{stitch.d_src} to {stitch.d_tgt}",
            expected=(stitch.d_src, stitch.d_tgt),
            got=(X_t.shape[1], Y_t.shape[1]),
        )
    source_mean = stitch.source_mean.detach().double().cpu()
    target_mean = stitch.target_mean.detach().double().cpu()
    with torch.no_grad():
        x = (X_t.double().cpu() - source_mean).to(stitch.source_mean)
        residual = stitch._map(x).double().cpu()
    translated = float((residual**2).sum())
    native = float(((Y_t.double().cpu() - target_mean) ** 2).sum())
    if not translated > 0 or not math.isfinite(translated):
        raise FitError("the stitch maps every row to its target mean: nothing to scale")
    scale = math.sqrt(native / translated)
    stitch.set_output_scale(scale)
    return scale
