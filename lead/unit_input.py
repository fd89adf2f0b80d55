"""Inputs of stitches fitted on unit-length vectors: scaled to unit length before the map.

A stitch learns a map between the vectors it saw. When those source vectors were all of
unit length (``StitchInfo.source_normalized``, recorded from the data by
:func:`lead.fit_stitch`), the length of an input carries no meaning for the source model,
but it changes what an affine or MLP stitch answers: the centring ``x - source_mean`` and
every non-linearity see a different point. So every translation path (:func:`lead.
_apply.apply_stitch`, ``lead translate``, the service's ``POST /v1/translate``) calls
:func:`normalize_input` first; run backwards (``inverse``), the input is a target-model
vector and ``target_normalized`` decides.

An all-zero vector has no direction and is refused (:class:`~lead.errors.ZeroVectorError`,
naming its row) rather than mapped to the stitch's constant answer.

>>> import torch
>>> from lead.stitches import AffineStitch
>>> stitch = AffineStitch(2, 2)  # StitchInfo() records unit-length sources by default
>>> x, rescaled = normalize_input(stitch, torch.tensor([[3.0, 4.0], [0.6, 0.8]]))
>>> x, rescaled
(tensor([[0.6000, 0.8000],
        [0.6000, 0.8000]]), 1)
"""

from __future__ import annotations

import torch
from torch import Tensor

from lead.batch_invariance import row_norms
from lead.errors import ZeroVectorError
from lead.stitches import Stitch

__all__ = [
    "UNIT_NORM_TOLERANCE",
    "expects_unit_input",
    "normalize_input",
    "normalize_input_rows",
    "rescaled_rows",
    "scale_to_unit",
    "zero_vector_error",
]

#: A row whose L2 norm is within this of 1 counts as unit length and is passed unchanged
#: (the tolerance :func:`lead.fit_stitch` uses to record a side as normalised).
UNIT_NORM_TOLERANCE = 1e-3


def expects_unit_input(stitch: Stitch, *, inverse: bool = False) -> bool:
    """Whether ``stitch`` was fitted on unit-length inputs in the direction asked.

    Parameters
    ----------
    stitch : Stitch
        Any stitch.
    inverse : bool, default False
        The direction: forward inputs are source-model vectors, inverse ones target-model
        vectors.

    Returns
    -------
    bool
        ``stitch.info.source_normalized`` (``target_normalized`` with ``inverse``).
    """
    info = stitch.info
    return bool(info.target_normalized if inverse else info.source_normalized)


