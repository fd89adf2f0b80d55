"""The seed methods through ``fit_stitch`` and the CLI: anchors, unsupervised, invertible."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lead.artifacts import load_stitch, read_stitch_config
from lead.cli import main
from lead.errors import InvalidInputError
from lead.fitting import METHODS, check_method_options, fit_stitch
from lead.metrics import top1_accuracy_score
from lead.stitches import AffineStitch, OrthogonalStitch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL_UNSUPERVISED = {"sample_size": 400, "rounds": 20}


def test_every_method_is_known() -> None:
    assert {"ridge", "procrustes", "mlp", "invertible", "anchors", "unsupervised"} <= set(
        METHODS.values()
    )
    assert check_method_options("Anchors", {"alpha": 0.1}) == "anchors"
    with pytest.raises(InvalidInputError, match="unknown method") as caught:
        check_method_options("vec2vec", {})
    assert caught.value.param == "method"
    with pytest.raises(InvalidInputError) as caught:
        check_method_options("unsupervised", {"epsilon": 0.01, "sample": 3})
    assert caught.value.param == "sample"


def test_anchors_through_fit_stitch(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    stitch = fit_stitch(X[:100], Y[:100], "anchors")
    assert isinstance(stitch, AffineStitch) and stitch.normalize_output
    assert stitch.info.fit["method"] == "anchors" and stitch.info.fit["pairs"] == 100
    with torch.no_grad():
        pred = stitch(torch.from_numpy(X[100:]))
    assert top1_accuracy_score(pred, Y[100:]) > 0.3  # chance: 1 / 300


def test_unsupervised_through_fit_stitch_ignores_the_row_order(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    perm = np.random.default_rng(3).permutation(len(Y))
    a = fit_stitch(X, Y, "unsupervised", **SMALL_UNSUPERVISED)
    b = fit_stitch(X, Y[perm], "unsupervised", **SMALL_UNSUPERVISED)
    assert isinstance(a, OrthogonalStitch)
    assert a.info.fit["pairs"] == 0 and a.info.fit["method"] == "unsupervised"
    for stitch in (a, b):
        with torch.no_grad():
            pred = stitch(torch.from_numpy(X))
        assert top1_accuracy_score(pred, Y) > 0.3  # chance: 1 / 400


def test_unsupervised_takes_different_row_counts(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"][:320], scifact_small.corpus["pml3"][120:]
    stitch = fit_stitch(X, Y, "unsupervised", **SMALL_UNSUPERVISED)
    assert stitch.info.fit["unpaired_rows"] == [320, 280]
    with torch.no_grad():  # the 200 documents both sides hold
        pred = stitch(torch.from_numpy(X[120:]))
    assert top1_accuracy_score(pred, Y[:200]) > 0.2  # chance: 1 / 200


def test_cli_fit_unpaired_then_score(
    scifact_small: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    np.save(tmp_path / "x.npy", X[:250])
    np.save(tmp_path / "y.npy", Y[150:])  # other documents, another row count
    out = tmp_path / "unpaired"
    options = [f"--option={k}={v}" for k, v in SMALL_UNSUPERVISED.items()]
    argv = ["fit-unpaired", "--source", str(tmp_path / "x.npy"), "--target"]
    argv += [str(tmp_path / "y.npy"), "--source-model", "a", "--target-model", "b"]
    assert main([*argv, *options, "--out", str(out)]) == 0
    config = read_stitch_config(out)
    assert config["fit"]["method"] == "unsupervised"
    # 250 and 250 rows: below what unpaired matching needs to be reliable, and it says so
    assert any("unreliable below" in w for w in config["fit"]["warnings"])
    err = capsys.readouterr().err
    assert "warning: only 250 rows" in err
    assert "refine: 100%" in err  # its refinement rounds' progress bar, run to the end
    assert config["fit"]["data"] == {
        "source": str(tmp_path / "x.npy"),
        "target": str(tmp_path / "y.npy"),
    }
    stitch = load_stitch(out)
    with torch.no_grad():
        pred = stitch(torch.from_numpy(X[150:250]))  # documents both sides held
    assert top1_accuracy_score(pred, Y[150:250]) > 0.2  # chance: 1 / 100


@pytest.mark.parametrize("method", ["anchors", "invertible"])
def test_cli_fit_with_the_seed_methods(scifact_small: Any, tmp_path: Path, method: str) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    out = tmp_path / method
    argv = ["fit", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy")]
    argv += ["--method", method, "--source-model", "a", "--target-model", "b"]
    if method == "invertible":
        argv += ["--option", "max_epochs=1", "--option", "hidden_dim=16"]
    assert main([*argv, "--out", str(out)]) == 0
    card = read_stitch_config(out)["scorecard"]
    assert card["top1_accuracy_score"] > 0.3
    assert (card["round_trip"] is not None) == (method == "invertible")


def test_cli_score_with_a_reverse_stitch(scifact_small: Any, tmp_path: Path) -> None:
    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    common = ["--source-model", "a", "--target-model", "b"]
    x, y = str(tmp_path / "x.npy"), str(tmp_path / "y.npy")
    there, back = str(tmp_path / "there"), str(tmp_path / "back")
    assert main(["fit", "--source", x, "--target", y, *common, "--out", there]) == 0
    assert main(["fit", "--source", y, "--target", x, "--source-model", "b", "--target-model",
                 "a", "--out", back]) == 0  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["score", there, "--source", x, "--target", y, "--reverse", back]) == 0
    card = json.loads(printed.getvalue())
    assert card["round_trip"]["via"] == "reverse_stitch"
    assert card["round_trip"]["round_trip_top1_accuracy_score"] > 0.8


def _scifact(shared: Path, key: str) -> np.ndarray:
    from safetensors.numpy import load_file

    corpus: np.ndarray = load_file(shared / "scifact" / "embeddings" / f"{key}.safetensors")[
        "corpus"
    ]
    return corpus  # rows in the order of ids.json for minilm and pml3


@pytest.mark.shared
def test_unsupervised_on_scifact_meets_the_target(shared_data: Path) -> None:
    """No pairs: 2,000 minilm documents against 2,000 OTHER pml3 documents; top-1 among
    1,000 held-out documents (the issue's bar: 0.5; bench/zeroshot.py measured 0.76-0.79)."""
    X, Y = _scifact(shared_data, "minilm"), _scifact(shared_data, "pml3")
    order = np.random.default_rng(0).permutation(len(X))
    test, source, target = order[:1000], order[1000:3000], order[3000:5000]
    stitch = fit_stitch(X[source], Y[target], "unsupervised")
    with torch.no_grad():
        pred = stitch(torch.from_numpy(X[test]))
    assert top1_accuracy_score(pred, Y[test]) >= 0.5, stitch.info.fit


@pytest.mark.shared
def test_anchors_rank_better_than_ridge_on_the_same_300_pairs(shared_data: Path) -> None:
    X, Y = _scifact(shared_data, "minilm"), _scifact(shared_data, "pml3")
    order = np.random.default_rng(0).permutation(len(X))
    test, anchors = order[:1000], order[1000:1300]
    scores = {}
    for method in ("anchors", "ridge"):
        stitch = fit_stitch(X[anchors], Y[anchors], method)
        with torch.no_grad():
            scores[method] = top1_accuracy_score(stitch(torch.from_numpy(X[test])), Y[test])
    assert scores["anchors"] > scores["ridge"] + 0.03, scores


@pytest.mark.parametrize(
    ("method", "options", "param"),
    [
        ("ridge", {"alpha": True}, "alpha"),
        ("ridge", {"alphas": None}, "alphas"),
        ("ridge", {"alphas": []}, "alphas"),
        ("ridge", {"alphas": "0.1"}, "alphas"),
        ("procrustes", {"scaling": 1}, "scaling"),
        ("mlp", {"loss": "hinge"}, "loss"),
        ("invertible", {"coupling_layers": -2}, "coupling_layers"),
        ("anchors", {"alpha": -1}, "alpha"),
        ("unsupervised", {"rounds": 10**7}, "rounds"),
        ("unsupervised", {"sample_size": 10**8}, "sample_size"),
        ("unsupervised", {"refine_size": 10**9}, "refine_size"),
        ("unsupervised", {"epsilon": float("nan")}, "epsilon"),
        # extreme values that used to reach the fit (overflow, memory, unsupported devices)
        ("invertible", {"lr": 1e300}, "lr"),
        ("invertible", {"init_scale": 1e300}, "init_scale"),
        ("invertible", {"max_epochs": 10**9}, "max_epochs"),
        ("invertible", {"covariance_reg": 1e-300}, "covariance_reg"),
        ("invertible", {"device": "meta"}, "device"),
        ("mlp", {"device": "mps"}, "device"),
        ("mlp", {"max_epochs": 10**9}, "max_epochs"),
    ],
)
def test_option_values_are_checked_before_any_fitting(
    method: str, options: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_method_options(method, options)
    assert caught.value.param == param


def test_round_trips_need_a_stitch_of_the_opposite_direction(scifact_small: Any) -> None:
    from lead.errors import ModelMismatchError
    from lead.scorecard import round_trip_scores
    from lead.stitches import StitchInfo

    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    there = fit_stitch(X, Y, "ridge", info=StitchInfo(source_model="a", target_model="b"))
    same = fit_stitch(X, Y, "ridge", info=StitchInfo(source_model="a", target_model="b"))
    back = fit_stitch(Y, X, "ridge", info=StitchInfo(source_model="b", target_model="a"))
    with pytest.raises(ModelMismatchError, match="reverse stitch"):
        round_trip_scores(there, X, reverse=same)
    assert round_trip_scores(there, X, reverse=back)["round_trip_top1_accuracy_score"] > 0.5


def test_cli_translate_inverse_round_trips_through_files(
    scifact_small: Any, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", Y)
    out = str(tmp_path / "inv")
    argv = ["fit", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy")]
    argv += ["--method", "invertible", "--option", "max_epochs=1", "--option", "hidden_dim=16"]
    assert main([*argv, "--source-model", "a", "--target-model", "b", "--out", out]) == 0
    there, back = str(tmp_path / "there.safetensors"), str(tmp_path / "back.safetensors")
    assert main(["translate", out, "--input", str(tmp_path / "x.npy"), "--output", there]) == 0
    assert main(["translate", out, "--input", there, "--output", back, "--inverse"]) == 0
    x_back = next(iter(load_file(back).values()))
    cosine = (x_back * X).sum(axis=1) / np.linalg.norm(x_back, axis=1) / np.linalg.norm(X, axis=1)
    assert cosine.min() > 0.999
    ridge = str(tmp_path / "ridge")
    argv = ["fit", "--source", str(tmp_path / "x.npy"), "--target", str(tmp_path / "y.npy")]
    assert main([*argv, "--source-model", "a", "--target-model", "b", "--out", ridge]) == 0
    code = main(["translate", ridge, "--input", there, "--output", back, "--inverse"])
    assert code == 2  # not invertible: a LEAD error


def test_a_fit_that_meets_non_finite_values_is_a_fit_error(scifact_small: Any) -> None:
    from lead.errors import FitError, IllConditionedError

    X, Y = scifact_small.corpus["minilm"][:60], scifact_small.corpus["pml3"][:60]
    with pytest.raises(IllConditionedError, match="varies too little for float32"):
        fit_stitch(X * 1e-40, Y, "invertible", max_epochs=1, hidden_dim=8)  # subnormal float32
    tiny = X * 1e-36  # the smallest scale the input checks let through
    try:
        stitch = fit_stitch(tiny, Y, "invertible", max_epochs=1, hidden_dim=8)
    except FitError as error:  # never NonFiniteError blaming finite inputs
        assert "non-finite" in str(error) or "failed" in str(error)
    else:
        with torch.no_grad():
            assert bool(torch.isfinite(stitch(torch.from_numpy(tiny))).all())
