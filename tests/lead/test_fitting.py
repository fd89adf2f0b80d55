"""Closed-form fits with known answers, fit_stitch dispatch, and a real-data check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lead.errors import (
    FitError,
    IllConditionedError,
    InvalidInputError,
    JobCancelledError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)
from lead.fitting import DEFAULT_RIDGE_ALPHAS, fit_procrustes, fit_ridge, fit_stitch
from lead.stitches import AffineStitch, MLPStitch, OrthogonalStitch, StitchInfo

#: small fits: a second intra-op thread only adds overhead (and jitter on a busy machine)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _orthonormal(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A (rows, cols) matrix with orthonormal columns (rows >= cols) or rows."""
    q, _ = np.linalg.qr(_rng(seed).normal(size=(max(rows, cols), max(rows, cols))))
    return q[:rows, :cols]


def _predict(stitch: torch.nn.Module, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return stitch(torch.from_numpy(X).float()).double().numpy()


# --- Procrustes ----------------------------------------------------------------------------


def test_procrustes_recovers_a_random_rotation_and_offsets() -> None:
    X = _rng(1).normal(size=(200, 16))
    Q = _orthonormal(16, 16, seed=2)
    Y = X @ Q.T + 3.0
    stitch = fit_procrustes(X, Y)
    assert isinstance(stitch, OrthogonalStitch)
    np.testing.assert_allclose(stitch.weight.double().numpy(), Q, atol=1e-5)
    np.testing.assert_allclose(stitch.scale.numpy(), 1.0)
    np.testing.assert_allclose(_predict(stitch, X[:5]), Y[:5], atol=1e-4)


@pytest.mark.parametrize(("d_src", "d_tgt"), [(6, 10), (10, 6)])
def test_procrustes_weight_has_orthonormal_smaller_side(d_src: int, d_tgt: int) -> None:
    X = _rng(3).normal(size=(100, d_src))
    Y = _rng(4).normal(size=(100, d_tgt))
    W = fit_procrustes(X, Y).weight.double().numpy()
    assert W.shape == (d_tgt, d_src)
    gram = W.T @ W if d_tgt > d_src else W @ W.T
    np.testing.assert_allclose(gram, np.eye(min(d_src, d_tgt)), atol=1e-5)


def test_procrustes_recovers_an_isometric_embedding_into_more_dimensions() -> None:
    X = _rng(5).normal(size=(120, 5))
    Q = _orthonormal(9, 5, seed=6)  # orthonormal columns: X ↦ 9-D, distances kept
    stitch = fit_procrustes(X, X @ Q.T)
    np.testing.assert_allclose(stitch.weight.double().numpy(), Q, atol=1e-5)


def test_procrustes_scaling_recovers_per_dimension_scales() -> None:
    raw = _rng(7).normal(size=(300, 8))
    X = np.linalg.qr(raw - raw.mean(0))[0] * 10.0  # centred, XᵀX ∝ I: rotation and scale separate
    Q = _orthonormal(8, 8, seed=8)
    s = np.linspace(0.5, 2.0, 8)
    stitch = fit_procrustes(X, (X @ Q.T) * s, scaling=True)
    np.testing.assert_allclose(stitch.scale.double().numpy(), s, atol=1e-5)
    np.testing.assert_allclose(stitch.weight.double().numpy(), Q, atol=1e-5)


def test_procrustes_scaling_is_finite_for_zero_variance_dimensions() -> None:
    X = _rng(9).normal(size=(50, 4))
    X[:, 2] = 1.0  # constant column
    Y = np.zeros((50, 6))  # five constant target columns: most rotated dimensions meet
    Y[:, 0] = X[:, 0]  # zero variance
    stitch = fit_procrustes(X, Y, scaling=True)
    assert torch.isfinite(stitch.scale).all() and torch.isfinite(stitch.weight).all()
    assert np.isfinite(_predict(stitch, X)).all()


@pytest.mark.parametrize("method", ["ridge", "procrustes", "mlp", "invertible", "anchors"])
@pytest.mark.parametrize("side", ["X", "Y"])
def test_a_side_whose_rows_are_all_the_same_is_refused(method: str, side: str) -> None:
    """A broken embedding pipeline (one vector for every text) would give a stitch that
    answers one vector, and a held-out R² of 0 / 0 that can read 0.9995."""
    X = _rng(3).normal(size=(60, 8))
    Y = X @ _rng(4).normal(size=(8, 6))
    same = np.tile(_rng(5).normal(size=(1, 8 if side == "X" else 6)), (60, 1))
    X, Y = (same, Y) if side == "X" else (X, same)
    with pytest.raises(IllConditionedError, match="do not vary: all 60 rows are the same") as e:
        fit_stitch(X, Y, method=method)
    assert e.value.param == side


# --- ridge ---------------------------------------------------------------------------------


def _lstsq_centred(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    return np.linalg.lstsq(Xc, Yc, rcond=None)[0].T  # (d_tgt, d_src)


def test_ridge_with_alpha_zero_matches_numpy_lstsq() -> None:
    X = _rng(10).normal(size=(80, 12))
    Y = X @ _rng(11).normal(size=(12, 7)) + 0.1 * _rng(12).normal(size=(80, 7)) + 2.0
    stitch = fit_ridge(X, Y, alpha=0.0)
    assert isinstance(stitch, AffineStitch)
    np.testing.assert_allclose(stitch.weight.double().numpy(), _lstsq_centred(X, Y), atol=1e-5)
    np.testing.assert_allclose(stitch.source_mean.double().numpy(), X.mean(0), atol=1e-6)
    np.testing.assert_allclose(stitch.target_mean.double().numpy(), Y.mean(0), atol=1e-6)
    assert stitch.info.fit == {"alpha": 0.0, "alpha_selection": "given"}


def test_ridge_on_rank_deficient_input_is_finite_and_minimum_norm() -> None:
    base = _rng(13).normal(size=(10, 6))
    X = np.hstack([base, base, np.zeros((10, 3))])  # rank 6 of 15 columns, n < d_src
    Y = _rng(14).normal(size=(10, 4))
    stitch = fit_ridge(X, Y, alpha=0.0)
    assert torch.isfinite(stitch.weight).all()
    np.testing.assert_allclose(stitch.weight.double().numpy(), _lstsq_centred(X, Y), atol=1e-5)
    assert np.isfinite(_predict(fit_ridge(X, Y), X)).all()


def test_ridge_with_fewer_pairs_than_dimensions_matches_the_primal_formula() -> None:
    """n < d goes through the thin SVD of the rows (8 pairs of dimension 3,000 took 48 s
    with the d × d eigendecomposition in POST /v1/align): the same weight."""
    X, Y = _rng(15).normal(size=(20, 150)), _rng(16).normal(size=(20, 9))
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    alpha = 0.3
    primal = np.linalg.solve(Xc.T @ Xc / 20 + alpha * np.eye(150), Xc.T @ Yc / 20).T
    np.testing.assert_allclose(
        fit_ridge(X, Y, alpha=alpha).weight.double().numpy(), primal, atol=1e-6
    )


def test_ridge_refuses_more_candidate_strengths_than_it_can_use() -> None:
    """A job with 15 million alphas was accepted (an adversarial pass)."""
    X, Y = _rng(17).normal(size=(40, 5)), _rng(18).normal(size=(40, 3))
    with pytest.raises(InvalidInputError, match="alphas holds 101 strengths; give at most 100"):
        fit_stitch(X, Y, "ridge", alphas=[1.0] * 101)
    assert fit_stitch(X, Y, "ridge", alphas=[1.0] * 100).info.fit["alpha_selection"] == "holdout"


def test_ridge_on_constant_input_is_refused() -> None:
    """Constant input carries nothing to map (the fit could only answer the target mean)."""
    X = np.ones((8, 3))
    Y = _rng(15).normal(size=(8, 2))
    with pytest.raises(IllConditionedError, match="do not vary"):
        fit_ridge(X, Y, alpha=0.0)


def test_ridge_chooses_alpha_on_held_out_pairs() -> None:
    X = _rng(16).normal(size=(60, 40))
    Y = X[:, :3] + 0.5 * _rng(17).normal(size=(60, 3))  # few pairs, many noisy dims
    stitch = fit_ridge(X, Y, seed=3)
    fit = stitch.info.fit
    assert fit["alpha_selection"] == "holdout"
    unit = float((X**2).sum(axis=1).mean())  # the grid's unit: mean squared row norm
    assert fit["alpha_unit"] == pytest.approx(unit)
    assert fit["alpha"] / unit == pytest.approx(
        min(DEFAULT_RIDGE_ALPHAS, key=lambda a: abs(a * unit - fit["alpha"]))
    )
    errors = fit["alpha_holdout_mse"]
    assert len(errors) == len(DEFAULT_RIDGE_ALPHAS)
    assert errors[f"{fit['alpha']:.3g}"] == min(errors.values())
    assert fit["alpha"] > DEFAULT_RIDGE_ALPHAS[0] * unit  # shrinkage helps here


@pytest.mark.parametrize("scale", [1e-4, 1e-3, 1e3, 1e4])
def test_ridge_predictions_do_not_depend_on_the_source_scale(scale: float) -> None:
    """The default strengths are relative to the source rows' mean squared norm: sources
    scaled uniformly get the same predictions (an absolute grid lost held-out R² silently,
    0.37 → -0.11 at ×1,000 on real minilm → mpnet pairs)."""
    X = _rng(20).normal(size=(80, 30))
    Y = X[:, :4] + 0.3 * _rng(21).normal(size=(80, 4))
    base = _predict(fit_ridge(X, Y, seed=1), X)
    scaled = _predict(fit_ridge(X * scale, Y, seed=1), X * scale)
    np.testing.assert_allclose(scaled, base, rtol=1e-4, atol=1e-5)


def test_ridge_with_too_few_pairs_to_hold_out_uses_a_fallback_alpha() -> None:
    X, Y = _rng(18).normal(size=(6, 3)), _rng(19).normal(size=(6, 2))
    assert fit_ridge(X, Y).info.fit["alpha_selection"].startswith("fallback")


@pytest.mark.parametrize("alpha", [-1.0, float("nan"), "x"])
def test_ridge_rejects_bad_alpha(alpha: object) -> None:
    with pytest.raises(InvalidInputError):
        fit_ridge(np.ones((5, 2)), np.ones((5, 2)), alpha=alpha)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        fit_ridge(np.ones((5, 2)), np.ones((5, 2)), alphas=[])


# --- fit_stitch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "cls"),
    [
        ("ridge", AffineStitch),
        ("affine", AffineStitch),
        ("procrustes", OrthogonalStitch),
        ("Orthogonal", OrthogonalStitch),
    ],
)
def test_fit_stitch_dispatches_methods_and_aliases(method: str, cls: type) -> None:
    X, Y = _rng(20).normal(size=(30, 4)), _rng(21).normal(size=(30, 4))
    stitch = fit_stitch(X, Y, method)
    assert type(stitch) is cls and not stitch.training


def test_fit_stitch_records_provenance_without_touching_the_callers_info() -> None:
    X, Y = _rng(22).normal(size=(30, 4)), _rng(23).normal(size=(30, 5))
    info = StitchInfo(source_model="a", target_model="b", fit={"data": "toy"})
    stitch = fit_stitch(X, Y, "ridge", info=info, seed=5, alpha=0.1)
    assert info.fit == {"data": "toy"}
    fit = stitch.info.fit
    assert fit["data"] == "toy" and fit["method"] == "ridge" and fit["pairs"] == 30
    assert fit["seed"] == 5 and fit["options"] == {"alpha": 0.1} and fit["alpha"] == 0.1
    assert fit["lead_version"] == "0.1.0"
    assert stitch.info.source_model == "a"


def test_fit_stitch_normalize_output_defaults_to_target_normalized() -> None:
    X, Y = _rng(24).normal(size=(30, 4)), _rng(25).normal(size=(30, 4))
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)  # unit target rows: normalised by default
    assert fit_stitch(X, Y).normalize_output is True
    raw = StitchInfo(target_normalized=False)
    assert fit_stitch(X, Y, info=raw).normalize_output is False
    assert fit_stitch(X, Y, info=raw, normalize_output=True).normalize_output is True


