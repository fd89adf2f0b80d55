"""Input checks: every array that enters a numerical routine is 2-D, finite and float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lead._validation import as_matrix, check_pairs
from lead.errors import (
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)


def test_as_matrix_converts_numpy_lists_and_tensors_to_float64() -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    t = as_matrix(a, name="X")
    assert t.dtype == torch.float64 and t.shape == (3, 2)
    assert torch.equal(t, torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], dtype=torch.float64))
    assert as_matrix([[1, 2]], name="X").dtype == torch.float64
    assert as_matrix(torch.ones(2, 2), name="X", dtype=torch.float32).dtype == torch.float32


def test_as_matrix_accepts_read_only_and_big_endian_arrays_without_warning() -> None:
    a = np.ones((2, 3))
    a.setflags(write=False)
    assert as_matrix(a, name="X").shape == (2, 3)
    b = np.ones((2, 3), dtype=">f4")
    assert torch.equal(as_matrix(b, name="X"), torch.ones(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (3, 0)])
def test_as_matrix_rejects_wrong_shapes(shape: tuple[int, ...]) -> None:
    with pytest.raises(ShapeMismatchError) as info:
        as_matrix(np.zeros(shape), name="Y")
    assert info.value.param == "Y"
    assert info.value.got == shape


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_as_matrix_rejects_non_finite_values_naming_the_row(bad: float) -> None:
    a = np.zeros((4, 3))
    a[2, 1] = bad
    with pytest.raises(NonFiniteError, match="row 2") as info:
        as_matrix(a, name="X")
    assert info.value.param == "X"
    with pytest.raises(NonFiniteError):
        as_matrix(torch.from_numpy(a), name="X")


def test_as_matrix_rejects_values_that_overflow_the_target_dtype() -> None:
    with pytest.raises(NonFiniteError):
        as_matrix(np.full((2, 2), 1e300), name="X", dtype=torch.float32)


@pytest.mark.parametrize(
    "bad", [np.array([["a", "b"]]), np.array([[1 + 2j]]), torch.ones(2, 2, dtype=torch.bool)]
)
def test_as_matrix_rejects_non_real_input(bad: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        as_matrix(bad, name="X")
    assert info.value.param == "X"


def test_check_pairs_returns_float64_pairs() -> None:
    X, Y = check_pairs(np.ones((5, 3), np.float32), np.ones((5, 7)))
    assert X.dtype == Y.dtype == torch.float64
    assert X.shape == (5, 3) and Y.shape == (5, 7)


def test_check_pairs_rejects_row_mismatch() -> None:
    with pytest.raises(ShapeMismatchError) as info:
        check_pairs(np.ones((5, 3)), np.ones((6, 3)))
    assert (info.value.expected, info.value.got) == (5, 6)


def test_check_pairs_rejects_too_few_pairs() -> None:
    with pytest.raises(TooFewPairsError) as info:
        check_pairs(np.ones((3, 2)), np.ones((3, 2)))
    assert (info.value.minimum, info.value.got) == (4, 3)
    with pytest.raises(TooFewPairsError):
        check_pairs(np.ones((5, 2)), np.ones((5, 2)), minimum=8)
