"""Per-vector confidence: calibration on real fixture embeddings, OOD flags, batch
invariance, and the save → load round trip of the head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from lead._apply import stitch_input
from lead.artifacts import load_stitch, save_stitch
from lead.batch_invariance import forward_batch_invariant
from lead.confidence import (
    MIN_HELD_OUT_ROWS,
    ConfidenceHead,
    _pav,
    attach_confidence,
    fit_confidence,
    translate_with_confidence,
)
from lead.errors import (
    IllConditionedError,
    InvalidInputError,
    ShapeMismatchError,
    StitchFormatError,
    TooFewPairsError,
)
from lead.fitting import fit_stitch
from lead.metrics import spearman_score
from lead.migrate.translator import LocalTranslator
from lead.stitches import Stitch, unit_rows
from tests.conftest import SciFactSmall

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pairs(scifact_small: SciFactSmall) -> dict[str, np.ndarray]:
    """Documents + queries, MiniLM → mpnet; 340 training rows and 160 held-out rows."""
    X = np.concatenate([scifact_small.corpus["minilm"], scifact_small.queries["minilm"]])
    Y = np.concatenate([scifact_small.corpus["mpnet"], scifact_small.queries["mpnet"]])
    perm = np.random.default_rng(0).permutation(len(X))
    train, held = perm[:340], perm[340:]
    return {"Xt": X[train], "Yt": Y[train], "Xh": X[held], "Yh": Y[held]}


@pytest.fixture(scope="module")
def pairs(scifact_small: SciFactSmall) -> dict[str, np.ndarray]:
    return _pairs(scifact_small)


@pytest.fixture(scope="module", params=["ridge", "procrustes"])
def fitted(request: pytest.FixtureRequest, pairs: dict[str, np.ndarray]) -> tuple[Stitch, dict]:
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], request.param, seed=0)
    report = fit_confidence(stitch, pairs["Xt"], pairs["Yt"], pairs["Xh"], pairs["Yh"])
    return stitch, report


def _cosines(y: torch.Tensor, Y: np.ndarray) -> np.ndarray:
    yn = y.double().numpy()
    return np.asarray((yn * Y).sum(1) / np.linalg.norm(yn, axis=1) / np.linalg.norm(Y, axis=1))


def test_confidence_ranks_held_out_rows_by_their_true_cosine(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray]
) -> None:
    stitch, report = fitted
    # the out-of-fold figure over 160 real held-out rows (measured 0.76 ridge, 0.78 Procrustes)
    assert report["in_domain_spearman_score"] > 0.5, report
    assert report["held_out_rows"] == 160 and report["train_rows"] == 340
    y, confidence, ood = translate_with_confidence(stitch, pairs["Xh"])
    assert confidence.dtype == torch.float32 and confidence.shape == (160,)
    assert bool(((confidence >= 0) & (confidence <= 1)).all())
    true = _cosines(y, pairs["Yh"])
    # calibrated: the confidence estimates the cosine itself, not only its rank
    assert abs(float(confidence.double().mean()) - float(true.mean())) < 0.05
    assert spearman_score(confidence.numpy(), true) > 0.5
    assert not bool(ood.any())  # real in-domain rows are not flagged


def test_garbage_and_other_models_vectors_are_flagged(
    fitted: tuple[Stitch, dict], scifact_small: SciFactSmall
) -> None:
    stitch, _ = fitted

    def flagged(x: Any) -> float:
        _, confidence, ood = translate_with_confidence(stitch, x)
        assert bool((confidence[ood] == 0).all())  # the calibration cannot vouch for them
        return float(ood.float().mean())

    # fitted on 340 rows only, the threshold is loose (on 17,000 rows of ../shared/data every
    # Gaussian vector is flagged, bench/confidence.py); measured here 0.975, 0.94 and 0.845
    assert flagged(torch.randn(200, 384, generator=torch.Generator().manual_seed(0))) > 0.9
    assert flagged(np.random.default_rng(1).permuted(scifact_small.corpus["minilm"], axis=1)) > 0.9
    # paraphrase-MiniLM-L3 vectors have MiniLM's dimension but are not MiniLM vectors
    assert flagged(scifact_small.corpus["pml3"][:200]) > 0.75


def test_inputs_of_another_length_are_flagged_for_a_stitch_of_non_unit_inputs(
    pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    """A stitch fitted on vectors that are not of unit length takes inputs as they are, so
    the head checks their length too: the Mahalanobis distance alone (along the training
    rows' least-variance axes) let an all-zero row and a row three times too long through
    (measured: confidence 0.63 and 0.76, none flagged)."""
    rng = np.random.default_rng(0)
    lengths = {key: rng.uniform(5, 15, (len(pairs[key]), 1)) for key in ("Xt", "Xh")}
    Xt, Xh = pairs["Xt"] * lengths["Xt"], pairs["Xh"] * lengths["Xh"]
    stitch = fit_stitch(Xt, pairs["Yt"], "ridge")
    assert not stitch.info.source_normalized  # inputs are taken as they are
    report = fit_confidence(stitch, Xt, pairs["Yt"], Xh, pairs["Yh"])
    low, high = report["input_norm_range"]
    assert low < 5 and high > 15 and report["held_out_ood_fraction"] == 0.0
    _, _, ood = translate_with_confidence(stitch, Xh)
    assert not bool(ood.any())  # its own kind of rows
    x = Xh[:1] / np.linalg.norm(Xh[:1])
    probes = np.concatenate([np.zeros_like(x), x * 0.1, x * (low * 0.99), x * (high * 1.01)])
    _, confidence, ood = translate_with_confidence(stitch, probes)
    assert ood.tolist() == [True] * 4 and confidence.tolist() == [0.0] * 4
    inside = np.concatenate([x * (low * 1.01), x * (high * 0.99)])
    assert not bool(translate_with_confidence(stitch, inside)[2].any())
    # saved and loaded, the range holds, and the card names it
    folder = save_stitch(stitch, tmp_path / "s")
    assert torch.equal(translate_with_confidence(load_stitch(folder), probes)[2], ood)
    assert f"outside [{low:.4g}, {high:.4g}]" in (folder / "README.md").read_text()
    # a head of version 3 read from its file keeps its own rule: no length check
    _to_older_head(folder, 3)
    assert not bool(translate_with_confidence(load_stitch(folder), probes[:1])[2].any())


def test_translation_is_the_plain_translation_bit_for_bit(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    stitch, _ = fitted
    save_stitch(stitch, tmp_path / "s")
    loaded = load_stitch(tmp_path / "s")
    plain = LocalTranslator(tmp_path / "s")(pairs["Xh"])
    y, _, _ = translate_with_confidence(loaded, pairs["Xh"])
    assert np.array_equal(y.numpy(), plain)


def test_each_row_is_scored_alone_as_in_any_batch(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray]
) -> None:
    stitch, _ = fitted
    rows = torch.from_numpy(pairs["Xh"][:37])
    _, batch_conf, batch_ood = translate_with_confidence(stitch, rows)
    for i in (0, 5, 36):
        _, alone, alone_ood = translate_with_confidence(stitch, rows[i : i + 1])
        assert torch.equal(alone[0], batch_conf[i]) and bool(alone_ood[0] == batch_ood[i])
    big = torch.cat([rows, torch.from_numpy(pairs["Xt"][:987])])  # 1,024 rows
    assert torch.equal(translate_with_confidence(stitch, big)[1][:37], batch_conf)


def test_save_load_round_trips_the_head_exactly(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    stitch, report = fitted
    folder = save_stitch(stitch, tmp_path / "s")
    config = json.loads((folder / "config.json").read_text())
    saved = config["confidence"]["report"]
    assert saved["in_domain_spearman_score"] == report["in_domain_spearman_score"]
    assert "confidence.knots_x" in load_file(folder / "model.safetensors")
    assert f"**{report['in_domain_spearman_score']:.4f}**" in (folder / "README.md").read_text()
    loaded = load_stitch(folder)
    assert loaded.confidence_head is not None
    expected = translate_with_confidence(stitch, pairs["Xh"])
    got = translate_with_confidence(loaded, pairs["Xh"])
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_head_stays_float32_in_a_float16_file_and_a_half_stitch(
    pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], "ridge")
    stitch.half().float()  # score what a float16 file stores, as lead fit does
    fit_confidence(stitch, pairs["Xt"], pairs["Yt"], pairs["Xh"], pairs["Yh"])
    expected = translate_with_confidence(stitch, pairs["Xh"])[1]
    folder = save_stitch(stitch, tmp_path / "s", dtype="float16")
    tensors = load_file(folder / "model.safetensors")
    assert tensors["weight"].dtype == torch.float16
    assert tensors["confidence.projection"].dtype == torch.float32
    assert torch.equal(translate_with_confidence(load_stitch(folder), pairs["Xh"])[1], expected)
    half = load_stitch(folder, dtype=torch.float16)
    assert half.confidence_head is not None
    assert half.confidence_head.projection.dtype == torch.float32


def test_a_stitch_without_a_head_loads_with_none_and_refuses_to_score(
    pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], "ridge")
    assert stitch.confidence_head is None
    folder = save_stitch(stitch, tmp_path / "s")
    assert "confidence" not in json.loads((folder / "config.json").read_text())
    loaded = load_stitch(folder)
    assert loaded.confidence_head is None
    with pytest.raises(InvalidInputError, match="no confidence head"):
        translate_with_confidence(loaded, pairs["Xh"])


def test_detaching_a_head_drops_its_tensors(fitted: tuple[Stitch, dict], tmp_path: Path) -> None:
    stitch, _ = fitted
    head = stitch.confidence_head
    try:
        stitch.confidence_head = None
        assert not any(k.startswith("confidence.") for k in stitch.state_dict())
    finally:
        stitch.confidence_head = head
    assert any(k.startswith("confidence.") for k in stitch.state_dict())


def _corrupt(folder: Path, config_change: Any = None, tensor_change: Any = None) -> None:
    config = json.loads((folder / "config.json").read_text())
    if config_change is not None:
        config_change(config)
        (folder / "config.json").write_text(json.dumps(config))
    if tensor_change is not None:
        tensors = load_file(folder / "model.safetensors")
        tensor_change(tensors)
        save_file(tensors, folder / "model.safetensors")


def _set(key: str, value: Any) -> Any:
    return lambda config: config["confidence"].__setitem__(key, value)


@pytest.mark.parametrize(
    ("config_change", "tensor_change", "message"),
    [
        (_set("method", "pickle"), None, "unsupported confidence method"),
        (_set("version", 99), None, "unsupported confidence method"),
        (_set("rank", "64"), None, "confidence.rank must be an integer"),
        (_set("rank", 0), None, "bad confidence block"),
        (_set("stitch_features", 3), None, "stitches give 0 \\(none\\)"),
        (_set("stitch_features", -1), None, "bad confidence block"),
        (_set("stitch_features", True), None, "stitch_features must be an integer"),
        (_set("knots", 1000), None, "tensor 'confidence.knots_x' has shape"),
        (_set("knots", 10**30), None, "bad confidence block"),  # nothing allocated
        (_set("version", 2.0), None, "unsupported confidence method"),
        (_set("version", 1), None, "stitch_features needs version 2"),
        (
            None,
            lambda t: t["confidence.knots_y"].copy_(t["confidence.knots_y"].flip(0)),
            "'confidence.knots_y' must be non-decreasing",
        ),
        (
            None,
            lambda t: t["confidence.ood_threshold"].fill_(-1.0),
            "'confidence.ood_threshold' must be at least 0",
        ),
        (
            None,
            lambda t: t["confidence.input_norm_range"].copy_(torch.tensor([2.0, 1.0])),
            "'confidence.input_norm_range' must be \\[low, high\\]",
        ),
        (
            None,
            lambda t: t["confidence.input_norm_range"].fill_(float("nan")),
            "'confidence.input_norm_range' must be",
        ),
        (_set("version", 3), None, "unexpected tensor 'confidence.input_norm_range'"),
        (
            lambda c: c["tensors"].__setitem__("confidence.bias", 1),
            None,
            "must map tensor names to shapes",
        ),
        (_set("report", [1]), None, "confidence.report must be an object"),
        (_set("report", {"in_domain_spearman_score": float("nan")}), None, "NaN is not JSON"),
        (lambda c: c.__setitem__("confidence", "yes"), None, "must be an object"),
        (None, lambda t: t.pop("confidence.bias"), "tensor 'confidence.bias' is missing"),
        (
            None,
            lambda t: t.__setitem__("confidence.knots_x", torch.ones_like(t["confidence.knots_x"])),
            "strictly increasing",
        ),
        (
            None,
            lambda t: t["confidence.bias"].fill_(float("nan")),
            "'confidence.bias' must be finite",
        ),
        (
            lambda c: (c.pop("confidence"), c.pop("tensors")),
            None,
            "unexpected tensor 'confidence.",
        ),
    ],
)
def test_a_malformed_head_is_a_format_error(
    fitted: tuple[Stitch, dict],
    tmp_path: Path,
    config_change: Any,
    tensor_change: Any,
    message: str,
) -> None:
    stitch, _ = fitted
    folder = save_stitch(stitch, tmp_path / "s")
    if tensor_change is not None:  # the declared shapes would catch a missing tensor first
        _corrupt(folder, lambda c: c.pop("tensors"))
    _corrupt(folder, config_change, tensor_change)
    with pytest.raises(StitchFormatError, match=message):
        load_stitch(folder)


def _to_older_head(folder: Path, version: int) -> None:
    """Rewrite a saved head of the current version as one of ``version`` (< 4) would be
    saved: no ``input_norm_range`` tensor, and for version 1 no ``stitch_features`` and the
    report's old key names."""

    def config_change(config: dict[str, Any]) -> None:
        config["confidence"]["version"] = version
        del config["tensors"]["confidence.input_norm_range"]
        if version == 1:
            assert config["confidence"].pop("stitch_features") == 0
            report = config["confidence"]["report"]
            report["spearman_in_domain"] = report.pop("in_domain_spearman_score")

    _corrupt(folder, config_change, lambda t: t.pop("confidence.input_norm_range"))


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_head_still_loads_and_scores_the_output_itself(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray], tmp_path: Path, version: int
) -> None:
    """Version 1 (before the stitch's own features) had no ``stitch_features``; versions 1
    and 2 scored the stitch's output itself (unit rows), versions 3 and later the output
    before its L2 normalisation. A file keeps the version it was fitted with, and is scored
    so."""
    stitch, _ = fitted
    assert stitch.normalize_output and stitch.confidence_head is not None
    assert stitch.confidence_head.version == 4 and stitch.confidence_head.scores_unnormalized
    folder = save_stitch(stitch, tmp_path / "s")
    _to_older_head(folder, version)
    old = load_stitch(folder)
    head = old.confidence_head
    assert head is not None and head.version == version and not head.scores_unnormalized
    # read under the current name (what GET /v1/stitches shows)
    assert "in_domain_spearman_score" in head.report
    y, confidence, ood = translate_with_confidence(old, pairs["Xh"])
    x = stitch_input(stitch, pairs["Xh"])  # what the forward receives
    with torch.inference_mode():
        raw = stitch.forward_unnormalized(x)
        assert not torch.allclose(raw.norm(dim=1), torch.ones(len(x)))  # not unit rows
        as_fitted = head.score(x, y)  # the unit rows, as versions 1 and 2 were fitted on
        assert torch.equal(confidence, as_fitted[0]) and torch.equal(ood, as_fitted[1])
        # the same numbers scored the version-3 way differ: the version is honoured
        assert not torch.equal(confidence, head.score(x, raw)[0])
        # and the current head scores the unnormalised output
        now = stitch.confidence_head.score(x, raw)[0]
        assert torch.equal(translate_with_confidence(stitch, pairs["Xh"])[1], now)
    resaved = json.loads((save_stitch(old, tmp_path / "again") / "config.json").read_text())
    assert resaved["confidence"]["version"] == version