def test_fit_stitch_mlp_passes_options_to_training() -> None:
    X, Y = _rng(26).normal(size=(40, 4)), _rng(27).normal(size=(40, 3))
    stitch = fit_stitch(X, Y, "mlp", hidden_dim=8, max_epochs=2)
    assert isinstance(stitch, MLPStitch) and stitch.hidden_dim == 8
    assert stitch.info.fit["epochs"] <= 2


def test_fit_stitch_rejects_unknown_method_and_options() -> None:
    X, Y = np.ones((10, 2)), np.ones((10, 2))
    with pytest.raises(InvalidInputError) as info:
        fit_stitch(X, Y, "pca")
    assert info.value.param == "method"
    with pytest.raises(InvalidInputError, match="unknown option") as info:
        fit_stitch(X, Y, "procrustes", alpha=1.0)
    assert info.value.param == "alpha"
    with pytest.raises(InvalidInputError):
        fit_stitch(X, Y, "mlp", seed_offset=1)
    with pytest.raises(InvalidInputError):
        fit_stitch(X, Y, "procrustes", scaling="yes")


def test_fit_stitch_input_errors() -> None:
    good = np.ones((10, 3))
    bad = good.copy()
    bad[4, 0] = np.nan
    with pytest.raises(NonFiniteError):
        fit_stitch(bad, good)
    with pytest.raises(TooFewPairsError):
        fit_stitch(good[:3], good[:3])
    with pytest.raises(ShapeMismatchError):
        fit_stitch(good, good[:9])