def _working(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _off_unit(work: Tensor) -> Tensor:
    """(n, 1) bool: the rows whose L2 norm differs from 1 by more than the tolerance."""
    norm = row_norms(work)
    off: Tensor = ~((norm - 1).abs() <= UNIT_NORM_TOLERANCE)  # NaN and infinity count as off
    return off


def rescaled_rows(stitch: Stitch, x: Tensor, *, inverse: bool = False) -> Tensor | None:
    """Which rows of ``x`` :func:`normalize_input` would rescale (without scaling).

    Parameters
    ----------
    stitch : Stitch
        The stitch about to run on ``x``.
    x : Tensor of shape (n, d)
        Input vectors, floating.
    inverse : bool, default False
        Whether the stitch runs backwards.

    Returns
    -------
    Tensor of shape (n,), bool, or None
        On ``x``'s device, true for the rows whose L2 norm differs from 1 by more than
        :data:`UNIT_NORM_TOLERANCE`; None when the stitch takes inputs of any length (or
        ``x`` is empty).
    """
    if not expects_unit_input(stitch, inverse=inverse) or x.shape[0] == 0:
        return None
    return _off_unit(_working(x)).flatten()


def zero_vector_error(row: int, param: str = "input") -> ZeroVectorError:
    """The error for row ``row`` of ``param``, all zeros (or only subnormal values), met by
    a unit-input stitch."""
    return ZeroVectorError(
        f"{param}[{row}] is a zero vector (or all its values are below the smallest normal "
        "number of its dtype, float32: ~1.2e-38, too small to give it a direction): the "
        "stitch was fitted on unit-length vectors and scales each input to unit length, "
        "which a vector without a direction cannot have",
        row=row,
        param=f"{param}[{row}]",
    )


def scale_to_unit(
    stitch: Stitch, x: Tensor, *, inverse: bool = False
) -> tuple[Tensor, Tensor | None]:
    """:func:`normalize_input` without a host synchronisation (for forwards on a GPU).

    Every row is scaled in the same vectorised pass and nothing is read back, so the
    caller checks the returned mask once the result is on the host anyway.

    Parameters
    ----------
    stitch, x, inverse
        As :func:`normalize_input`.

    Returns
    -------
    x : Tensor of shape (n, d)
        The rows :func:`normalize_input` rescales, rescaled bit for bit the same; the
        others unchanged (zero rows too).
    zero : Tensor of shape (n,), bool, or None
        On ``x``'s device: the rows :func:`normalize_input` would refuse as zero vectors
        (see :func:`zero_vector_error`); None when the stitch takes inputs of any length.
    """
    if not expects_unit_input(stitch, inverse=inverse) or x.shape[0] == 0:
        return x, None
    work = _working(x)
    scaled, zero = _rescale(work, _off_unit(work))
    return scaled.to(x.dtype), zero.flatten()


def _rescale(work: Tensor, off: Tensor) -> tuple[Tensor, Tensor]:
    """``work`` with its ``off`` rows (n, 1) scaled to unit length, and the (n, 1) mask of
    its zero rows (left unchanged). Each row is divided by its largest magnitude first, so
    that finite rows whose squared norm would overflow or underflow are scaled exactly."""
    peak = work.abs().amax(dim=1, keepdim=True)
    zero = peak < torch.finfo(work.dtype).tiny
    scaled = work / torch.where(zero, 1.0, peak)
    unit = scaled / row_norms(scaled)
    return torch.where(off & ~zero, unit, work), zero


def normalize_input(
    stitch: Stitch, x: Tensor, *, inverse: bool = False, param: str = "input"
) -> tuple[Tensor, int]:
    r"""Scale the rows of ``x`` to unit length when ``stitch`` expects unit-length input.

    Parameters
    ----------
    stitch : Stitch
        The stitch about to run on ``x``; :func:`expects_unit_input` decides.
    x : Tensor of shape (n, d)
        Input vectors (``d = d_src``, or ``d_tgt`` with ``inverse``), floating, finite.
    inverse : bool, default False
        Whether the stitch runs backwards.
    param : str, default "input"
        How the error names the input (``"input"`` gives ``input[3]``).

    Returns
    -------
    x : Tensor of shape (n, d)
        ``x`` itself when nothing was rescaled; else a new tensor in ``x``'s dtype and
        device whose rescaled rows have unit L2 norm (the others are unchanged).
    rescaled : int
        How many rows were rescaled: those whose norm differs from 1 by more than
        :data:`UNIT_NORM_TOLERANCE`. Always 0 when the stitch does not expect unit input.

    Raises
    ------
    ZeroVectorError
        If the stitch expects unit input and a row is all zeros (or holds only subnormal
        values of its dtype, too small to have a reliable direction); ``param`` names the
        first such row (``input[3]``).

    Notes
    -----
    Vectorised, one host synchronisation in the common case: the row norms
    :math:`\lVert x_i \rVert_2` are computed in one pass, and only when some row is off
    unit length is each row divided by its largest magnitude :math:`m_i` first,
    :math:`x_i / m_i / \lVert x_i / m_i \rVert_2`, so that finite rows whose squared norm
    would overflow or underflow (entries above ~1e19 or below ~1e-19 in float32) are
    normalised exactly.
    """
    x, rows = normalize_input_rows(stitch, x, inverse=inverse, param=param)
    return x, 0 if rows is None else int(rows.sum())


def normalize_input_rows(
    stitch: Stitch, x: Tensor, *, inverse: bool = False, param: str = "input"
) -> tuple[Tensor, Tensor | None]:
    """:func:`normalize_input`, saying which rows it rescaled rather than how many (the
    service splits one forward's answer between micro-batched requests).

    Parameters
    ----------
    stitch, x, inverse, param
        As :func:`normalize_input`.

    Returns
    -------
    x : Tensor of shape (n, d)
        As :func:`normalize_input`.
    rescaled : Tensor of shape (n,), bool, or None
        On ``x``'s device, true for the rows rescaled; None when none was (or the stitch
        takes inputs of any length).

    Raises
    ------
    ZeroVectorError
        As :func:`normalize_input`.
    """
    if not expects_unit_input(stitch, inverse=inverse) or x.shape[0] == 0:
        return x, None
    work = _working(x)
    off = _off_unit(work)
    if not bool(off.any()):
        return x, None
    scaled, zero = _rescale(work, off)
    if bool(zero.any()):
        raise zero_vector_error(int(zero.flatten().nonzero()[0]), param)
    return scaled.to(x.dtype), off.flatten()