def test_the_unnormalised_forward_is_the_output_before_its_normalisation(
    fitted: tuple[Stitch, dict], pairs: dict[str, np.ndarray]
) -> None:
    stitch, _ = fitted
    x = stitch_input(stitch, pairs["Xh"])
    with torch.inference_mode():
        raw = stitch.forward_unnormalized(x)
        torch.testing.assert_close(unit_rows(raw), forward_batch_invariant(stitch, x))
        assert float(raw.norm(dim=1).std()) > 1e-3  # the norms the head reads vary
        for i in (0, 7, 159):  # alone: the same bits
            assert torch.equal(stitch.forward_unnormalized(x[i : i + 1]), raw[i : i + 1])
            y = stitch.forward_scored(x[i : i + 1])[0]
            assert torch.equal(y, forward_batch_invariant(stitch, x)[i : i + 1])
        stitch.normalize_output = False
        try:
            assert torch.equal(stitch.forward_unnormalized(x), forward_batch_invariant(stitch, x))
        finally:
            stitch.normalize_output = True


def test_the_card_reads_a_head_saved_before_the_score_names(
    fitted: tuple[Stitch, dict], tmp_path: Path
) -> None:
    """Heads saved before the report's names ended in ``_score`` said ``spearman_in_domain``."""
    from lead._model_card import model_card

    stitch, report = fitted
    config = json.loads((save_stitch(stitch, tmp_path / "s") / "config.json").read_text())
    saved = config["confidence"]["report"]
    saved["spearman_in_domain"] = saved.pop("in_domain_spearman_score")
    card = model_card(config, "s")
    assert f"**{report['in_domain_spearman_score']:.4f}**" in card
    assert "confidence_spearman_score" in card


