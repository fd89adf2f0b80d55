"""The gated stitch: a local stitch near the in-domain memory, a residual MLP elsewhere."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_file_pt
from safetensors.torch import save_file as save_file_pt

from lead._apply import apply_stitch
from lead.artifacts import load_stitch, save_stitch
from lead.batch_invariance import forward_batch_invariant
from lead.confidence import CONFIDENCE_VERSION, fit_confidence, translate_with_confidence
from lead.errors import InvalidInputError, ShapeMismatchError, StitchFormatError, TooFewPairsError
from lead.fitting import fit_stitch
from lead.gated import fit_gated
from lead.stitches import GatedStitch, Stitch, StitchInfo, unit_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAST = {"max_epochs": 2, "hidden_dim": 128}


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _translate(stitch: Any, X: np.ndarray) -> np.ndarray:
    return apply_stitch(stitch, torch.from_numpy(X)).numpy()


def _gate(stitch: GatedStitch, X: np.ndarray) -> np.ndarray:
    keys = stitch.domain.keys.detach().float()
    nearest = (unit_rows(torch.from_numpy(X).float()) @ keys.T).max(dim=1).values
    return stitch.gate(nearest).numpy()


@pytest.fixture(scope="module")
def fitted(scifact_small: Any) -> tuple[GatedStitch, Any]:
    """MiniLM -> mpnet: 300 real SciFact documents (weight 1, the domain) and 40 everyday
    sentences (weight 0.05); 100 documents and the other 40 sentences held out."""
    everyday = load_file(FIXTURES / "everyday_sentences.safetensors")
    X = np.concatenate([scifact_small.corpus["minilm"][:300], everyday["minilm"][:40]])
    Y = np.concatenate([scifact_small.corpus["mpnet"][:300], everyday["mpnet"][:40]])
    w = np.r_[np.ones(300), np.full(40, 0.05)]
    info = StitchInfo(source_model="minilm", target_model="mpnet")
    stitch = fit_stitch(X, Y, "gated", info=info, sample_weight=w, **FAST)
    assert isinstance(stitch, GatedStitch)
    return stitch, everyday


def test_the_memory_is_the_domain_and_the_gate_comes_from_it(
    fitted: Any, scifact_small: Any
) -> None:
    stitch, everyday = fitted
    assert stitch.memory == 300 and stitch.info.fit["domain_rows"] == 300
    # its own means are every training pair's (what callers read as the training means)
    Y = np.concatenate([scifact_small.corpus["mpnet"][:300], everyday["mpnet"][:40]])
    np.testing.assert_allclose(stitch.target_mean.numpy(), Y.mean(axis=0), atol=1e-6)
    assert stitch.gate_high - stitch.gate_low == pytest.approx(0.1)
    assert 0.0 < stitch.gate_high < 1.0


def test_documents_go_to_the_local_stitch_and_everyday_sentences_to_the_mlp(
    fitted: Any, scifact_small: Any
) -> None:
    stitch, everyday = fitted
    docs = scifact_small.corpus["minilm"][300:]
    sentences = everyday["minilm"][40:]
    assert (_gate(stitch, docs) == 1.0).mean() >= 0.85  # held-out in-domain rows
    assert (_gate(stitch, sentences) == 0.0).mean() >= 0.85
    # and where the gate is 0 or 1, the answer is that expert's own
    both = np.concatenate([docs, sentences])
    a = _gate(stitch, both)
    gated = _translate(stitch, both)
    with torch.inference_mode():
        x = torch.from_numpy(both)
        local = unit_rows(stitch.domain(x)).numpy()
        mlp = unit_rows(stitch.general_expert(x)).numpy()
    np.testing.assert_allclose(gated[a == 1.0], local[a == 1.0], atol=1e-5)
    np.testing.assert_allclose(gated[a == 0.0], mlp[a == 0.0], atol=1e-5)


def test_everyday_sentences_translate_better_than_with_the_local_stitch_alone(
    fitted: Any,
) -> None:
    """The local stitch's global map is weighted toward the domain: general text, far from
    its memory, translates worse than with the MLP, which is what the gate gives it."""
    stitch, everyday = fitted
    x, y = everyday["minilm"][40:], everyday["mpnet"][40:]
    with torch.inference_mode():
        local = unit_rows(stitch.domain(torch.from_numpy(x))).numpy()
    gated = np.sum(_translate(stitch, x) * y, axis=1).mean()
    assert gated > np.sum(local * y, axis=1).mean() + 0.02


def test_rows_are_batch_invariant_and_survive_save_and_load(
    fitted: Any, scifact_small: Any, tmp_path: Path
) -> None:
    stitch, everyday = fitted
    save_stitch(stitch, tmp_path / "g")
    loaded = load_stitch(tmp_path / "g")
    assert isinstance(loaded, GatedStitch)
    assert loaded.get_config() == stitch.get_config()
    x = torch.from_numpy(np.concatenate([scifact_small.queries["minilm"][:30], everyday["minilm"]]))
    with torch.inference_mode():
        whole = forward_batch_invariant(loaded, x)
        alone = torch.cat([forward_batch_invariant(loaded, x[i : i + 1]) for i in range(len(x))])
        assert torch.equal(whole, alone)
        assert torch.equal(whole, forward_batch_invariant(stitch, x))


def test_the_general_memory_holds_the_general_rows_and_their_mlp_residuals(
    fitted: Any,
) -> None:
    """The 40 everyday sentences (weight 0.05) are outside the domain: they are the general
    memory, each with the MLP's residual, and an input near them gets that correction."""
    stitch, everyday = fitted
    assert stitch.general_memory == 40 and stitch.info.fit["general_memory"] == 40
    memory = stitch.residuals
    assert memory is not None and memory.k == 20
    x = torch.from_numpy(everyday["minilm"][:40])
    with torch.inference_mode():
        mlp = forward_batch_invariant(stitch.general, x)
        np.testing.assert_allclose(memory.keys.numpy(), unit_rows(x).numpy(), atol=1e-6)
        np.testing.assert_allclose(
            memory.values.numpy(), everyday["mpnet"][:40] - mlp.numpy(), atol=1e-5
        )
        corrected = stitch.general_expert(x)
    y = everyday["mpnet"][:40]
    # the memorised sentences' own corrections bring them closer to the true vectors
    before = np.sum(unit_rows(mlp).numpy() * y, axis=1)
    after = np.sum(unit_rows(corrected).numpy() * y, axis=1)
    assert after.mean() > before.mean() + 0.05 and (after > before).mean() >= 0.9


