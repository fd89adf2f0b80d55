"""Input checks shared by fitting, training and scoring (private).

Everything that enters a numerical routine passes through :func:`as_matrix` or
:func:`check_pairs`, so that a wrong shape or a NaN is a clear :class:`~lead.errors.LeadError`
naming the argument, never a NaN further down.

Data that a stitch is fitted on must also suit float32, in which stitches keep their
parameters and compute: :func:`check_float32_range` refuses values beyond float32's range
(they would become infinity) and :func:`check_column_spread` refuses columns whose spreads
are so far apart that float32 rounding would erase the typical column. :func:`check_pairs`
runs both (fitting, alignment), :func:`lead.data.check_embeddings` runs them on files and
uploads, and :func:`check_fitted` refuses a fit that still produced NaN or infinity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lead._options import MAX_SEED, check_float_option, check_int_option
from lead.errors import (
    FitError,
    IllConditionedError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)

__all__ = [
    "MAX_SPREAD_RATIO",
    "as_matrix",
    "check_bool",
    "check_callable",
    "check_column_spread",
    "check_config",
    "check_config_fields",
    "check_device",
    "check_fitted",
    "check_float32_range",
    "check_instance",
    "check_pairs",
    "check_stitch",
]

_FLOAT32 = torch.finfo(torch.float32)
#: Largest ratio of a column's standard deviation to the median column's: beyond
#: ``1 / eps`` of float32 (about 8.4e6), a typical column's contribution to a float32 sum
#: with the widest one is below rounding. Real embeddings stay below 3 (a dead dimension
#: with a tiny spread is below the median and does not count).
MAX_SPREAD_RATIO = 1.0 / float(_FLOAT32.eps)
#: Rows checked by :func:`check_fitted` (the ones with the largest entries).
_FITTED_ROWS = 1024


def check_instance(value: Any, cls: type, name: str, *, what: str, how: str) -> None:
    """Refuse a ``value`` that is not an instance of ``cls``.

    Raises
    ------
    InvalidInputError
        ``"{name} must be {what} ({how}), got {type}"``, ``param`` ``name``.
    """
    if not isinstance(value, cls):
        raise InvalidInputError(
            f"{name} must be {what} ({how}), got {type(value).__name__}", param=name
        )


def check_stitch(stitch: Any, name: str = "stitch") -> None:
    """Refuse anything but a :class:`~lead.stitches.Stitch` (a path, a plain module, None).

    Raises
    ------
    InvalidInputError
        Naming ``name`` and what was given.
    """
    from lead.stitches import Stitch

    how = "lead.fit_stitch or lead.load_stitch give one"
    check_instance(stitch, Stitch, name, what="a lead stitch", how=how)


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is True or False (a string such as ``"no"`` is not).

    Raises
    ------
    InvalidInputError
        If it is anything else (``param`` is ``name``).
    """
    if not isinstance(value, bool | np.bool_):
        raise InvalidInputError(f"{name} must be true or false, got {value!r:.80}", param=name)
    return bool(value)


def check_config(config: Any, cls: type, name: str = "config") -> None:
    """Refuse a ``config`` that is not an instance of ``cls`` (a dict of options, say).

    Raises
    ------
    InvalidInputError
        Naming ``name`` and how to build one.
    """
    how = f"{cls.__module__}.{cls.__name__}(**options)"
    check_instance(config, cls, name, what=f"a {cls.__name__}", how=how)


def check_callable(value: Any, name: str) -> None:
    """Refuse a ``value`` that is neither None nor callable (e.g. a progress callback).

    Raises
    ------
    InvalidInputError
        Naming ``name``.
    """
    if value is not None and not callable(value):
        raise InvalidInputError(
            f"{name} must be a function or None, got {type(value).__name__}", param=name
        )


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