def test_too_few_held_out_rows(pairs: dict[str, np.ndarray]) -> None:
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], "ridge")
    few = MIN_HELD_OUT_ROWS - 1
    with pytest.raises(TooFewPairsError, match=f"at least {MIN_HELD_OUT_ROWS}"):
        fit_confidence(stitch, pairs["Xt"], pairs["Yt"], pairs["Xh"][:few], pairs["Yh"][:few])
    assert stitch.confidence_head is None
    with pytest.raises(ShapeMismatchError):
        fit_confidence(stitch, pairs["Xt"], pairs["Yt"], pairs["Xh"], pairs["Yh"][:, :5])


def test_rows_that_do_not_vary_are_refused(pairs: dict[str, np.ndarray]) -> None:
    """Training rows all the same vector, or held-out rows all translated equally well:
    a clear error, not numpy's LinAlgError or a NaN in the report."""
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], "ridge")
    same = np.repeat(pairs["Xt"][:1], len(pairs["Xt"]), axis=0)
    with pytest.raises(IllConditionedError, match="do not vary") as error:
        fit_confidence(stitch, same, pairs["Yt"], pairs["Xh"], pairs["Yh"])
    assert error.value.param == "X_train"
    held_x = np.repeat(pairs["Xh"][:1], len(pairs["Xh"]), axis=0)
    held_y = np.repeat(pairs["Yh"][:1], len(pairs["Yh"]), axis=0)
    with pytest.raises(IllConditionedError, match="equally well") as error:
        fit_confidence(stitch, pairs["Xt"], pairs["Yt"], held_x, held_y)
    assert error.value.param == "X_held"
    assert stitch.confidence_head is None


