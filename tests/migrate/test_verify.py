"""verify on real SciFact vectors: minilm in PostgreSQL translated by a calibrated stitch
into a new table, against mpnet vectors of 300 ids in Parquet."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from lead import migrate
from lead.artifacts import load_stitch, read_stitch_config
from lead.errors import (
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)
from lead.migrate._pairs import paired_sample
from lead.migrate.calibrate import fitted_ids, run_calibrate
from lead.migrate.registry import open_source
from lead.migrate.report import NO_PLOT, ONE_BAR_WIDTH, histogram_bins
from lead.migrate.stores import with_params
from lead.migrate.verify import run_verify
from tests.migrate._data import NATIVE_ROWS, doc_ids, queries, write_parquet
from tests.migrate.conftest import make_table, sql

_REPORT_FILES = {"report.json", "report.md", "cosine.png"}


@pytest.fixture(scope="module")
def migrated(pg_uri, scifact_small, tmp_path_factory) -> dict[str, str]:
    """The source table, the translated table and native stores (right and wrong)."""
    folder = tmp_path_factory.mktemp("verify")
    ids = doc_ids(scifact_small)
    source = make_table(pg_uri, "ver_minilm", ids, scifact_small.corpus["minilm"])
    mpnet = scifact_small.corpus["mpnet"][NATIVE_ROWS]
    native = write_parquet(folder / "mpnet.parquet", ids[NATIVE_ROWS], mpnet)
    calibrated = run_calibrate(source, native, folder / "stitch")
    assert calibrated.passed
    target = with_params(pg_uri, table="ver_mpnet", column="emb")
    migrate.apply(source, target, str(folder / "stitch"), progress=False)
    wrong_ids = np.random.default_rng(1).permutation(ids[NATIVE_ROWS])
    extra = np.arange(50, dtype=np.int64) + 10**12  # ids the target does not hold
    return {
        "stitch": str(folder / "stitch"),
        "source": source,
        "target": target,
        "native": native,
        "more": write_parquet(
            folder / "more.parquet",
            np.concatenate([ids[NATIVE_ROWS], extra]),
            np.concatenate([mpnet, mpnet[:50]]),
        ),
        "wrong": write_parquet(folder / "wrong.parquet", wrong_ids, mpnet),
        "minilm": write_parquet(folder / "minilm.parquet", ids, scifact_small.corpus["minilm"]),
    }


def _junit(path: Path) -> tuple[list[ET.Element], list[ET.Element]]:
    root = ET.parse(path).getroot()
    return root.findall(".//testcase"), root.findall(".//testcase/failure")


def test_verify_passes_after_apply_and_writes_the_report(migrated, scifact_small, tmp_path):
    result = run_verify(
        migrated["target"],
        migrated["native"],
        source=migrated["source"],
        queries=queries(scifact_small),
        report_dir=tmp_path / "report",
        junit=tmp_path / "junit.xml",
    )
    assert result.passed and result.exit_code == 0, [c.message() for c in result.checks]
    assert {p.name for p in (tmp_path / "report").iterdir()} == _REPORT_FILES  # no temp files
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["passed"] is True and report == result.report
    assert report["sample"]["pairs"] == 300 and report["sample"]["rows"]["target"] == 400
    assert [c["name"] for c in report["checks"]] == [
        "complete",
        "same_ids",
        "min_r2",
        "min_mean_cosine",
        "min_top1",
        "min_retention",
    ]
    cosine = report["cosine"]
    assert cosine["min"] <= cosine["p5"] <= cosine["p50"] <= 1.0
    assert cosine["mean"] == pytest.approx(report["scores"]["mean_cosine_similarity"])
    assert len(cosine["worst"]) == 10 and cosine["worst"][0]["cosine"] == cosine["min"]
    assert report["scores"]["r2_score"] > 0 == report["baselines"]["mean_estimator"]["r2_score"]
    retrieval = report["retrieval"]
    assert retrieval["bound_from"] == "min(source_native, target_native)"
    native_scores = (retrieval["source_native"], retrieval["target_native"])
    bound = min(s["ndcg_at_10_score"] for s in native_scores)
    assert retrieval["bound"]["ndcg_at_10_score"] == bound
    assert retrieval["ndcg_at_10_retention"] == pytest.approx(
        retrieval["translated"]["ndcg_at_10_score"] / bound
    )
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "PASSED" in markdown and "retention" in markdown and cosine["worst"][0]["id"] in markdown
    assert (tmp_path / "report" / "cosine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    complete = report["checks"][0]
    assert (complete["value"], complete["operator"], complete["threshold"]) == (400, "==", 400)
    assert report["consistency"] == {
        "ids": {"missing": 0, "extra": 0, "missing_ids": [], "extra_ids": []}
    }
    cases, failures = _junit(tmp_path / "junit.xml")
    assert len(cases) == 6 and failures == []


def test_wrong_native_store_fails(migrated, tmp_path):
    result = run_verify(
        migrated["target"],
        migrated["wrong"],
        report_dir=tmp_path / "report",
        junit=tmp_path / "ci" / "junit.xml",
    )
    assert not result.passed and result.exit_code == 1
    failed = {c.name for c in result.checks if not c.passed}
    assert {"min_r2", "min_mean_cosine", "min_top1"} <= failed
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["passed"] is False and report["retrieval"] is None
    assert "FAILED" in (tmp_path / "report" / "report.md").read_text()
    cases, failures = _junit(tmp_path / "ci" / "junit.xml")
    assert len(cases) == 3 and len(failures) == 3
    assert "top1_accuracy_score" in " ".join(f.get("message", "") for f in failures)


def test_given_thresholds_are_checked_and_none_turns_one_off(migrated, tmp_path):
    result = run_verify(
        migrated["target"],
        migrated["native"],
        sample=100,
        seed=5,
        thresholds={"min_mean_cosine": 0.99, "min_top1": None},
        report_dir=tmp_path,
    )
    checks = {c.name: c for c in result.checks}
    assert set(checks) == {"min_r2", "min_mean_cosine"}
    assert checks["min_mean_cosine"].origin == "given" and not checks["min_mean_cosine"].passed
    assert checks["min_r2"].passed and not result.passed
    assert result.report["sample"]["pairs"] == 100


def test_wrong_dimension_and_disjoint_ids_are_errors(migrated, scifact_small, tmp_path):
    with pytest.raises(ShapeMismatchError, match="768 dimensions"):
        run_verify(migrated["target"], migrated["minilm"], report_dir=tmp_path)
    others = write_parquet(
        tmp_path / "others.parquet", np.arange(10), scifact_small.corpus["mpnet"][:10]
    )
    with pytest.raises(TooFewPairsError, match="only 0 ids"):
        run_verify(migrated["target"], others, report_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_fitted_ids_are_never_sampled_and_the_figures_drop(migrated, scifact_small, tmp_path):
    fitted = fitted_ids(migrated["stitch"])
    held_out = read_stitch_config(migrated["stitch"])["fit"]["holdout"]["ids"]
    assert len(fitted) == 240 and len(held_out) == 60 and not set(fitted) & set(held_out)
    common = {
        "target": migrated["target"],
        "native": migrated["native"],
        "source": migrated["source"],
        "queries": queries(scifact_small),
    }
    honest = run_verify(**common, exclude_ids=fitted, report_dir=tmp_path / "honest")
    flattered = run_verify(**common, report_dir=tmp_path / "flattered")
    # 300 native ids less the 240 fitted: the held-out ones, judged documents included
    assert honest.report["sample"]["pairs"] == 60 and honest.report["sample"]["excluded"] == 240
    assert {w["id"] for w in honest.report["cosine"]["worst"]} <= set(held_out)
    assert flattered.report["sample"]["pairs"] == 300
    assert flattered.report["sample"]["excluded"] == 0
    cosine = honest.report["scores"]["mean_cosine_similarity"]
    assert cosine < flattered.report["scores"]["mean_cosine_similarity"]
    assert honest.report["retrieval"]["queries"] > 0
    assert "240 excluded ids" in (tmp_path / "honest" / "report.md").read_text()
    # against the stitch's training mean, the held-out figures are calibrate's own
    card = read_stitch_config(migrated["stitch"])["scorecard"]
    train_mean = load_stitch(migrated["stitch"]).target_mean.double().numpy()
    same = run_verify(
        **common, exclude_ids=fitted, report_dir=tmp_path / "same", target_train_mean=train_mean
    )
    assert same.report["r2_reference"] == "target_train_mean"
    assert honest.report["r2_reference"] == "sample mean"
    assert honest.report["baselines"]["mean_estimator"]["r2_score"] == 0.0
    for name in ("r2_score", "mean_cosine_similarity", "top1_accuracy_score"):
        assert same.report["scores"][name] == pytest.approx(card[name], abs=1e-6)
        calibrated = card["baselines"]["mean_estimator"][name]
        assert same.report["baselines"]["mean_estimator"][name] == pytest.approx(
            calibrated, abs=1e-6
        )
    assert same.report["scores"]["r2_score"] != pytest.approx(
        honest.report["scores"]["r2_score"], abs=1e-4
    )
    with pytest.raises(ShapeMismatchError, match="target_train_mean"):
        run_verify(**common, report_dir=tmp_path / "bad", target_train_mean=train_mean[:5])


def test_verify_stitch_gives_calibrates_figures_for_a_gated_stitch(
    migrated, scifact_small, tmp_path
):
    """A gated stitch's target_mean is not the plain mean of its training targets (~3e-3 a
    value apart): verify --stitch reads the mean calibrate recorded, so the R² and the mean
    estimator's figures are calibrate's own (an adversarial pass found them apart)."""
    from lead.migrate.verify import stitch_target_mean

    folder = tmp_path / "gated"
    calibrated = run_calibrate(
        migrated["source"], migrated["native"], folder, method="gated", options={"k": 5}
    )
    recorded = np.asarray(calibrated.fit["calibration"]["target_train_mean"])
    assert recorded.shape == (768,)
    assert not np.allclose(recorded, load_stitch(folder).target_mean.double().numpy(), atol=1e-4)
    mean = stitch_target_mean(str(folder))
    np.testing.assert_array_equal(np.asarray(mean), recorded)
    translated = write_parquet(
        tmp_path / "translated.parquet",
        doc_ids(scifact_small),
        _translate(folder, scifact_small.corpus["minilm"]),
    )
    same = run_verify(
        translated,
        migrated["native"],
        exclude_ids=fitted_ids(folder),
        report_dir=tmp_path / "r",
        target_train_mean=mean,
    )
    card = calibrated.scorecard
    for name in ("r2_score", "mean_cosine_similarity", "top1_accuracy_score"):
        assert same.report["scores"][name] == pytest.approx(card[name], abs=1e-6)
        calibrated_baseline = card["baselines"]["mean_estimator"][name]
        assert same.report["baselines"]["mean_estimator"][name] == pytest.approx(
            calibrated_baseline, abs=1e-6
        )


def _translate(folder: Path, x: np.ndarray) -> np.ndarray:
    from lead import apply_stitch

    return apply_stitch(load_stitch(folder), x).numpy()


@pytest.mark.parametrize(("native", "n"), [("native", 1000), ("native", 30), ("more", 1000)])
def test_paired_sample_draws_only_ids_not_excluded(migrated, scifact_small, native, n):
    fitted = fitted_ids(migrated["stitch"])
    held_out = set(read_stitch_config(migrated["stitch"])["fit"]["holdout"]["ids"])
    judged = queries(scifact_small).judged_ids()
    assert set(judged) & set(fitted)  # judged documents that must not join the sample
    with open_source(migrated["target"]) as tgt, open_source(migrated[native]) as nat:
        paired = paired_sample(
            [tgt, nat], ["target", "native"], n, 0, minimum=4, include=judged, exclude=fitted
        )
    if n < len(held_out):  # a random n of the 60, plus the judged ones among the 60
        assert n <= len(paired.ids) < len(held_out) and set(paired.ids) <= held_out
    else:  # every id in both stores but the fitted ones ("more": counted on the slow path)
        assert sorted(paired.ids) == sorted(held_out)
        assert paired.common == (60 if native == "more" else None)


def test_excluding_every_native_id_is_too_few_pairs(migrated, scifact_small, tmp_path):
    every = [str(i) for i in doc_ids(scifact_small)[NATIVE_ROWS]]
    with pytest.raises(TooFewPairsError, match="only 0 ids besides the 300 excluded") as e:
        run_verify(
            migrated["target"], migrated["native"], exclude_ids=every, report_dir=tmp_path / "r"
        )
    assert e.value.got == 0 and e.value.minimum == 4
    assert not (tmp_path / "r").exists()
    with pytest.raises(InvalidInputError, match="not a single string"):
        run_verify(migrated["target"], migrated["native"], exclude_ids="17", report_dir=tmp_path)


@pytest.fixture
def mpnet_file(scifact_small, tmp_path) -> str:
    """All 400 mpnet vectors in Parquet: a target that holds the native vectors themselves."""
    return write_parquet(
        tmp_path / "ok.parquet", doc_ids(scifact_small), scifact_small.corpus["mpnet"]
    )


def test_identical_target_and_native_pass_with_a_plot(mpnet_file, tmp_path):
    # every cosine is 1.0 (to float64 rounding): the histogram asked for bins of width 0
    result = run_verify(mpnet_file, mpnet_file, source=mpnet_file, report_dir=tmp_path / "r")
    assert result.passed and result.exit_code == 0, [c.message() for c in result.checks]
    assert result.report["cosine"]["min"] == pytest.approx(1.0)
    assert (tmp_path / "r" / "cosine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| check | figure | value | operator | threshold | origin | result |" in markdown
    assert "against the sample's own mean" in markdown


def test_without_matplotlib_the_report_says_why_it_has_no_plot(mpnet_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    result = run_verify(mpnet_file, mpnet_file, report_dir=tmp_path / "r")
    assert result.passed
    files = result.report["files"]
    assert files["plot"] is None and files["plot_missing"] == NO_PLOT
    assert "lead-stitch[migrate]" in NO_PLOT
    assert not (tmp_path / "r" / "cosine.png").exists()
    assert NO_PLOT in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize(
    "cosines",
    [np.ones(400), np.array([1 - 8e-16, 1.0, 1.0]), np.array([0.7]), np.array([0.5, 0.5005])],
)
def test_near_constant_cosines_get_one_bar_that_numpy_can_draw(cosines):
    bins, (lo, hi) = histogram_bins(cosines)
    assert bins == 1 and hi - lo == pytest.approx(ONE_BAR_WIDTH)
    counts, _ = np.histogram(cosines, bins=bins, range=(lo, hi))
    assert counts.tolist() == [len(cosines)]


def test_spread_cosines_keep_their_range_and_bins():
    cosines = np.linspace(0.2, 0.95, 400)
    assert histogram_bins(cosines) == (40, (0.2, 0.95))


def test_report_paths_that_cannot_be_written_are_refused_first(mpnet_file, tmp_path):
    taken = tmp_path / "taken.txt"
    taken.write_text("mine")
    for folder in (taken, taken / "below"):
        with pytest.raises(InvalidInputError, match=f"{taken} is a file, not a folder"):
            run_verify(mpnet_file, mpnet_file, report_dir=folder)
    with pytest.raises(InvalidInputError, match="is a folder: give the JUnit"):
        run_verify(mpnet_file, mpnet_file, report_dir=tmp_path / "r", junit=tmp_path)
    assert taken.read_text() == "mine" and not (tmp_path / "r").exists()
    # checked before any store is read: a missing store is not what is reported
    with pytest.raises(InvalidInputError, match="is a file"):
        run_verify(str(tmp_path / "none.parquet"), mpnet_file, report_dir=taken)


def test_duplicate_ids_are_refused_naming_the_id_and_store(scifact_small, mpnet_file, tmp_path):
    ids = doc_ids(scifact_small)
    mpnet = scifact_small.corpus["mpnet"]
    held = ids[NATIVE_ROWS].copy()
    held[3] = held[7]  # the smaller store: every id is drawn (was an IndexError)
    native = write_parquet(tmp_path / "n.parquet", held, mpnet[NATIVE_ROWS])
    with pytest.raises(
        InvalidInputError, match=f"id {held[7]} appears more than once in the native"
    ):
        run_verify(mpnet_file, native, report_dir=tmp_path / "r")
    held = ids.copy()
    held[NATIVE_ROWS[0]] = held[NATIVE_ROWS[1]]  # the larger store: found when listed
    target = write_parquet(tmp_path / "t.parquet", held, mpnet)
    native = write_parquet(tmp_path / "n2.parquet", ids[NATIVE_ROWS], mpnet[NATIVE_ROWS])
    twice = ids[NATIVE_ROWS[1]]
    with pytest.raises(InvalidInputError, match=f"id {twice} appears more than once in the target"):
        run_verify(target, native, report_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("store", ["target", "native"])
def test_a_nan_vector_is_refused_naming_its_id_and_store(scifact_small, tmp_path, store):
    ids = doc_ids(scifact_small)
    vectors = {k: scifact_small.corpus["mpnet"].copy() for k in ("target", "native")}
    vectors[store][8, 5] = np.nan
    uris = {k: write_parquet(tmp_path / f"{k}.parquet", ids, v) for k, v in vectors.items()}
    with pytest.raises(NonFiniteError, match=f"id {ids[8]} in the {store} store .*NaN"):
        run_verify(uris["target"], uris["native"], report_dir=tmp_path / "r")


def test_a_target_missing_rows_of_the_source_fails_complete(scifact_small, mpnet_file, tmp_path):
    ids = doc_ids(scifact_small)
    part = write_parquet(tmp_path / "part.parquet", ids[:100], scifact_small.corpus["mpnet"][:100])
    source = write_parquet(tmp_path / "src.parquet", ids, scifact_small.corpus["minilm"])
    result = run_verify(
        part, mpnet_file, source=source, report_dir=tmp_path / "r", junit=tmp_path / "j.xml"
    )
    # every sampled vector is right: only the count and the ids tell the migration stopped
    # part-way
    assert not result.passed and result.exit_code == 1
    assert [c.name for c in result.checks if not c.passed] == ["complete", "same_ids"]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    complete = report["checks"][0]
    assert (complete["name"], complete["value"], complete["threshold"]) == ("complete", 100, 400)
    assert report["sample"]["rows"] == {"target": 100, "native": 400, "source": 400}
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| `complete` | target_vectors | 100 | == | 400 | source | **FAIL** |" in markdown
    _, failures = _junit(tmp_path / "j.xml")
    assert [f.get("message") for f in failures] == [
        "target_vectors 100 == 400 (source): FAIL",
        "ids_differing 300 == 0 (source): FAIL",
    ]
    assert report["consistency"]["ids"]["missing"] == 300
    assert report["consistency"]["ids"]["missing_ids"] == sorted(str(i) for i in ids[100:])[:10]
    assert "ids of the source missing from the target: 300" in markdown
    # without the source, or with the check off, nothing counts the rows (a part of the
    # source: only ids the source lacks would fail)
    assert run_verify(part, mpnet_file, report_dir=tmp_path / "r2").passed
    off = run_verify(part, mpnet_file, source=source, complete=False, report_dir=tmp_path / "r3")
    assert off.passed and "complete" not in {c.name for c in off.checks}
    assert off.checks[0].name == "same_ids" and off.checks[0].value == 0


def _copy_table(pg_uri: str, table: str, name: str) -> str:
    sql(pg_uri, f"DROP TABLE IF EXISTS {name}")
    sql(pg_uri, f"CREATE TABLE {name} AS SELECT * FROM {table}")
    return with_params(pg_uri, table=name, column="emb")


def test_a_tampered_target_fails_same_ids_and_matches_source(
    migrated, pg_uri, scifact_small, tmp_path
):
    """A target with rows deleted, made-up ids inserted and 20 vectors overwritten (none of
    them native ids, as many rows as the source) passed verify (an adversarial pass)."""
    target = _copy_table(pg_uri, "ver_mpnet", "ver_tampered")
    ids = doc_ids(scifact_small)
    kw = {"source": migrated["source"], "stitch": migrated["stitch"], "sample": 400}
    clean = run_verify(target, migrated["native"], report_dir=tmp_path / "clean", **kw)
    assert clean.passed, [c.message() for c in clean.checks]
    match = clean.report["consistency"]["source_match"]
    assert (match["sampled"], match["not_matching"], match["inverse"]) == (400, 0, False)
    assert match["min_cosine"] > 0.99999  # the bytes apply wrote, translated again
    others = ids[np.setdiff1d(np.arange(len(ids)), NATIVE_ROWS)]  # 100 ids, none native
    gone, overwritten = others[:3], others[3:23]
    sql(pg_uri, f"DELETE FROM ver_tampered WHERE id IN ({','.join(map(str, gone))})")
    sql(
        pg_uri,
        "INSERT INTO ver_tampered SELECT id + 1000000000000, emb FROM ver_tampered "
        f"WHERE id IN ({','.join(map(str, others[30:33]))})",
    )
    sql(
        pg_uri,
        f"UPDATE ver_tampered SET emb = (SELECT emb FROM ver_tampered WHERE id = {others[40]}) "
        f"WHERE id IN ({','.join(map(str, overwritten))})",
    )
    result = run_verify(target, migrated["native"], report_dir=tmp_path / "r", **kw)
    assert not result.passed
    assert {c.name for c in result.checks if not c.passed} == {"same_ids", "matches_source"}
    consistency = result.report["consistency"]
    assert consistency["ids"]["missing_ids"] == sorted(str(i) for i in gone)
    assert consistency["ids"]["extra"] == 3
    match = consistency["source_match"]
    assert (match["sampled"], match["not_matching"]) == (397, 20)
    assert {row["id"] for row in match["not_matching_ids"]} <= {str(i) for i in overwritten}
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "not matching the target: 20" in markdown


def test_a_source_edited_after_the_migration_fails_matches_source(
    migrated, pg_uri, scifact_small, tmp_path
):
    source = _copy_table(pg_uri, "ver_minilm", "ver_edited")
    ids = doc_ids(scifact_small)
    edited = ids[[5, 50, 150, 250, 350]]
    sql(
        pg_uri,
        f"UPDATE ver_edited SET emb = (SELECT emb FROM ver_edited WHERE id = {ids[0]}) "
        f"WHERE id IN ({','.join(map(str, edited))})",
    )
    result = run_verify(
        migrated["target"],
        migrated["native"],
        source=source,
        stitch=migrated["stitch"],
        sample=400,
        report_dir=tmp_path / "r",
    )
    assert [c.name for c in result.checks if not c.passed] == ["matches_source"]
    match = result.report["consistency"]["source_match"]
    assert match["not_matching"] == 5
    assert {row["id"] for row in match["not_matching_ids"]} == {str(i) for i in edited}


def test_a_stitch_that_maps_neither_way_is_refused(migrated, scifact_small, tmp_path):
    with pytest.raises(ShapeMismatchError, match="is it the stitch the migration applied"):
        run_verify(
            migrated["target"],
            migrated["native"],
            source=migrated["source"],
            stitch="minilm-to-pml3",
            report_dir=tmp_path / "r",
        )


def test_complete_counts_the_source_rows_with_a_vector(scifact_small, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = doc_ids(scifact_small)
    minilm = scifact_small.corpus["minilm"]
    rows = [None if i % 4 == 0 else minilm[i].tolist() for i in range(len(ids))]  # 100 NULL
    vector = pa.list_(pa.float32(), minilm.shape[1])
    pq.write_table(
        pa.table({"id": pa.array(ids), "emb": pa.array(rows, type=vector)}), tmp_path / "s.parquet"
    )
    source = with_params(str(tmp_path / "s.parquet"), column="emb", id="id")
    kept = np.arange(len(ids)) % 4 != 0
    mpnet = scifact_small.corpus["mpnet"]
    target = write_parquet(tmp_path / "t.parquet", ids[kept], mpnet[kept])
    result = run_verify(target, target, source=source, report_dir=tmp_path / "r")
    complete = result.checks[0]
    assert (complete.name, complete.value, complete.threshold) == ("complete", 300, 300)
    assert result.passed