def test_the_general_memory_can_be_capped_or_left_out(scifact_small: Any) -> None:
    everyday = load_file(FIXTURES / "everyday_sentences.safetensors")
    X = np.concatenate([scifact_small.corpus["minilm"][:200], everyday["minilm"][:40]])
    Y = np.concatenate([scifact_small.corpus["mpnet"][:200], everyday["mpnet"][:40]])
    w = np.r_[np.ones(200), np.full(40, 0.05)]
    capped = fit_stitch(X, Y, "gated", sample_weight=w, general_memory=25, general_k=5, **FAST)
    assert capped.residuals is not None and capped.general_memory == 25
    assert capped.residuals.k == 5
    # which 25: some of the 40 general rows, none of the domain's
    keys = capped.residuals.keys.numpy()
    rows = np.argmax(keys @ _unit(X).T, axis=1)
    assert len(set(rows.tolist())) == 25 and (rows >= 200).all()
    none = fit_stitch(X, Y, "gated", sample_weight=w, general_memory=0, **FAST)
    assert none.residuals is None and none.general_memory == 0
    x = torch.from_numpy(everyday["minilm"][40:])
    with torch.inference_mode():
        assert torch.equal(none.general_expert(x), forward_batch_invariant(none.general, x))
    # every row in the domain (no weights): no general memory either
    assert fit_stitch(X, Y, "gated", **FAST).residuals is None


def test_a_gated_stitch_saved_before_the_general_memory_still_loads(
    scifact_small: Any, tmp_path: Path
) -> None:
    """Artifacts saved before ``general_memory`` existed have none of its config keys."""
    X, Y = scifact_small.corpus["minilm"][:200], scifact_small.corpus["mpnet"][:200]
    stitch = fit_stitch(X, Y, "gated", **FAST)
    folder = save_stitch(stitch, tmp_path / "g")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    assert config["general_memory"] == 0
    old = {key: value for key, value in config.items() if not key.startswith("general_")}
    config_path.write_text(json.dumps(old))
    loaded = load_stitch(folder)
    assert isinstance(loaded, GatedStitch) and loaded.residuals is None
    x = torch.from_numpy(scifact_small.queries["minilm"][:10])
    with torch.inference_mode():
        assert torch.equal(forward_batch_invariant(loaded, x), forward_batch_invariant(stitch, x))