def check_float32_range(x: Tensor | np.ndarray, *, name: str, first_row: int = 0) -> None:
    """Refuse values whose magnitude a float32 cannot hold (they would become infinity).

    Parameters
    ----------
    x : Tensor or ndarray of shape (n, d)
        Finite numbers of any dtype (a numpy array is not copied).
    name : str
        The array's name in the message and the error's ``param``.
    first_row : int, default 0
        Row number of ``x[0]`` in the message (for a batch of a larger array).

    Raises
    ------
    NonFiniteError
        If some ``|x| > 3.4e38``, naming the first such row and column.
    """
    if isinstance(x, Tensor):
        if not x.is_floating_point() or torch.finfo(x.dtype).max <= _FLOAT32.max:
            return
        over_t = x.abs() > _FLOAT32.max
        if not bool(over_t.any()):
            return
        row, col = (int(i) for i in over_t.nonzero()[0])
    else:
        if x.dtype.kind != "f" or float(np.finfo(x.dtype).max) <= _FLOAT32.max:
            return
        over = np.abs(x) > _FLOAT32.max
        if not over.any():
            return
        row, col = (int(i[0]) for i in over.nonzero())
    raise NonFiniteError(
        f"{name} holds {float(x[row, col]):.3g} in row {first_row + row}, column {col}: beyond "
        f"the float32 range (±{_FLOAT32.max:.3g}) in which stitches compute, where it would "
        "become infinity; rescale the vectors (e.g. L2-normalise the rows)",
        param=name,
    )


def _column_std(x: Tensor, scale: Tensor, rows: int = 1 << 16) -> Tensor:
    """Population standard deviation of each column of ``(n, d)`` ``x``, as float64 ``(d,)``.

    Each column is divided by its ``scale`` (its largest magnitude) first, so that neither
    1e-300 nor 3e38 underflows or overflows when squared; two passes in blocks of ``rows``
    rows, so a float32 ``x`` is never copied whole.
    """
    n = x.shape[0]
    mean = x.sum(dim=0, dtype=torch.float64) / scale / n
    total = torch.zeros_like(mean)
    for start in range(0, n, rows):
        total += ((x[start : start + rows].to(torch.float64) / scale - mean) ** 2).sum(dim=0)
    return (total / n).sqrt() * scale


