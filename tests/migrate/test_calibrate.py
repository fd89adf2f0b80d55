"""calibrate on real SciFact vectors: minilm in PostgreSQL, mpnet for 300 ids in Parquet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lead.artifacts import load_stitch
from lead.cli import main
from lead.errors import (
    ConflictError,
    InvalidInputError,
    NonFiniteError,
    StitchFormatError,
    TooFewPairsError,
)
from lead.migrate.calibrate import fitted_ids, min_pairs, run_calibrate
from lead.migrate.quality import check_thresholds
from tests.migrate._data import NATIVE_ROWS, doc_ids, queries, write_parquet
from tests.migrate.conftest import make_table

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def minilm_table(pg_uri, scifact_small) -> str:
    return make_table(pg_uri, "cal_minilm", doc_ids(scifact_small), scifact_small.corpus["minilm"])


def test_real_pairs_give_go_and_a_saved_stitch(minilm_table, scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[NATIVE_ROWS]
    # text ids in the Parquet file, bigint in PostgreSQL: paired by their text
    native = write_parquet(
        tmp_path / "mpnet.parquet",
        [str(i) for i in ids],
        scifact_small.corpus["mpnet"][NATIVE_ROWS],
    )
    result = run_calibrate(
        minilm_table,
        native,
        tmp_path / "stitch",
        queries=queries(scifact_small),
        source_model="all-MiniLM-L6-v2",
        target_model="all-mpnet-base-v2",
    )
    assert result.passed and result.decision == "go", [c.message() for c in result.checks]
    names = [c.name for c in result.checks]
    assert names == ["min_r2", "min_mean_cosine", "min_top1", "min_retention"]
    card = result.scorecard
    assert card["pairs"] == 60  # 20 % of the 300 ids in both stores
    assert card["r2_score"] > card["baselines"]["mean_estimator"]["r2_score"] == 0.0
    assert card["top1_accuracy_score"] > 0.9
    retrieval = result.retrieval
    assert retrieval is not None and retrieval["queries"] > 0
    assert retrieval["source_native"] is not None
    bound = retrieval["bound"]["ndcg_at_10_score"]
    assert bound == min(
        retrieval["source_native"]["ndcg_at_10_score"],
        retrieval["target_native"]["ndcg_at_10_score"],
    )
    assert retrieval["ndcg_at_10_retention"] == pytest.approx(
        retrieval["translated"]["ndcg_at_10_score"] / bound
    )
    config = json.loads((tmp_path / "stitch" / "config.json").read_text())
    fit = config["fit"]
    assert fit["data"]["pairs"] == 300 and fit["data"]["rows"] == {"source": 400, "native": 300}
    assert "password" not in fit["data"]["source"] and fit["data"]["native"].startswith(
        str(tmp_path)
    )
    held_out = fit["holdout"]["ids"]
    assert len(held_out) == 60 and set(held_out) <= {str(i) for i in ids}
    fitted = fitted_ids(tmp_path / "stitch")  # the training part: what verify leaves out
    assert fitted == fit["calibration"]["fitted_ids"] == result.fit["calibration"]["fitted_ids"]
    assert len(fitted) == 240 and not set(fitted) & set(held_out)
    assert set(fitted) | set(held_out) == {str(i) for i in ids}
    assert fit["calibration"]["decision"] == "go" and fit["method"] == "ridge"
    assert config["scorecard"]["r2_score"] == card["r2_score"]
    assert config["source"]["model"] == "all-MiniLM-L6-v2"
    stitch = load_stitch(tmp_path / "stitch")
    assert (stitch.d_src, stitch.d_tgt) == (384, 768)
    # a confidence per vector for `apply --confidence-column`, calibrated on the 60 held out
    assert stitch.confidence_head is not None and "no_confidence" not in fit
    report = fit["calibration"]["confidence"]
    assert report == stitch.confidence_head.report == config["confidence"]["report"]
    assert (report["held_out_rows"], report["train_rows"]) == (60, 240)
    assert report["in_domain_spearman_score"] > 0.3


def test_too_few_held_out_pairs_give_no_confidence_head_and_say_why(
    minilm_table, scifact_small, tmp_path, capsys
):
    ids = doc_ids(scifact_small)[NATIVE_ROWS]
    native = write_parquet(
        tmp_path / "mpnet.parquet", ids, scifact_small.corpus["mpnet"][NATIVE_ROWS]
    )
    result = run_calibrate(minilm_table, native, tmp_path / "stitch", holdout=0.1)  # 30 held out
    assert result.passed, [c.message() for c in result.checks]
    assert result.fit["calibration"]["confidence"] is None
    assert "at least 50 held-out pairs, got 30" in result.fit["no_confidence"]
    stitch = load_stitch(tmp_path / "stitch")
    assert stitch.confidence_head is None
    assert stitch.info.fit["no_confidence"] == result.fit["no_confidence"]
    # the command line says so where lead fit does (it was only in the printed record)
    cli = str(tmp_path / "cli")
    code = main(["migrate", "calibrate", minilm_table, native, "--stitch", cli, "--holdout", "0.1"])
    assert code == 0
    err = capsys.readouterr().err
    assert "note: no confidence head (a confidence head needs at least 50" in err
    assert "give more native rows or raise --holdout" in err


def test_shuffled_pairing_is_no_go(minilm_table, scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[NATIVE_ROWS]
    wrong = np.random.default_rng(1).permutation(ids)  # each id on another document's vector
    native = write_parquet(
        tmp_path / "wrong.parquet", wrong, scifact_small.corpus["mpnet"][NATIVE_ROWS]
    )
    result = run_calibrate(minilm_table, native, tmp_path / "stitch")
    assert not result.passed and result.decision == "no-go"
    failed = {c.name for c in result.checks if not c.passed}
    assert {"min_r2", "min_top1"} <= failed
    assert result.scorecard["top1_accuracy_score"] < 0.1
    config = json.loads((tmp_path / "stitch" / "config.json").read_text())
    assert config["fit"]["calibration"]["decision"] == "no-go"  # saved, to inspect


def test_only_ids_in_both_stores_are_paired(minilm_table, scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[NATIVE_ROWS]
    extra = np.arange(50, dtype=np.int64) + 10**12  # ids the source does not hold
    vectors = scifact_small.corpus["mpnet"][NATIVE_ROWS]
    native = write_parquet(
        tmp_path / "more.parquet",
        np.concatenate([ids, extra]),
        np.concatenate([vectors, vectors[:50]]),
    )
    result = run_calibrate(minilm_table, native, tmp_path / "stitch", sample=200, seed=3)
    assert result.fit["data"]["pairs"] == 200
    assert result.passed
    assert not {int(i) for i in result.fit["holdout"]["ids"]} & set(extra.tolist())


def test_too_few_common_ids_names_the_counts(minilm_table, scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[:6]
    native = write_parquet(tmp_path / "few.parquet", ids, scifact_small.corpus["mpnet"][:6])
    with pytest.raises(TooFewPairsError, match=r"only 6 ids .*source 400 rows, native 6 rows") as e:
        run_calibrate(minilm_table, native, tmp_path / "stitch")
    assert e.value.minimum == min_pairs(0.2) == 18  # round(18 * 0.2) = 4 held out
    assert not (tmp_path / "stitch").exists()


def test_bad_arguments_are_refused_before_any_work(minilm_table, scifact_small, tmp_path):
    native = write_parquet(
        tmp_path / "n.parquet", doc_ids(scifact_small)[:30], scifact_small.corpus["mpnet"][:30]
    )
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(ConflictError, match="force"):
        run_calibrate(minilm_table, native, taken)
    with pytest.raises(InvalidInputError, match="not a stitch folder"):
        run_calibrate(minilm_table, native, taken, force=True)
    assert (taken / "notes.txt").read_text() == "mine"
    (tmp_path / "afile").write_text("mine")  # was "exists already ...; pass --force"
    for force in (False, True):
        with pytest.raises(ConflictError, match="afile is a file, not a folder"):
            run_calibrate(minilm_table, native, tmp_path / "afile", force=force)
    assert (tmp_path / "afile").read_text() == "mine"
    with pytest.raises(InvalidInputError, match="unknown threshold"):
        run_calibrate(minilm_table, native, tmp_path / "s", thresholds={"min_ndcg": 0.5})
    # the source as its own native store: a map of the old model into itself passed
    with pytest.raises(InvalidInputError, match="is the source store"):
        run_calibrate(minilm_table, minilm_table, tmp_path / "s")
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidInputError, match="unknown method"):
        run_calibrate(minilm_table, native, tmp_path / "s", method="magic")
    with pytest.raises(InvalidInputError, match="sample"):
        run_calibrate(minilm_table, native, tmp_path / "s", sample=5)
    # a holdout that leaves too few to fit on names the holdout (it said "sample must be
    # >= 3500", of a --sample never given)
    with pytest.raises(InvalidInputError, match=r"a holdout of 0\.999 needs a sample of at least"):
        run_calibrate(minilm_table, native, tmp_path / "s", holdout=0.999)
    with pytest.raises(InvalidInputError, match="must be a number"):
        check_thresholds({"min_top1": True})
    for name in ("min_top1", "min_r2", "min_mean_cosine"):  # could never pass
        with pytest.raises(InvalidInputError, match=f"{name} must be at most 1"):
            check_thresholds({name: 1.5})
        assert check_thresholds({name: 1.0})[0][name] == 1.0
    assert check_thresholds({"min_retention": 1.05})[0]["min_retention"] == 1.05


def test_given_thresholds_replace_the_defaults(minilm_table, scifact_small, tmp_path):
    rows = NATIVE_ROWS[:100]
    native = write_parquet(
        tmp_path / "n.parquet", doc_ids(scifact_small)[rows], scifact_small.corpus["mpnet"][rows]
    )
    result = run_calibrate(
        minilm_table,
        native,
        tmp_path / "stitch",
        method="procrustes",
        thresholds={"min_top1": 0.2, "min_r2": None, "min_mean_cosine": 1.0},
    )
    checks = {c.name: c for c in result.checks}
    assert set(checks) == {"min_top1", "min_mean_cosine"}  # min_r2 off; no queries: no retention
    assert checks["min_top1"].origin == "given" and checks["min_top1"].passed
    assert checks["min_top1"].threshold == 0.2
    assert checks["min_mean_cosine"].threshold == 1.0 and not checks["min_mean_cosine"].passed
    assert not result.passed and result.fit["method"] == "procrustes"


def test_fitted_ids_of_other_stitches(minilm_table, scifact_small, tmp_path):
    assert fitted_ids(MODELS / "minilm-to-mpnet") == []  # bundled: fitted by ``lead fit``
    rows = NATIVE_ROWS[:40]
    native = write_parquet(
        tmp_path / "n.parquet", doc_ids(scifact_small)[rows], scifact_small.corpus["mpnet"][rows]
    )
    run_calibrate(minilm_table, native, tmp_path / "stitch", thresholds={"min_top1": None})
    assert len(fitted_ids(tmp_path / "stitch")) == 32
    shutil.copytree(tmp_path / "stitch", tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["fit"]["calibration"]["fitted_ids"]  # a calibration record without them
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    with pytest.raises(StitchFormatError, match="calibrate the stitch again"):
        fitted_ids(tmp_path / "old")


def _with_duplicate(ids: np.ndarray, copy_of: int, row: int) -> np.ndarray:
    """``ids`` with ``ids[row]`` replaced by ``ids[copy_of]``: that id held twice."""
    out = ids.copy()
    out[row] = out[copy_of]
    return out


@pytest.mark.parametrize("found", ["drawn", "listed"])
def test_a_duplicate_source_id_is_refused_naming_it_and_the_store(scifact_small, tmp_path, found):
    ids = doc_ids(scifact_small)
    minilm, mpnet = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    if found == "drawn":  # the smaller store, whose ids are all drawn (was an IndexError)
        held = _with_duplicate(ids[NATIVE_ROWS], 1, 0)
        source = write_parquet(tmp_path / "s.parquet", held, minilm[NATIVE_ROWS])
        native = write_parquet(tmp_path / "n.parquet", ids, mpnet)
    else:  # the larger store: an id the sample asks for is missing, the listing finds one twice
        held = _with_duplicate(ids, int(NATIVE_ROWS[1]), int(NATIVE_ROWS[0]))
        source = write_parquet(tmp_path / "s.parquet", held, minilm)
        native = write_parquet(tmp_path / "n.parquet", ids[NATIVE_ROWS], mpnet[NATIVE_ROWS])
    twice = ids[NATIVE_ROWS[1]]
    with pytest.raises(InvalidInputError, match=f"id {twice} appears more than once in the source"):
        run_calibrate(source, native, tmp_path / "stitch")
    assert not (tmp_path / "stitch").exists()


def test_a_duplicate_id_in_the_native_store_is_refused(scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[NATIVE_ROWS]
    native = write_parquet(
        tmp_path / "n.parquet",
        _with_duplicate(ids, 7, 3),
        scifact_small.corpus["mpnet"][NATIVE_ROWS],
    )
    source = write_parquet(
        tmp_path / "s.parquet", doc_ids(scifact_small), scifact_small.corpus["minilm"]
    )
    with pytest.raises(
        InvalidInputError, match=f"id {ids[7]} appears more than once in the native"
    ):
        run_calibrate(source, native, tmp_path / "stitch")


@pytest.mark.parametrize("store", ["source", "native"])
def test_a_nan_vector_is_refused_naming_its_id_and_store(scifact_small, tmp_path, store):
    ids = doc_ids(scifact_small)
    vectors = {
        "source": scifact_small.corpus["minilm"].copy(),
        "native": scifact_small.corpus["mpnet"].copy(),
    }
    row = int(NATIVE_ROWS[8])
    vectors[store][row, 3] = np.nan
    source = write_parquet(tmp_path / "s.parquet", ids, vectors["source"])
    native = write_parquet(tmp_path / "n.parquet", ids[NATIVE_ROWS], vectors["native"][NATIVE_ROWS])
    with pytest.raises(NonFiniteError, match=f"id {ids[row]} in the {store} store .*NaN"):
        run_calibrate(source, native, tmp_path / "stitch")
