"""Stitches fitted on unit-length vectors scale their inputs to unit length (the library
path: apply_stitch, score_stitch, ``lead translate``); an all-zero input is refused by row.

Real vectors: the 80 everyday sentences (``tests/fixtures/everyday_sentences.*``) and the
bundled stitches, which were fitted on unit-length vectors of both models.
"""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import lead.unit_input as lu
from lead._apply import apply_stitch
from lead.artifacts import load_stitch
from lead.cli import main
from lead.errors import InvalidInputError, ZeroVectorError
from lead.fitting import fit_stitch
from lead.stitches import StitchInfo
from lead.unit_input import normalize_input
from tests.conftest import FIXTURES, REPO, SciFactSmall

EVERYDAY = FIXTURES / "everyday_sentences.safetensors"
MODELS = REPO / "models"


@pytest.fixture(scope="module")
def everyday() -> dict[str, np.ndarray]:
    """Unit-length float32 vectors of 80 sentences: minilm, e5, pml3 (80, 384), mpnet (80, 768)."""
    return load_file(EVERYDAY)


def _rowwise_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1)


def test_scaled_inputs_translate_as_unit_ones(everyday: dict[str, np.ndarray]) -> None:
    stitch = load_stitch(MODELS / "minilm-to-mpnet")
    x = everyday["minilm"]
    unit = apply_stitch(stitch, x)
    for scale in (10.0, 0.1, 1e25, 1e-25):  # 1e±25: squared norms over / underflow float32
        scaled = apply_stitch(stitch, x * np.float32(scale))
        assert float(_rowwise_cosine(scaled, unit).min()) > 0.99999, scale
    # the quality the issue measured: 0.673 with unit inputs, 0.515 with inputs ×10 (before)
    target = torch.from_numpy(everyday["mpnet"])
    quality = float(_rowwise_cosine(apply_stitch(stitch, x * 10), target).mean())
    assert quality == pytest.approx(float(_rowwise_cosine(unit, target).mean()), abs=1e-5)
    assert quality > 0.65


def test_score_stitch_sees_the_same_translations(everyday: dict[str, np.ndarray]) -> None:
    from lead.scorecard import score_stitch

    stitch = load_stitch(MODELS / "minilm-to-mpnet")
    mean = stitch.target_mean.numpy()
    unit = score_stitch(stitch, everyday["minilm"], everyday["mpnet"], target_train_mean=mean)
    scaled = score_stitch(
        stitch, everyday["minilm"] * 10, everyday["mpnet"], target_train_mean=mean
    )
    assert scaled.r2_score == pytest.approx(unit.r2_score, abs=1e-5)
    assert scaled.top1_accuracy_score == unit.top1_accuracy_score


def test_inverse_inputs_follow_the_target_side(everyday: dict[str, np.ndarray]) -> None:
    stitch = load_stitch(MODELS / "minilm-to-pml3-invertible")
    y = everyday["pml3"]
    unit = apply_stitch(stitch, y, inverse=True)
    scaled = apply_stitch(stitch, y * 10, inverse=True)
    assert float(_rowwise_cosine(scaled, unit).min()) > 0.99999
    zero = y.copy()
    zero[5] = 0
    with pytest.raises(ZeroVectorError) as caught:
        apply_stitch(stitch, zero, inverse=True)
    assert (caught.value.param, caught.value.row) == ("X[5]", 5)


def test_a_zero_vector_is_refused_by_row(everyday: dict[str, np.ndarray]) -> None:
    stitch = load_stitch(MODELS / "minilm-to-mpnet")
    x = everyday["minilm"].copy()
    x[3] = 0
    with pytest.raises(ZeroVectorError) as caught:
        apply_stitch(stitch, x)
    error = caught.value
    assert isinstance(error, InvalidInputError) and isinstance(error, ValueError)
    assert (error.param, error.row) == ("X[3]", 3)
    assert "X[3]" in error.message and "zero vector" in error.message
    x[3] = 1e-45  # only subnormal float32 values: no reliable direction either
    with pytest.raises(ZeroVectorError):
        apply_stitch(stitch, x)


def test_unit_rows_pass_unchanged_and_only_off_rows_are_counted(
    everyday: dict[str, np.ndarray],
) -> None:
    stitch = load_stitch(MODELS / "minilm-to-mpnet")
    x = torch.from_numpy(everyday["minilm"])
    same, rescaled = normalize_input(stitch, x)
    assert same is x and rescaled == 0  # unit rows: no copy, bit-identical answers
    mixed = x.clone()
    mixed[[2, 7]] *= 3
    out, rescaled = normalize_input(stitch, mixed)
    assert rescaled == 2
    assert torch.equal(out[[0, 1, 3]], x[[0, 1, 3]])
    torch.testing.assert_close(out[[2, 7]], x[[2, 7]])


def test_doctests() -> None:
    result = doctest.testmod(lu)
    assert result.attempted > 0 and result.failed == 0


def test_a_stitch_fitted_on_raw_vectors_keeps_their_length(scifact_small: SciFactSmall) -> None:
    corpus = scifact_small.corpus
    X = corpus["minilm"] * np.linspace(0.5, 2, len(corpus["minilm"]), dtype=np.float32)[:, None]
    stitch = fit_stitch(X, corpus["mpnet"], "ridge", info=StitchInfo(), alpha=1e-2)
    assert stitch.info.source_normalized is False  # recorded from the data
    x = corpus["minilm"][:4]
    with torch.no_grad():
        direct = stitch(torch.from_numpy(x * 10)).double()
    torch.testing.assert_close(apply_stitch(stitch, x * 10), direct)  # not rescaled
    zero = np.zeros((1, x.shape[1]), dtype=np.float32)
    assert torch.isfinite(apply_stitch(stitch, zero)).all()  # a raw zero vector is a point


def test_cli_translate_rescales_and_names_a_zero_row(
    everyday: dict[str, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = everyday["minilm"]
    for name, rows in (("unit.npy", x), ("scaled.npy", x * 10)):
        np.save(tmp_path / name, rows)
        out = tmp_path / f"out-{name}"
        args = ["translate", str(MODELS / "minilm-to-mpnet"), "--input", str(tmp_path / name)]
        assert main([*args, "--output", str(out), "--batch-size", "30"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["input_normalized"] is True
        assert summary["rescaled_inputs"] == (0 if name == "unit.npy" else 80)
    got = torch.from_numpy(np.load(tmp_path / "out-scaled.npy"))
    expected = torch.from_numpy(np.load(tmp_path / "out-unit.npy"))
    assert float(_rowwise_cosine(got, expected).min()) > 0.99999

    zero = x.copy()
    zero[45] = 0  # in the second batch of 30
    np.save(tmp_path / "zero.npy", zero)
    args = ["translate", str(MODELS / "minilm-to-mpnet"), "--input", str(tmp_path / "zero.npy")]
    assert main([*args, "--output", str(tmp_path / "o.npy"), "--batch-size", "30"]) == 2
    assert "row 45" in capsys.readouterr().err
    assert not (tmp_path / "o.npy").exists()