METHODS = ["ridge", "procrustes", "mlp", "invertible", "anchors", "unsupervised"]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_refuses_data_beyond_float32(method: str) -> None:
    X, Y = _rng(40).normal(size=(60, 6)), _rng(41).normal(size=(60, 6))
    scaled = X * np.logspace(-150, 150, 6)  # Procrustes used to return NaN outputs
    with pytest.raises(NonFiniteError, match="beyond the float32 range") as info:
        fit_stitch(scaled, Y, method)
    assert info.value.param == "X"
    one_cell = Y.copy()
    one_cell[5, 3] = 1e200
    with pytest.raises(NonFiniteError, match="row 5, column 3"):
        fit_stitch(X, one_cell, method)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_refuses_ill_conditioned_data(method: str) -> None:
    X, Y = _rng(42).normal(size=(60, 6)), _rng(43).normal(size=(60, 6))
    with pytest.raises(IllConditionedError, match="standardise"):
        fit_stitch(X * np.logspace(-19, 19, 6), Y, method)  # fits float32, 38 orders apart


def test_a_fit_float32_cannot_hold_is_an_error_not_nan() -> None:
    X, Y = 1e-30 * _rng(44).normal(size=(40, 4)), 1e30 * _rng(45).normal(size=(40, 4))
    # each side is well-conditioned, but the per-dimension scale would be ~1e60
    with pytest.raises(FitError, match="NaN or infinity in its scale"):
        fit_procrustes(X, Y, scaling=True)
    with pytest.raises(FitError, match="ill-conditioned"):
        fit_stitch(X, Y, "procrustes", scaling=True)
    assert torch.isfinite(fit_procrustes(X, Y).weight).all()  # a rotation alone is fine