@pytest.fixture(scope="module")
def with_head(fitted: Any, scifact_small: Any) -> tuple[GatedStitch, dict[str, Any], Any]:
    """A copy of ``fitted`` with a confidence head calibrated on the 100 held-out documents."""
    stitch, everyday = fitted
    stitch = copy.deepcopy(stitch)
    X = np.concatenate([scifact_small.corpus["minilm"][:300], everyday["minilm"][:40]])
    Y = np.concatenate([scifact_small.corpus["mpnet"][:300], everyday["mpnet"][:40]])
    held = scifact_small.corpus["minilm"][300:], scifact_small.corpus["mpnet"][300:]
    report = fit_confidence(stitch, X, Y, *held)
    return stitch, report, everyday


def test_the_confidence_weighs_how_close_an_input_is_to_the_memory(
    with_head: Any, tmp_path: Path
) -> None:
    stitch, report, everyday = with_head
    head = stitch.confidence_head
    assert head is not None and head.stitch_features == len(stitch.confidence_feature_names) == 3
    # out of fold on the held-out documents: the local stitch is as good as its memory is
    # close, which the generic features cannot see
    assert report["in_domain_spearman_score"] >= report["generic_spearman_score"] + 0.05
    assert report["in_domain_spearman_score"] > 0.5, report
    folder = save_stitch(stitch, tmp_path / "g")
    config = json.loads((folder / "config.json").read_text())["confidence"]
    assert (config["version"], config["stitch_features"]) == (CONFIDENCE_VERSION, 3)
    x = np.concatenate([_memory_rows(stitch), everyday["minilm"][40:]])
    want = translate_with_confidence(stitch, x)
    got = translate_with_confidence(load_stitch(folder), x)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)
    # one row at a time: the same confidences, bit for bit
    alone = torch.cat([translate_with_confidence(stitch, x[i : i + 1])[1] for i in range(len(x))])
    assert torch.equal(alone, want[1])


def _memory_rows(stitch: GatedStitch) -> np.ndarray:
    """30 of the memory's own rows (unit source vectors): closest to it, gate 1."""
    return stitch.domain.keys.detach().float().numpy()[:30]


def test_a_head_is_not_saved_on_a_stitch_that_lacks_its_features(
    with_head: Any, scifact_small: Any, tmp_path: Path
) -> None:
    """A gated stitch's head weighs the gated stitch's own features: moved by hand onto a
    ridge stitch, it is refused at save time (it would not load back), nothing written."""
    stitch, _, _ = with_head
    ridge = fit_stitch(
        scifact_small.corpus["minilm"][:300], scifact_small.corpus["mpnet"][:300], "ridge"
    )
    ridge.confidence_head = copy.deepcopy(stitch.confidence_head)
    with pytest.raises(ShapeMismatchError, match="affine stitches give 0"):
        save_stitch(ridge, tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_where_the_mlp_answers_the_ranking_is_the_generic_features(
    with_head: Any, fitted: Any, scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stitch, _, everyday = with_head
    sentences = everyday["minilm"][40:]
    mlp_rows = _gate(stitch, sentences) == 0.0
    assert mlp_rows.sum() >= 30
    generic = copy.deepcopy(fitted[0])
    monkeypatch.setattr(GatedStitch, "confidence_features", Stitch.confidence_features)
    X = np.concatenate([scifact_small.corpus["minilm"][:300], everyday["minilm"][:40]])
    Y = np.concatenate([scifact_small.corpus["mpnet"][:300], everyday["mpnet"][:40]])
    fit_confidence(
        generic, X, Y, scifact_small.corpus["minilm"][300:], scifact_small.corpus["mpnet"][300:]
    )
    monkeypatch.undo()
    assert generic.confidence_head is not None and generic.confidence_head.stitch_features == 0
    plain = translate_with_confidence(generic, sentences[mlp_rows])[1].numpy()
    own = translate_with_confidence(stitch, sentences[mlp_rows])[1].numpy()
    # both are increasing maps of the same generic score there: never in the other order
    lower = plain[:, None] < plain[None, :]
    assert lower.any() and (own[:, None] <= own[None, :])[lower].all()


def test_calibration_scales_each_expert(scifact_small: Any) -> None:
    X, Y = scifact_small.corpus["minilm"][:200], scifact_small.corpus["mpnet"][:200]
    stitch = fit_stitch(X, Y, "gated", calibrate_variance=True, **FAST)
    assert stitch.expert_scales and stitch.output_scale is None
    for expert in (stitch.domain, stitch.general):
        assert expert.output_scale is not None and float(expert.output_scale) > 1.0


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"gate_quantile": 1.5}, "gate_quantile"),
        ({"gate_width": 0.0}, "gate_width"),
        ({"gate_width": 1e-20}, "gate_width"),  # bounds equal in float: refused after the fit
        ({"sink": 1e39}, "sink"),  # beyond float32: crashed after the fit
        ({"strength": 1e300}, "strength"),
        ({"k": 0}, "k"),
        ({"hidden_dim": 0}, "hidden_dim"),
        ({"bogus": 1}, "bogus"),
        ({"general_memory": -1}, "general_memory"),
        ({"general_memory": 2.5}, "general_memory"),
        ({"general_k": 0}, "general_k"),
        ({"general_temperature": 0.0}, "general_temperature"),
        ({"general_sink": 1e39}, "general_sink"),
        ({"general_strength": float("nan")}, "general_strength"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], param: str) -> None:
    X = np.random.default_rng(0).normal(size=(50, 4))
    with pytest.raises(InvalidInputError) as caught:
        fit_stitch(X, X, "gated", **options)
    assert caught.value.param == param


