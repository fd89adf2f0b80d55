"""Input checks and small helpers shared by the metric modules (private).

:func:`_pair` validates paired sets; the rest normalise, centre and block the computations
so that no metric returns NaN or holds more than :data:`_BLOCK_ELEMENTS` similarities.
"""

from __future__ import annotations

from numbers import Integral
from typing import TypeAlias

import numpy as np
import torch
from torch import Tensor

from lead._validation import as_matrix
from lead.errors import InvalidInputError, ShapeMismatchError, TooFewPairsError

#: numpy array or torch tensor, converted to float64 by :func:`lead._validation.as_matrix`.
Matrix: TypeAlias = "np.ndarray | Tensor"

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


def _check_k(k: object, n: int, *, minimum: int = 1) -> int:
    """``k`` as an int in ``[minimum, n)``, else InvalidInputError naming ``k``."""
    if isinstance(k, bool) or not isinstance(k, Integral):
        raise InvalidInputError(f"k must be an integer, got {k!r}", param="k")
    if not minimum <= int(k) < n:
        raise InvalidInputError(f"k must satisfy {minimum} <= k < n={n}, got k={k}", param="k")
    return int(k)


def _centred_unit(M: Tensor) -> Tensor | None:
    """Column-centred ``M`` scaled to unit Frobenius norm; None when it does not vary.

    Every score that uses it is invariant to translation and isotropic scaling; the scaling
    keeps squares and products finite for entries near 1e-300 or 1e200.
    """
    M = M / _common_scale(M)
    C = M - M.mean(dim=0, keepdim=True)
    size, spread = float(torch.linalg.norm(M)), float(torch.linalg.norm(C))
    if spread <= _CONSTANT_TOL * size or spread == 0.0:
        return None
    return C / spread
