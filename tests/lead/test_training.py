"""MLP training: config validation, determinism, early stopping, progress and cancellation."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from lead.errors import FitError, InvalidInputError, JobCancelledError, TooFewPairsError
from lead.fitting import fit_ridge
from lead.stitches import MLPStitch
from lead.training import MLPConfig, train_mlp

FAST = {"hidden_dim": 32, "max_epochs": 6, "batch_size": 64}


#: small fits: a second intra-op thread only adds overhead (and jitter on a busy machine)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _nonlinear_pairs(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    Y = X @ rng.normal(size=(6, 5)) + (X @ rng.normal(size=(6, 5)) * 0.5) ** 2
    return X, Y


def test_config_is_frozen_and_fast_by_default() -> None:
    config = MLPConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0  # type: ignore[misc]
    assert config.loss == "mse" and config.device == "cpu" and config.max_epochs <= 30
    assert isinstance(MLPConfig(lr=1).lr, float)


@pytest.mark.parametrize(
    "bad",
    [
        {"loss": "hinge"},
        {"lr": -1.0},
        {"lr": 0},
        {"lr": 1e30},  # accepted, and the fit failed in its second epoch (a user trial)
        {"weight_decay": 1e30},  # the same, blamed on lr
        {"init_scale": 1e6},
        {"hidden_dim": 0},
        {"depth": 1.5},
        {"batch_size": True},
        {"holdout_fraction": 1.0},
        {"temperature": float("nan")},
        {"device": "not-a-device"},
        {"seed": -1},
        {"patience": "3"},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError) as info:
        MLPConfig(**bad)  # type: ignore[arg-type]
    assert info.value.param == next(iter(bad))


def test_training_improves_on_the_ridge_start_for_a_nonlinear_map() -> None:
    X, Y = _nonlinear_pairs()
    config = MLPConfig(
        hidden_dim=64, max_epochs=30, patience=5, lr=1e-2, batch_size=32, init="ridge"
    )
    stitch = train_mlp(X, Y, config)
    assert isinstance(stitch, MLPStitch) and not stitch.training
    fit = stitch.info.fit
    assert fit["best_holdout_loss"] < 0.5 * fit["init_holdout_loss"], fit  # ridge misses (XB)²
    assert 1 <= fit["best_epoch"] <= fit["epochs"] <= 30
    with torch.no_grad():
        assert torch.isfinite(stitch(torch.from_numpy(X).float())).all()


def test_training_is_deterministic_for_a_seed() -> None:
    X, Y = _nonlinear_pairs(200)
    a = train_mlp(X, Y, MLPConfig(**FAST, seed=1))
    b = train_mlp(X, Y, MLPConfig(**FAST, seed=1))
    c = train_mlp(X, Y, MLPConfig(**FAST, seed=2))
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    assert not all(torch.equal(t, c.state_dict()[k]) for k, t in a.state_dict().items())


@pytest.mark.parametrize("loss", ["mse", "cosine", "infonce"])
def test_every_loss_trains_to_a_finite_stitch(loss: str) -> None:
    X, Y = _nonlinear_pairs(200)
    stitch = train_mlp(X, Y, MLPConfig(**FAST, loss=loss), normalize_output=True)
    assert stitch.normalize_output and stitch.info.fit["loss"] == loss
    with torch.no_grad():
        out = stitch(torch.from_numpy(X[:10]).float())
    assert torch.allclose(out.norm(dim=1), torch.ones(10), atol=1e-5)
    assert stitch.info.fit["best_holdout_loss"] <= stitch.info.fit["init_holdout_loss"]


def test_progress_is_reported_per_epoch() -> None:
    X, Y = _nonlinear_pairs(200)
    calls: list[tuple[str, int, int]] = []
    stitch = train_mlp(X, Y, MLPConfig(**FAST, patience=100), lambda *a: calls.append(a))
    assert calls == [("train", e, 6) for e in range(1, 7)]
    assert stitch.info.fit["epochs"] == 6


def test_early_stopping_stops_after_patience_epochs_without_improvement() -> None:
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(200, 4)), rng.normal(size=(200, 3))  # nothing to learn
    stitch = train_mlp(X, Y, MLPConfig(**{**FAST, "max_epochs": 50}, patience=2, lr=1e-2))
    fit = stitch.info.fit
    assert fit["epochs"] == fit["best_epoch"] + 2 < 50


def test_without_improvement_the_ridge_fit_on_all_pairs_is_returned() -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(100, 4))
    Y = X @ rng.normal(size=(4, 3)) + 0.01 * rng.normal(size=(100, 3))
    config = MLPConfig(**{**FAST, "max_epochs": 1}, lr=0.1, init="ridge")  # a bad epoch
    stitch = train_mlp(X, Y, config)
    assert stitch.info.fit["best_epoch"] == 0 and stitch.info.fit["refitted_ridge"] is True
    ridge = fit_ridge(X, Y, seed=0)
    assert torch.equal(stitch.weight, ridge.weight)
    assert torch.equal(stitch.target_mean, ridge.target_mean)
    with torch.no_grad():
        x = torch.from_numpy(X[:5]).float()
        torch.testing.assert_close(stitch(x), ridge(x))


def test_cancellation_from_the_callback_propagates() -> None:
    X, Y = _nonlinear_pairs(200)
    seen: list[int] = []

    def progress(stage: str, step: int, total: int) -> None:
        seen.append(step)
        if step == 2:
            raise JobCancelledError("job cancelled")

    with pytest.raises(JobCancelledError):
        train_mlp(X, Y, MLPConfig(**FAST, patience=100), progress)
    assert seen == [1, 2]


def test_divergence_is_a_fit_error() -> None:
    X, Y = _nonlinear_pairs(200)
    # the largest lr and weight decay the config takes (1e12 was accepted before)
    with pytest.raises(FitError, match=r"lower lr \(now 10\) or weight_decay \(now 1000\)"):
        train_mlp(
            X, Y, MLPConfig(**{**FAST, "batch_size": 4}, lr=10, weight_decay=1e3, patience=100)
        )


def test_too_few_pairs_to_hold_out() -> None:
    X, Y = _nonlinear_pairs(12)
    with pytest.raises(TooFewPairsError):
        train_mlp(X, Y, MLPConfig(**FAST))


def test_feature_init_starts_closer_than_ridge_and_training_improves_it() -> None:
    X, Y = _nonlinear_pairs()
    common = {"hidden_dim": 64, "max_epochs": 30, "patience": 5, "lr": 1e-2, "batch_size": 32}
    ridge_start = train_mlp(X, Y, MLPConfig(**common, init="ridge")).info.fit
    features = train_mlp(X, Y, MLPConfig(**common, init="ridge-features")).info.fit
    # the closed-form random-feature start already captures much of the (XB)² term
    assert features["init_holdout_loss"] < 0.5 * ridge_start["init_holdout_loss"]
    assert features["best_holdout_loss"] <= features["init_holdout_loss"]
    assert features["init"] == "ridge-features"


def test_feature_init_with_zero_epochs_of_gain_keeps_the_closed_form_fit(
    scifact_small: Any,
) -> None:
    X = scifact_small.corpus["minilm"]
    Y = scifact_small.corpus["mpnet"]
    config = MLPConfig(hidden_dim=128, max_epochs=1, patience=1, lr=1e-9)
    stitch = train_mlp(X, Y, config)
    assert stitch.info.fit["best_epoch"] in (0, 1)
    last = stitch.mlp[-1]
    assert isinstance(last, torch.nn.Linear)
    assert float(last.weight.abs().max()) > 0  # the feature layer is used, not zeroed


def test_an_early_stop_ends_the_progress_complete() -> None:
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(200, 4)), rng.normal(size=(200, 3))  # nothing to learn
    calls: list[tuple[str, int, int]] = []
    config = MLPConfig(**{**FAST, "max_epochs": 50}, patience=2, lr=1e-2)
    stitch = train_mlp(X, Y, config, lambda *a: calls.append(a))
    epochs = stitch.info.fit["epochs"]
    assert epochs < 50
    # every epoch but the last out of max_epochs; the last one completes the stage
    assert calls == [("train", e, 50) for e in range(1, epochs)] + [("train", epochs, epochs)]
