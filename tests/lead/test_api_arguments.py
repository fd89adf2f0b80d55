"""The library's public functions refuse wrong arguments with a :class:`~lead.errors.LeadError`
that names them, never a silently wrong answer or a bare Python error from deep inside.

Each case was found by a library user trial (a helper using the API as its docs say, then
carelessly): before, ``apply_stitch(..., batch_size=-1)`` returned 0 rows, a string counted
as ``True``, ``read_embeddings(rows=[[0, 1]])`` gave a 3-D array, and the rest raised
``AttributeError``, ``TypeError``, ``RuntimeError``, ``IndexError`` or numpy's
``ValueError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from lead import apply_stitch, fit_stitch, load_stitch, save_stitch
from lead.closed_form import fit_procrustes
from lead.data import EmbeddingWriter, read_embeddings
from lead.errors import InvalidInputError, LeadError, NonFiniteError, ShapeMismatchError
from lead.invertible import InvertibleConfig, train_invertible
from lead.scorecard import round_trip_scores, score_stitch
from lead.splits import holdout_split, kfold_indices
from lead.stitches import InvertibleStitch, Stitch
from lead.training import train_mlp
from tests.conftest import SciFactSmall

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(scifact_small: SciFactSmall) -> tuple[np.ndarray, np.ndarray]:
    return scifact_small.corpus["minilm"][:200], scifact_small.corpus["pml3"][:200]


@pytest.fixture(scope="module")
def stitch(pair: tuple[np.ndarray, np.ndarray]) -> Stitch:
    return fit_stitch(*pair, "ridge")


def _refused(call: Any, param: str, match: str, error: type[LeadError] = InvalidInputError) -> None:
    with pytest.raises(error, match=match) as refused:
        call()
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("batch_size", "match"),
    [(-1, "batch_size must be >= 1"), (0, ">= 1"), (1.5, "must be an integer"), ("8", "integer")],
)
def test_apply_stitch_refuses_a_batch_size_that_is_not_a_positive_integer(
    stitch: Stitch, pair: tuple[np.ndarray, np.ndarray], batch_size: Any, match: str
) -> None:
    X = pair[0][:10]
    _refused(lambda: apply_stitch(stitch, X, batch_size=batch_size), "batch_size", match)
    assert apply_stitch(stitch, X, batch_size=3).shape == (10, 384)  # 4 batches, all rows


def test_functions_that_take_a_stitch_refuse_anything_else(
    stitch: Stitch, pair: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    X, Y = pair
    for other in ("minilm-to-pml3", None, nn.Linear(384, 384)):
        _refused(lambda o=other: apply_stitch(o, X), "stitch", "must be a lead stitch")
        _refused(lambda o=other: save_stitch(o, tmp_path / "s"), "stitch", "lead stitch")
        _refused(
            lambda o=other: score_stitch(o, X, Y, target_train_mean=Y.mean(0)), "stitch", "stitch"
        )
    _refused(lambda: round_trip_scores(stitch, X, reverse="abc"), "reverse", "lead stitch")
    card = lambda: score_stitch(stitch, X, Y, target_train_mean=Y.mean(0), reverse=5)  # noqa: E731
    _refused(card, "reverse", "lead stitch")
    _refused(lambda: apply_stitch(stitch, X, inverse="no"), "inverse", "true or false")


def test_boolean_options_must_be_bools(pair: tuple[np.ndarray, np.ndarray]) -> None:
    X, Y = pair
    _refused(lambda: fit_stitch(X, Y, normalize_output="no"), "normalize_output", "true or false")
    _refused(lambda: fit_procrustes(X, Y, scaling="x"), "scaling", "true or false")
    assert not fit_stitch(X, Y, normalize_output=False).normalize_output
    scaled = fit_procrustes(X, Y, scaling=np.True_).scale  # numpy's bool is a bool
    assert torch.equal(scaled, fit_procrustes(X, Y, scaling=True).scale)
    assert not torch.equal(scaled, torch.ones_like(scaled))


def test_fit_stitch_checks_its_other_arguments(pair: tuple[np.ndarray, np.ndarray]) -> None:
    X, Y = pair
    _refused(lambda: fit_stitch(X, Y, info={"source_model": "a"}), "info", "lead.StitchInfo")
    _refused(lambda: fit_stitch(X, Y, progress=5), "progress", "a function or None")
    _refused(lambda: fit_stitch(X, Y, "local", sample_weight="abc"), "sample_weight", "numbers")
    column = np.ones((len(X), 1))
    with pytest.raises(ShapeMismatchError, match=r"shape \(200, 1\).*one per pair"):
        fit_stitch(X, Y, "local", sample_weight=column)
    _refused(lambda: train_mlp(X, Y, {"max_epochs": 2}), "config", "MLPConfig")
    _refused(lambda: train_invertible(X, Y, "cfg"), "config", "InvertibleConfig")
    _refused(lambda: train_invertible(X, Y, InvertibleConfig(), progress=1), "progress", "None")


def test_the_inverse_checks_its_input_as_the_forward_does(
    pair: tuple[np.ndarray, np.ndarray],
) -> None:
    Y = pair[1]
    stitch = InvertibleStitch(384, 384, coupling_layers=1, hidden_dim=8)
    _refused(lambda: stitch.inverse(Y), "y", "the inverse takes a torch.Tensor")
    wide = torch.from_numpy(Y).double()
    _refused(lambda: stitch.inverse(wide), "y", "is torch.float64 but the stitch computes in")
    with pytest.raises(ShapeMismatchError, match=r"shape \(n, 384\)"):
        stitch.inverse(torch.zeros(2, 5))
    with torch.no_grad():
        assert stitch.inverse(torch.from_numpy(Y)).shape == (200, 384)
        assert apply_stitch(stitch, Y.astype(np.float64), inverse=True).shape == (200, 384)


def test_load_stitch_checks_its_dtype(tmp_path: Path, stitch: Stitch) -> None:
    folder = save_stitch(stitch, tmp_path / "s")
    for dtype in (torch.int32, "float16"):
        _refused(lambda d=dtype: load_stitch(folder, dtype=d), "dtype", "floating torch dtype")
    assert load_stitch(folder, dtype=torch.float16).weight.dtype == torch.float16


def test_save_stitch_names_a_place_it_cannot_write(stitch: Stitch, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    target = tmp_path / "notes.txt" / "stitch"
    _refused(lambda: save_stitch(stitch, target), "folder", "is on the path")
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: holdout_split(100, 0.2, seed=-1), "seed"),
        (lambda: holdout_split(100, "0.2"), "holdout_fraction"),
        (lambda: kfold_indices(100, 5, seed=-1), "seed"),
        (lambda: kfold_indices(100, 2.5), "folds"),
        (lambda: kfold_indices(100, 1), "folds"),
    ],
)
def test_split_helpers_check_their_arguments(call: Any, param: str) -> None:
    _refused(call, param, param)


def test_read_embeddings_checks_the_rows_it_is_given(
    pair: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    path = tmp_path / "x.npy"
    np.save(path, pair[0])
    for rows, match in (
        ([[0, 1]], "1-D array of integer row indices"),
        ([0.5], "integer row indices"),
        (np.array([True, False]), "integer row indices"),
        ([999999], r"in \[0, 200\)"),
        ([-1], r"in \[0, 200\)"),
    ):
        _refused(lambda r=rows: read_embeddings(path, rows=r), "rows", match)
    got = read_embeddings(path, rows=[5, 0, 5])
    assert np.array_equal(got, pair[0][[5, 0, 5]])
    assert read_embeddings(path, rows=[]).shape == (0, 384)


def test_embedding_writer_refuses_what_the_reader_would(tmp_path: Path) -> None:
    _refused(lambda: EmbeddingWriter(tmp_path / "w.npy", -1, 4), "n", ">= 0")
    for spec in ("w.npy", "w.safetensors"):
        for bad in (np.nan, 1e300):
            with (
                pytest.raises(NonFiniteError, match=r"\(row 1\)"),
                EmbeddingWriter(tmp_path / spec, 2, 4) as writer,
            ):
                writer.write(np.array([[1.0, 2, 3, 4], [bad, 0, 0, 0]]))
            assert not (tmp_path / spec).exists()  # nothing half-written appears
        with EmbeddingWriter(tmp_path / spec, 2, 4) as writer:
            writer.write(np.ones((2, 4)))
        assert np.array_equal(read_embeddings(tmp_path / spec), np.ones((2, 4), np.float32))
