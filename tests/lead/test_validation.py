"""Input checks: every array that enters a numerical routine is 2-D, finite and float64, and
data to fit on suits float32 (within its range, column spreads not too far apart)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from lead._validation import (
    MAX_SPREAD_RATIO,
    as_matrix,
    check_column_spread,
    check_float32_range,
    check_pairs,
)
from lead.errors import (
    IllConditionedError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)
from tests.conftest import FIXTURES

FLOAT32_MAX = float(np.finfo(np.float32).max)


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
    X, Y = check_pairs(np.eye(5, 3, dtype=np.float32), np.eye(5, 7))
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


def _normal(n: int = 50, d: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.mark.parametrize("side", ["X", "Y"])
def test_check_pairs_names_the_first_value_beyond_float32(side: str) -> None:
    good, huge = _normal(), _normal()
    huge[3, 2], huge[7, 1] = 1e200, -1e39  # finite in float64, infinite in float32
    X, Y = (huge, good) if side == "X" else (good, huge)
    with pytest.raises(NonFiniteError, match=r"1e\+200 in row 3, column 2: beyond the float32"):
        check_pairs(X, Y)
    with pytest.raises(NonFiniteError) as info:
        check_pairs(X, Y)
    assert info.value.param == side
    assert "do not vary" not in info.value.message


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_the_float32_range_ends_at_its_largest_value(kind: str) -> None:
    edge = np.array([[FLOAT32_MAX, -FLOAT32_MAX], [0.0, 1.0]])
    beyond = np.array([[0.0, 1.0], [1.0, -np.nextafter(FLOAT32_MAX, np.inf)]])
    convert = torch.from_numpy if kind == "tensor" else np.asarray
    check_float32_range(convert(edge), name="X")
    with pytest.raises(NonFiniteError, match="row 11, column 1") as info:
        check_float32_range(convert(beyond), name="rows", first_row=10)
    assert info.value.param == "rows"
    check_float32_range(np.full((2, 2), 7, dtype=np.int64), name="X")  # ints always fit
    check_float32_range(np.full((2, 2), 7, dtype=np.float16), name="X")


@pytest.mark.parametrize("side", ["X", "Y"])
def test_columns_spread_too_far_apart_are_ill_conditioned(side: str) -> None:
    good = _normal()
    wide = _normal() * np.logspace(-19, 19, 6)  # within float32, but 38 orders apart
    X, Y = (wide, good) if side == "X" else (good, wide)
    with pytest.raises(IllConditionedError, match="ill-conditioned: column 5") as info:
        check_pairs(X, Y)
    assert info.value.param == side
    assert "standardise the columns" in info.value.message
    assert isinstance(info.value, InvalidInputError)  # HTTP 422 family, catchable as ValueError


def test_one_outlying_cell_is_ill_conditioned_naming_its_row_and_column() -> None:
    X = _normal()
    X[9, 4] = 1e30  # fits float32, but dwarfs every other column
    with pytest.raises(IllConditionedError, match=r"column 4 .* row 9"):
        check_pairs(X, _normal(seed=1))


def test_variation_below_float32_is_ill_conditioned() -> None:
    with pytest.raises(IllConditionedError, match="varies too little for float32"):
        check_pairs(1e-300 * _normal(), _normal())


def test_legitimate_spreads_pass() -> None:
    X = _normal(40, 8)
    X[:, 0] = 0.0  # constant columns (GloVe's unused dimensions) are fine
    X[:, 1] = 0.3
    X[:, 2] = 1e-33 * _normal(40, 1, seed=2)[:, 0]  # dead dimensions of MiniLM / MPNet
    X[:, 3] *= 1e6  # a million times wider than the others: below the limit
    Y = 1e-30 * _normal(40, 3)  # a uniformly tiny scale is fine too
    check_pairs(X, Y)
    with pytest.raises(IllConditionedError, match="do not vary: all 40 rows are the same"):
        check_column_spread(torch.from_numpy(X[:, :2].copy()), name="X")  # nothing varies
    two = np.c_[X[:, 4], 1e-9 * X[:, 5]]  # one real and one dead column: the median is upper
    check_column_spread(torch.from_numpy(two), name="X")
    assert pytest.approx(8.4e6, rel=0.01) == MAX_SPREAD_RATIO


def test_the_real_fixtures_pass() -> None:
    for path in sorted(FIXTURES.glob("*.safetensors")):
        for name, array in load_file(path).items():
            check_float32_range(array, name=name)
            check_column_spread(torch.from_numpy(array), name=f"{path.name}:{name}")