def check_column_spread(x: Tensor, *, name: str) -> None:
    """Refuse a matrix whose column spreads are too far apart, or too small, for float32.

    Parameters
    ----------
    x : Tensor of shape (n, d)
        Finite values within the float32 range (:func:`check_float32_range`), any dtype.
    name : str
        The array's name in the message and the error's ``param``.

    Raises
    ------
    IllConditionedError
        If the widest column's standard deviation exceeds :data:`MAX_SPREAD_RATIO` times
        the (upper) median one's, among the columns that vary, if no column's standard
        deviation reaches the smallest normal float32 (1.2e-38), or if all rows are the
        same (no column varies).

    Notes
    -----
    Constant columns (all rows equal) are legitimate and ignored, and so are columns far
    *narrower* than the median (dead dimensions of real models vary by 1e-33): a column
    that does not vary enough does no harm. A column far *wider* than the median does: in
    float32 sums (a stitch's matrix product) every other column's share is rounded away,
    and a least-squares fit in float64 drops the others as numerically zero.
    """
    if x.shape[0] < 2:
        return
    high, low = x.amax(dim=0), x.amin(dim=0)
    varying = (high > low).nonzero().flatten()
    if varying.numel() == 0:
        raise IllConditionedError(
            f"the {name} vectors do not vary: all {x.shape[0]} rows are the same vector (a "
            "stitch fitted to them answers that vector for every input, and every score is "
            "0 / 0); check the embedding pipeline",
            param=name,
        )
    scale = torch.maximum(high.abs(), low.abs()).to(torch.float64).clamp_min(1e-300)
    spread = _column_std(x, scale)[varying]
    top = int(spread.argmax())
    # the upper median: at least half of the varying columns are as wide as this
    largest, median = float(spread[top]), float(spread.sort().values[spread.numel() // 2])
    if largest < _FLOAT32.tiny:
        raise IllConditionedError(
            f"{name} varies too little for float32: its widest column has a standard "
            f"deviation of {largest:.3g}, below the smallest float32 ({_FLOAT32.tiny:.3g}); "
            "rescale the vectors (e.g. standardise the columns or L2-normalise the rows)",
            param=name,
        )
    if largest > MAX_SPREAD_RATIO * median:
        column = int(varying[top])
        values = x[:, column].to(torch.float64)
        row = int((values - values.mean()).abs().argmax())
        raise IllConditionedError(
            f"{name} is ill-conditioned: column {column} spreads {largest / median:.3g} times "
            f"wider than the median column (standard deviation {largest:.3g} against "
            f"{median:.3g}; its farthest value is in row {row}), so in float32 the other "
            "columns would be lost to rounding; standardise the columns (subtract each "
            "column's mean, divide by its standard deviation) or remove outlying rows first",
            param=name,
        )


def check_fitted(stitch: torch.nn.Module, X: Tensor, *, method: str) -> None:
    """Refuse a fitted stitch with non-finite parameters, or non-finite outputs on ``X``.

    Parameters
    ----------
    stitch : torch.nn.Module
        The fitted stitch, in eval mode.
    X : Tensor of shape (n, d_src)
        The source vectors it was fitted on; the :data:`_FITTED_ROWS` rows with the largest
        entries are translated.
    method : str
        The method's name, for the message.

    Raises
    ------
    FitError
        If a parameter, buffer or output holds NaN or infinity.
    """
    hint = (
        "float32 cannot hold what the data asks for; the data is probably ill-conditioned "
        "(source and target scales far apart): standardise or L2-normalise X and Y first"
    )
    for label, tensor in (*stitch.named_parameters(), *stitch.named_buffers()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise FitError(f"the {method} fit produced NaN or infinity in its {label}: {hint}")
    param = next(stitch.parameters())
    rows = X.abs().amax(dim=1).topk(min(_FITTED_ROWS, X.shape[0])).indices
    with torch.no_grad():
        out = stitch(X[rows].to(device=param.device, dtype=param.dtype))
    if not bool(torch.isfinite(out).all()):
        raise FitError(f"the {method} stitch produces NaN or infinity on its own data: {hint}")


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
        If either holds NaN or infinity, or a value beyond the float32 range.
    IllConditionedError
        If either's column spreads are too far apart for float32
        (:func:`check_column_spread`).
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
    for M, name in ((X, "X"), (Y, "Y")):
        check_float32_range(M, name=name)
    for M, name in ((X, "X"), (Y, "Y")):
        check_column_spread(M, name=name)
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
            minimum = 0 if f.name == "seed" or f.name in zero_ok else 1
            maximum = MAX_SEED if f.name == "seed" else None
            check_int_option(value, f.name, minimum=minimum, maximum=maximum)
        elif f.type == "float":
            number = check_float_option(value, f.name, minimum=0.0, inclusive=f.name in zero_ok)
            object.__setattr__(config, f.name, number)
    for name, bound in (most or {}).items():
        if getattr(config, name) > bound:
            raise InvalidInputError(f"{name} must be <= {bound}", param=name)


def check_device(name: Any) -> torch.device:
    """Parse a torch device name: ``cpu`` or ``cuda[:N]``, a CUDA device that exists here.

    Raises
    ------
    InvalidInputError
        For an unknown or unsupported device (``meta``, ``mps``, ``''``, ...), ``cuda`` on a
        machine without CUDA, or ``cuda:N`` past the devices it has.
    """
    unknown = f"unknown device {name!r}: use cpu or cuda[:N]"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InvalidInputError(unknown, param="device") from None
    if device.type not in ("cpu", "cuda"):
        raise InvalidInputError(unknown, param="device")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"device {name!r}: this machine has no CUDA device", param="device")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InvalidInputError(
            f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)",
            param="device",
        )
    return device