def test_fit_stitch_reports_progress_and_propagates_cancellation() -> None:
    X, Y = _rng(28).normal(size=(30, 4)), _rng(29).normal(size=(30, 4))
    calls: list[tuple[str, int, int]] = []
    fit_stitch(X, Y, progress=lambda *a: calls.append(a))
    assert calls == [("fit", 0, 1), ("fit", 1, 1)]

    def cancel(stage: str, step: int, total: int) -> None:
        raise JobCancelledError("cancelled")

    with pytest.raises(JobCancelledError):
        fit_stitch(X, Y, "procrustes", progress=cancel)


# --- real data -----------------------------------------------------------------------------


def test_ridge_minilm_to_mpnet_on_real_scifact_documents(scifact_small) -> None:  # type: ignore[no-untyped-def]
    X = scifact_small.corpus["minilm"].astype(np.float64)
    Y = scifact_small.corpus["mpnet"].astype(np.float64)
    train, test = np.arange(320), np.arange(320, 400)
    stitch = fit_stitch(X[train], Y[train], "ridge")
    pred = _predict(stitch, X[test])
    residual = ((pred - Y[test]) ** 2).sum()
    spread = ((Y[test] - Y[train].mean(0)) ** 2).sum()
    r2 = 1.0 - residual / spread
    assert r2 > 0.2, r2
    cos = (pred / np.linalg.norm(pred, axis=1, keepdims=True)) @ Y[test].T
    top1 = float(np.mean(cos.argmax(axis=1) == np.arange(len(test))))
    assert top1 > 10 * (1 / len(test)), top1  # chance is 1/80


def test_normalisation_follows_the_data() -> None:
    """An exact rotation of offset data (rows far from unit length) is fitted exactly, not
    squeezed onto the unit sphere because StitchInfo defaults to normalised models."""
    from lead.metrics import r2_score

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5)) + 3.0
    Q = np.linalg.qr(rng.normal(size=(5, 5)))[0]
    Y = X @ Q.T
    stitch = fit_stitch(X, Y, "procrustes")
    assert not stitch.normalize_output
    assert not stitch.info.source_normalized and not stitch.info.target_normalized
    with torch.no_grad():
        pred = stitch(torch.from_numpy(X).float())
    assert r2_score(Y, pred, reference_mean=Y.mean(axis=0)) > 0.999
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    assert fit_stitch(unit, unit @ Q.T, "procrustes").normalize_output  # unit rows: as before


def test_the_command_lines_list_every_fitting_method_once() -> None:
    from lead._options import FIT_METHODS_HELP
    from lead.fitting import METHODS as FITTING_METHODS

    methods, _, aliases = FIT_METHODS_HELP.partition(" (aliases: ")
    assert methods.split(" | ") == list(dict.fromkeys(FITTING_METHODS.values()))
    pairs = dict(item.split(" = ") for item in aliases.rstrip(")").split(", "))
    assert pairs == {k: v for k, v in FITTING_METHODS.items() if k != v}