@pytest.mark.parametrize(
    "edit",
    [
        {"gate_low": 0.6, "gate_high": 0.5},  # upside down
        {"gate_low": -1e308, "gate_high": 1e308},  # loaded, then every translation failed
        {"gate_low": False, "gate_high": True},  # read as 0 and 1
        {"expert_scales": "no"},  # read as true
        {"sink": 1e39},  # beyond float32: a traceback at translate time
        {"strength": 1e300},
        {"temperature": 1e300},
        {"general_memory": True},  # read as 1 row
        {"general_memory": -3},
        {"general_memory": 1e300},  # not a row count
        {"general_memory": 5},  # the file holds 40 rows
        {"general_k": 41},  # more neighbours than rows
        {"general_temperature": 0.0},
        {"general_sink": 1e39},
    ],
)
def test_a_stitch_file_with_values_it_could_not_be_fitted_with_is_refused(
    fitted: Any, tmp_path: Path, edit: dict[str, Any]
) -> None:
    stitch, _ = fitted
    save_stitch(stitch, tmp_path / "g")
    config_path = tmp_path / "g" / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **edit}))
    with pytest.raises(StitchFormatError):
        load_stitch(tmp_path / "g")


def test_a_general_memory_that_is_not_a_row_count_is_named(fitted: Any, tmp_path: Path) -> None:
    """A float row count was refused with torch's ``zeros() takes 1 positional argument``."""
    stitch, _ = fitted
    save_stitch(stitch, tmp_path / "g")
    config_path = tmp_path / "g" / "config.json"
    config_path.write_text(
        json.dumps({**json.loads(config_path.read_text()), "general_memory": 40.0})
    )
    with pytest.raises(StitchFormatError, match="general_memory must be a row count"):
        load_stitch(tmp_path / "g")


@pytest.mark.parametrize("memory", ["domain.keys", "residuals.keys"])
@pytest.mark.parametrize("scale", [3.0, 0.0])
def test_a_stitch_file_whose_memory_keys_are_not_unit_rows_is_refused(
    fitted: Any, tmp_path: Path, scale: float, memory: str
) -> None:
    """Scaled or zeroed keys loaded and translated, wrongly (gate cosines above 1)."""
    stitch, _ = fitted
    save_stitch(stitch, tmp_path / "g")
    weights = tmp_path / "g" / "model.safetensors"
    tensors = load_file_pt(weights)
    tensors[memory] = tensors[memory] * scale
    save_file_pt(tensors, weights)
    with pytest.raises(StitchFormatError, match="unit rows"):
        load_stitch(tmp_path / "g")