def test_general_rows_are_reported_apart_and_checked(pairs: dict[str, np.ndarray]) -> None:
    stitch = fit_stitch(pairs["Xt"], pairs["Yt"], "ridge")
    Xh, Yh = pairs["Xh"], pairs["Yh"]
    report = fit_confidence(
        stitch, pairs["Xt"], pairs["Yt"], Xh[:100], Yh[:100], X_general=Xh[100:], Y_general=Yh[100:]
    )
    assert (report["held_out_rows"], report["general_rows"]) == (100, 60)
    assert report["in_domain_spearman_score"] > 0.3
    assert -1 <= report["out_of_domain_spearman_score"] <= 1
    with pytest.raises(InvalidInputError, match="both X_general and Y_general"):
        fit_confidence(stitch, pairs["Xt"], pairs["Yt"], Xh, Yh, X_general=Xh)
    with pytest.raises(TooFewPairsError, match="general rows"):
        fit_confidence(
            stitch, pairs["Xt"], pairs["Yt"], Xh, Yh, X_general=Xh[:10], Y_general=Yh[:10]
        )
    # asked for, so not skipped like too few held-out rows are
    with pytest.raises(TooFewPairsError, match="general rows"):
        attach_confidence(
            stitch, pairs["Xt"], pairs["Yt"], Xh, Yh, X_general=Xh[:10], Y_general=Yh[:10]
        )
    assert attach_confidence(stitch, pairs["Xt"], pairs["Yt"], Xh[:10], Yh[:10]) is None
    for bad in ({"rank": 2.5}, {"rank": 0}, {"seed": -1}, {"seed": True}):
        with pytest.raises(InvalidInputError, match=next(iter(bad))):
            fit_confidence(stitch, pairs["Xt"], pairs["Yt"], Xh, Yh, **bad)  # type: ignore[arg-type]


