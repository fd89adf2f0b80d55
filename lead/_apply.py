"""Run a stitch over many rows for scoring (private): batched, batch-invariant, no autograd,
float64 out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lead._options import check_int_option
from lead._validation import as_matrix, check_bool, check_stitch
from lead.batch_invariance import forward_batch_invariant
from lead.errors import NonFiniteOutputError, ShapeMismatchError
from lead.stitches import Stitch, oriented
from lead.unit_input import normalize_input

__all__ = ["apply_stitch"]


def stitch_input(stitch: Stitch, X: Any, *, inverse: bool = False, param: str = "X") -> Tensor:
    """``X`` as the stitch's forward takes it: a matrix in the stitch's device and dtype,
    scaled to unit length when the stitch was fitted on unit-length vectors.

    Raises
    ------
    ShapeMismatchError
        If ``X`` does not have ``stitch.d_src`` columns (``d_tgt`` with ``inverse``).
    NotInvertibleError, NonFiniteError, ZeroVectorError
        As :func:`apply_stitch`, naming ``param``.
    InvalidInputError
        If ``stitch`` is not a stitch or ``inverse`` not a bool.
    """
    check_stitch(stitch)
    _, d_in, _ = oriented(stitch, inverse=check_bool(inverse, "inverse"))
    weights = next(stitch.parameters())
    source = as_matrix(X, name=param, dtype=weights.dtype).to(weights.device)
    if source.shape[1] != d_in:
        side = "d_tgt" if inverse else "d_src"
        raise ShapeMismatchError(
            f"{param} has {source.shape[1]} columns but the stitch expects {side}={d_in}",
            expected=d_in,
            got=source.shape[1],
            param=param,
        )
    source, _ = normalize_input(stitch, source, inverse=inverse, param=param)
    return source


def apply_stitch(
    stitch: Stitch, X: Any, *, batch_size: int = 65536, inverse: bool = False
) -> Tensor:
    """Translate ``X`` with ``stitch`` in batches, in the stitch's own device and dtype.

    Parameters
    ----------
    stitch : Stitch
        Any stitch; evaluated in ``eval`` mode under ``torch.no_grad``, then restored.
    X : array or Tensor of shape (n, d_src)
        Source-model vectors. When the stitch was fitted on unit-length vectors
        (``info.source_normalized``; ``target_normalized`` with ``inverse``), rows are
        scaled to unit length first (:func:`lead.unit_input.normalize_input`).
    batch_size : int, default 65536
        Rows per forward pass.
    inverse : bool, default False
        Run an :class:`~lead.stitches.InvertibleStitch` backwards: ``X`` has ``d_tgt``
        columns and the result ``d_src``.

    Returns
    -------
    Tensor of shape (n, d_tgt), float64, on the stitch's device
        (n, d_src) with ``inverse``. Each row has the same bits whatever ``batch_size`` and
        the other rows of ``X`` (:func:`lead.batch_invariance.forward_batch_invariant`; the
        bits the service and ``lead translate`` give).

    Raises
    ------
    ShapeMismatchError
        If ``X`` does not have ``stitch.d_src`` columns (``d_tgt`` with ``inverse``).
    NotInvertibleError
        If ``inverse`` and the stitch is not invertible.
    NonFiniteError
        If ``X`` holds NaN or infinity.
    ZeroVectorError
        If the stitch expects unit-length input and a row of ``X`` is all zeros
        (``param`` ``X[i]``).
    NonFiniteOutputError
        If the stitch produces NaN or infinity.
    InvalidInputError
        If ``stitch`` is not a stitch, ``batch_size`` not an integer >= 1 or ``inverse``
        not a bool.
    """
    batch_size = check_int_option(batch_size, "batch_size", minimum=1)
    source = stitch_input(stitch, X, inverse=inverse)
    run, _, d_out = oriented(stitch, inverse=inverse)
    return run_rows(stitch, lambda x: forward_batch_invariant(run, x), source, d_out, batch_size)


def run_rows(
    stitch: Stitch, run: Callable[[Tensor], Tensor], source: Tensor, d_out: int, batch_size: int
) -> Tensor:
    """``run`` (a batch-invariant map of ``stitch``) over ``source`` in batches of
    ``batch_size`` rows, with ``stitch`` in ``eval`` mode under ``torch.no_grad`` (then
    restored): float64, of shape (n, ``d_out``).

    Raises
    ------
    NonFiniteOutputError
        If any output is NaN or infinite.
    """
    was_training = stitch.training
    stitch.eval()
    try:
        with torch.no_grad():
            parts = [
                run(source[i : i + batch_size]).to(torch.float64)
                for i in range(0, source.shape[0], batch_size)
            ]
    finally:
        stitch.train(was_training)
    out = torch.cat(parts) if parts else source.new_zeros((0, d_out), dtype=torch.float64)
    if not bool(torch.isfinite(out).all()):
        raise NonFiniteOutputError("the stitch produced NaN or infinity from finite input")
    return out