def test_a_stitch_file_with_a_non_positive_expert_scale_is_refused(
    scifact_small: Any, tmp_path: Path
) -> None:
    X, Y = scifact_small.corpus["minilm"][:200], scifact_small.corpus["mpnet"][:200]
    save_stitch(fit_stitch(X, Y, "gated", calibrate_variance=True, **FAST), tmp_path / "g")
    weights = tmp_path / "g" / "model.safetensors"
    tensors = load_file_pt(weights)
    tensors["general.output_scale"] = -tensors["general.output_scale"]
    save_file_pt(tensors, weights)
    with pytest.raises(StitchFormatError, match="output_scale"):
        load_stitch(tmp_path / "g")


def test_a_stitch_file_whose_gate_is_upside_down_is_refused(fitted: Any, tmp_path: Path) -> None:
    stitch, _ = fitted
    save_stitch(stitch, tmp_path / "g")
    config_path = tmp_path / "g" / "config.json"
    config = json.loads(config_path.read_text())
    config["gate_low"], config["gate_high"] = 0.6, 0.5
    config_path.write_text(json.dumps(config))
    with pytest.raises(StitchFormatError, match="gate"):
        load_stitch(tmp_path / "g")


def test_a_migration_scores_a_gated_stitch_as_the_library_does(
    with_head: Any, scifact_small: Any, tmp_path: Path
) -> None:
    """``lead migrate`` / ``lead translate`` (LocalTranslator) pass the stitch's own
    features to its head (the head alone refuses to score without them)."""
    from lead.migrate.translator import LocalTranslator

    stitch, _, everyday = with_head
    folder = save_stitch(stitch, tmp_path / "g")
    x = np.concatenate([scifact_small.queries["minilm"][:20], everyday["minilm"][40:]])
    y, _, confidence, ood = LocalTranslator(folder).translate_scored(x)
    want = translate_with_confidence(load_stitch(folder), x)
    assert np.array_equal(y, want[0].numpy())
    assert np.array_equal(confidence, want[1].numpy()) and np.array_equal(ood, want[2].numpy())


def test_forward_scored_searches_the_memory_once(
    scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With confidences, a bundled gated stitch takes its confidence features from its
    forward's own memory search (a second search cost ~0.6 of the forward): the same
    translation bits, confidences within rounding of the features computed apart, one
    search per chunk of rows."""
    from lead.stitches import LocalStitch

    stitch = load_stitch(FIXTURES.parents[1] / "models" / "minilm-to-mpnet").eval().freeze()
    x = unit_rows(torch.from_numpy(scifact_small.queries["minilm"][:20]))
    x = torch.cat([x, stitch.domain.keys.detach().float()[:5]])  # near the memory: gate 1
    searches = []
    search = LocalStitch._neighbours

    def counted(self: LocalStitch, x_centred: torch.Tensor) -> Any:
        searches.append(len(x_centred))
        return search(self, x_centred)

    monkeypatch.setattr(LocalStitch, "_neighbours", counted)
    with torch.inference_mode():
        y, confidence, ood = stitch.forward_scored(x)
        assert searches == [len(x)]
        assert torch.equal(y, forward_batch_invariant(stitch, x))
        apart, apart_ood = stitch.score_confidence(x, y)
        # and one each for the plain forward, the unnormalised one (the head scores it:
        # version 3) and the features
        assert len(searches) == 4
        torch.testing.assert_close(confidence, apart, rtol=0, atol=1e-5)
        assert torch.equal(ood, apart_ood) and not bool(ood.any())
        alone = [stitch.forward_scored(x[i : i + 1]) for i in range(len(x))]
    for i, (y_i, c_i, o_i) in enumerate(alone):  # batch-invariant, bit for bit
        assert torch.equal(y_i, y[i : i + 1]) and torch.equal(c_i, confidence[i : i + 1])
        assert torch.equal(o_i, ood[i : i + 1])


def test_too_few_pairs_for_the_mlp_are_refused_before_any_fit_without_an_option() -> None:
    """The gated method's MLP holds out a fixed share for early stopping: the message must
    not advise an option that fit_gated does not take."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 16)).astype(np.float32)
    Y = X @ rng.standard_normal((16, 8)).astype(np.float32)
    with pytest.raises(TooFewPairsError) as caught:
        fit_gated(X, Y)
    message = str(caught.value)
    assert "gated stitch's MLP" in message and "at least 35" in message
    assert "(add pairs)" in message and "option" not in message