def test_score_checks_shapes() -> None:
    head = ConfidenceHead(4, 3, rank=2, knots=2)
    with pytest.raises(ShapeMismatchError):
        head.score(torch.zeros(2, 4), torch.zeros(3, 3))
    with pytest.raises(ShapeMismatchError):
        head.score(torch.zeros(2, 5), torch.zeros(2, 3))
    with pytest.raises(ShapeMismatchError):  # no stitch features expected
        head.score(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 1))
    with_features = ConfidenceHead(4, 3, rank=2, knots=2, stitch_features=2)
    with pytest.raises(ShapeMismatchError):  # they are required
        with_features.score(torch.zeros(2, 4), torch.zeros(2, 3))
    assert with_features.score(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 2))[
        0
    ].shape == (2,)


def test_pool_adjacent_violators_gives_increasing_centroid_knots() -> None:
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    y = np.array([1.0, 3.0, 2.0, 4.0, 4.0])
    knots_x, knots_y = _pav(x, y)
    # blocks {0} -> 1, {1, 2} -> 2.5, {3, 4} -> 4, at their centroids in x
    assert knots_x.tolist() == [0.0, 1.5, 3.5]
    assert knots_y.tolist() == [1.0, 2.5, 4.0]


def test_a_stitch_in_bfloat16_keeps_its_confidences() -> None:
    """The library path scores a reduced-precision output like the service does: in
    float32, renormalised (bfloat16 rounding of unit rows moved the bundled stitches'
    confidences by up to 0.30)."""
    models = Path(__file__).resolve().parents[2] / "models"
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    x = load_file(fixtures / "everyday_sentences.safetensors")["minilm"]
    exact = load_stitch(models / "minilm-to-mpnet")
    reduced = load_stitch(models / "minilm-to-mpnet").to(torch.bfloat16)
    reduced.confidence_head = exact.confidence_head  # quadratic forms: float32
    want = translate_with_confidence(exact, x)[1]
    got = translate_with_confidence(reduced, x)[1]
    assert float((want - got).abs().max()) <= 0.05
