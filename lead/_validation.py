"""Input checks shared by fitting, training and scoring (private).

Everything that enters a numerical routine passes through :func:`as_matrix` or
:func:`check_pairs`, so that a wrong shape or a NaN is a clear :class:`~lead.errors.LeadError`
naming the argument, never a NaN further down.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError, TooFewPairsError

__all__ = ["as_matrix", "check_config_fields", "check_device", "check_pairs"]


def as_matrix(x: Any, *, name: str, dtype: torch.dtype = torch.float64) -> Tensor:
    """Convert ``x`` to a finite two-dimensional tensor of ``dtype``.

    Parameters
    ----------
    x : array_like or Tensor of shape (n, d)
        A numpy array, a tensor (kept on its device) or nested lists of numbers.
    name : str
        Argument name used in error messages and as the error's ``param``.
    dtype : torch.dtype, default torch.float64
        Floating dtype of the result.

    Returns
    -------
    Tensor of shape (n, d)
        ``x`` as ``dtype``; a copy unless ``x`` already is a tensor of that dtype. Never
        modify the result in place.

    Raises
    ------
    InvalidInputError
        If ``x`` is not numeric.
    ShapeMismatchError
        If ``x`` is not two-dimensional or has no columns.
    NonFiniteError
        If ``x`` holds NaN or infinity (also after conversion to ``dtype``).

    Examples
    --------
    >>> as_matrix([[1, 2], [3, 4]], name="X").dtype
    torch.float64
    """
    if isinstance(x, Tensor):
        t = x.detach()
        if t.is_complex() or t.dtype == torch.bool:
            raise InvalidInputError(f"{name} must be real numbers, got {t.dtype}", param=name)
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as error:
            raise InvalidInputError(f"{name} is not a numeric array: {error}", param=name) from None
        if arr.dtype.kind not in "iuf":
            raise InvalidInputError(
                f"{name} must be real numbers, got dtype {arr.dtype}", param=name
            )
        if not arr.flags.writeable or arr.dtype.byteorder not in "=|":
            # torch.from_numpy warns on read-only arrays and rejects big-endian ones.
            arr = np.array(arr, dtype=arr.dtype.newbyteorder("="))
        t = torch.from_numpy(arr)
    if t.ndim != 2:
        raise ShapeMismatchError(
            f"{name} must be a 2-D array of shape (n, d), got shape {tuple(t.shape)}",
            expected="(n, d)",
            got=tuple(t.shape),
            param=name,
        )
    if t.shape[1] == 0:
        raise ShapeMismatchError(
            f"{name} has no columns (shape {tuple(t.shape)})",
            expected="d >= 1",
            got=tuple(t.shape),
            param=name,
        )
    t = t.to(dtype)
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad_row = int((~finite).any(dim=1).nonzero()[0, 0])
        raise NonFiniteError(f"{name} holds NaN or infinity (first in row {bad_row})", param=name)
    return t


def check_pairs(X: Any, Y: Any, *, minimum: int = 4) -> tuple[Tensor, Tensor]:
    """Check paired source and target vectors and return them as float64 tensors.

    Parameters
    ----------
    X : array_like or Tensor of shape (n, d_src)
        Source-model vectors; row ``i`` pairs with row ``i`` of ``Y``.
    Y : array_like or Tensor of shape (n, d_tgt)
        Target-model vectors of the same items.
    minimum : int, default 4
        Fewest pairs the caller needs.

    Returns
    -------
    X, Y : Tensor of shape (n, d_src) and (n, d_tgt), float64

    Raises
    ------
    ShapeMismatchError
        If either is not 2-D, or their row counts differ.
    NonFiniteError
        If either holds NaN or infinity.
    TooFewPairsError
        If ``n < minimum``.
    """
    X = as_matrix(X, name="X")
    Y = as_matrix(Y, name="Y")
    if X.shape[0] != Y.shape[0]:
        raise ShapeMismatchError(
            f"X and Y must have the same number of rows (pairs), got {X.shape[0]} and {Y.shape[0]}",
            expected=X.shape[0],
            got=Y.shape[0],
            param="Y",
        )
    if X.shape[0] < minimum:
        raise TooFewPairsError(
            f"need at least {minimum} pairs, got {X.shape[0]}",
            minimum=minimum,
            got=X.shape[0],
            param="X",
        )
    return X, Y


def check_config_fields(
    config: Any,
    *,
    zero_ok: frozenset[str] = frozenset(),
    most: Mapping[str, float] | None = None,
) -> None:
    """Validate the ``int`` and ``float`` fields of a frozen settings dataclass, in place.

    Integers must be real ``int`` (not ``bool``) and >= 1 (``seed`` and the names in
    ``zero_ok`` >= 0); floats must be finite numbers > 0 (>= 0 for ``zero_ok``) and are
    stored as ``float``; a field named in ``most`` must not exceed its value there.

    Raises
    ------
    InvalidInputError
        Naming the first field that breaks a rule.
    """
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInputError(f"{f.name} must be an integer", param=f.name)
            minimum = 0 if f.name == "seed" or f.name in zero_ok else 1
            if value < minimum:
                raise InvalidInputError(f"{f.name} must be >= {minimum}", param=f.name)
        elif f.type == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInputError(f"{f.name} must be a number", param=f.name)
            object.__setattr__(config, f.name, float(value))
            if not math.isfinite(value) or value < 0 or (value == 0 and f.name not in zero_ok):
                raise InvalidInputError(f"{f.name} must be finite and > 0", param=f.name)
    for name, bound in (most or {}).items():
        if getattr(config, name) > bound:
            raise InvalidInputError(f"{name} must be <= {bound}", param=name)


def check_device(name: Any) -> torch.device:
    """Parse a torch device name: ``cpu`` or ``cuda[:N]``, CUDA available when asked for.

    Raises
    ------
    InvalidInputError
        For an unknown or unsupported device (``meta``, ``mps``, ...), or ``cuda`` on a
        machine without CUDA.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InvalidInputError(f"unknown device {name!r}", param="device") from None
    if device.type not in ("cpu", "cuda"):
        raise InvalidInputError(f"device must be 'cpu' or 'cuda[:N]', got {name!r}", param="device")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(
            "device 'cuda' asked for, but CUDA is not available", param="device"
        )
    return device
