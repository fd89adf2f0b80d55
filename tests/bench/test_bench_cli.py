"""The bench stays importable and its command line parses; bench.idle measures a little."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is a folder of scripts, not an installed package
    sys.path.insert(0, str(REPO))

from bench.__main__ import FULL, QUICK, SECTIONS, parse_args  # noqa: E402
from bench.common import (  # noqa: E402
    RESULTS,
    read_result,
    results_dir,
    use_results_dir,
    write_result,
)
from bench.pyspy_profile import fold  # noqa: E402
from bench.throughput import acceptance  # noqa: E402


def test_parse_args_defaults_to_every_section() -> None:
    args = parse_args([])
    assert args.sections == list(SECTIONS)
    assert not args.quick


def test_parse_args_quick_and_only() -> None:
    args = parse_args(["--quick", "--only", "throughput,report"])
    assert args.quick
    assert args.sections == ["throughput", "report"]


def test_parse_args_rejects_unknown_section() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--only", "nonsense"])


def test_quick_is_smaller_than_full() -> None:
    assert max(QUICK["batches"]) < max(FULL["batches"])
    assert QUICK["reembed_docs"] < FULL["reembed_docs"] >= 200
    assert set(FULL["batches"]) == {1, 32, 1024, 8192}


def test_fold_splits_idle_from_busy_samples() -> None:
    raw = "\n".join(
        [
            "main (a.py:1);_translate (service/routes/translate.py:9);"
            "render_embeddings (service/encoding.py:3) 6",
            "main (a.py:1);_worker (concurrent/futures/thread.py:4) 4",
            "main (a.py:1);Route.translate (service/routing.py:5) 2",
        ]
    )
    folded = fold(raw)
    assert folded["samples"] == 8
    assert folded["idle_samples_excluded"] == 4
    stages = {s["function"]: s["share"] for s in folded["stages"]}
    assert stages["output base64 + response JSON (render_embeddings)"] == pytest.approx(0.75)
    assert stages["stitch forward + output finiteness (torch)"] == pytest.approx(0.25)


def test_acceptance_judges_the_bundled_stitches_and_reports_ridge_as_the_worst_case() -> None:
    rounds = {
        "minilm-to-pml3": {"median_fraction": 0.5},
        "minilm-to-mpnet": {"median_fraction": 0.45},
        "pml3-to-minilm-ridge": {"median_fraction": 0.2},
        "minilm-to-mpnet-ridge": {"median_fraction": 0.31},
    }
    acc = acceptance({"acceptance_rounds": rounds, "rows": []})
    assert acc["worst"] == 0.45 and acc["passes"]
    assert acc["worst_by_kind"] == {"bundled": 0.45, "ridge": 0.2}
    rounds["minilm-to-mpnet"]["median_fraction"] = 0.29
    assert not acceptance({"acceptance_rounds": rounds, "rows": []})["passes"]


def test_a_quick_run_writes_outside_the_committed_results(tmp_path: Path) -> None:
    assert parse_args([]).results == RESULTS
    quick = parse_args(["--quick", "--only", "report"]).results
    assert quick != RESULTS and RESULTS in quick.parents
    if shutil.which("git") and (REPO / ".git").exists():
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", str(quick / "SUMMARY.md")], cwd=REPO, check=False
        )
        assert ignored.returncode == 0, f"{quick} is not git-ignored"
    # what a run writes and reads goes to the folder it chose
    use_results_dir(tmp_path / "quick")
    try:
        path = write_result("fitcost", {"rows": [1]})
        assert path == tmp_path / "quick" / "fitcost.json"
        assert read_result("fitcost") == {"rows": [1]}
        assert results_dir() == tmp_path / "quick"
    finally:
        use_results_dir(RESULTS)


def test_fidelity_is_a_section_and_quick_is_smaller() -> None:
    assert "fidelity" in SECTIONS and SECTIONS.index("fidelity") < SECTIONS.index("report")
    assert FULL["fid_curve_sizes"] == (250, 500, 1000, 2000, 4000)
    assert max(QUICK["fid_curve_sizes"]) < max(FULL["fid_curve_sizes"])
    assert set(FULL["fid_progressive_ids"]) == {
        "minilm-to-mpnet", "minilm-to-e5", "minilm-to-pml3", "mpnet-to-minilm", "e5-to-minilm",
    }  # fmt: skip
    assert FULL["fid_fractions"] == (0.0, 0.05, 0.1, 0.2, 0.5, 1.0)


def test_fidelity_methods_come_from_the_bundled_configs() -> None:
    from bench.fidelity import BUNDLED, bundled_method, curve_options

    for stitch_id in BUNDLED:
        method, options = bundled_method(stitch_id)
        assert method in {"ridge", "procrustes", "mlp", "invertible", "local", "gated"}, (
            stitch_id,
            method,
        )
        assert isinstance(options, dict)
        # the learning curve's row for the bundled method fits it as the bundle did
        if method in FULL["fid_curve_methods"]:
            src, tgt = BUNDLED[stitch_id]
            default = FULL["fid_curve_methods"][method]
            assert curve_options(src, tgt, method, default) == options, stitch_id
    # the bundles differ (a larger MLP from and into MiniLM and mpnet), and each row follows
    assert bundled_method("minilm-to-mpnet")[1] != bundled_method("minilm-to-e5")[1]
    assert curve_options("glove", "minilm", "gated", {"hidden_dim": 3}) == {"hidden_dim": 3}


def test_idle_measures_every_kind_at_every_gap_against_the_bundled_stitch() -> None:
    import asyncio

    from bench.idle import _measure

    measured = asyncio.run(_measure((0.0, 1.0), 3, 1))
    assert set(measured) == {"healthz", "translate", "forward"}
    for kind in measured.values():
        assert set(kind) == {"gap_0_ms", "gap_1_ms"}
        assert kind["gap_0_ms"]["ratio_to_no_gap"] == 1.0
        for gap in kind.values():
            assert gap["p50_us"] > 0 and gap["p99_us"] >= gap["p50_us"]


def test_stsb_gold_scores_every_bundled_stitch_against_the_gold_column(tmp_path: Path) -> None:
    """bench.stsb_gold on the shipped everyday sentences (real vectors of the four models),
    with a gold column equal to mpnet's own cosines: mpnet's native Spearman is then 1, and
    every figure is the one its definition gives."""
    import json

    from safetensors.numpy import load_file, save_file

    from bench.stsb_gold import STITCHES, _cosines, read_pairs, score
    from lead.metrics import spearman_score

    fixtures = REPO / "tests" / "fixtures"
    sentences = json.loads((fixtures / "everyday_sentences.json").read_text())
    vectors = load_file(str(fixtures / "everyday_sentences.safetensors"))
    a, b = list(range(0, 78, 2)), list(range(1, 79, 2))
    gold = _cosines(vectors["mpnet"][a], vectors["mpnet"][b]) * 5
    lines = [
        f"main-captions\tMSRvid\t2012test\t{i:04d}\t{g:.4f}\t{sentences[x]}\t{sentences[y]}"
        + ("\tsource-a\tsource-b" if i % 3 == 0 else "")  # some lines carry 9 fields
        for i, (x, y, g) in enumerate(zip(a, b, gold, strict=True))
    ]
    (tmp_path / "sts-test.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    first, second, parsed = read_pairs(tmp_path / "sts-test.csv")
    assert (first[1], second[1]) == (sentences[2], sentences[3])
    np.testing.assert_allclose(parsed, gold, atol=1e-4)
    (tmp_path / "sentences.json").write_text(json.dumps(sentences[::-1]))  # any order
    save_file({k: np.ascontiguousarray(v[::-1]) for k, v in vectors.items()},
              str(tmp_path / "embeddings.safetensors"))  # fmt: skip

    out = score(tmp_path)
    assert out["native_spearman_similarity"]["mpnet"] == pytest.approx(1.0)
    rows = {row["stitch"]: row for row in out["rows"]}
    assert set(rows) == set(STITCHES)
    row = rows["minilm-to-mpnet"]
    assert row["target_native_spearman_similarity"] == pytest.approx(1.0)
    expected = spearman_score(_cosines(vectors["minilm"][a], vectors["minilm"][b]), parsed)
    assert row["source_native_spearman_similarity"] == pytest.approx(expected)
    assert 0.3 < row["mixed_spearman_similarity"] < 1.0
    for row in rows.values():
        assert row["mixed_ratio"] == pytest.approx(
            row["mixed_spearman_similarity"] / row["target_native_spearman_similarity"]
        )
        assert row["meets_goal"] == (row["mixed_ratio"] >= 0.85)


def test_operators_counts_the_same_real_work_for_each_request_kind() -> None:
    """bench.operators counts what a request runs: the same count twice, and more for an
    out-of-distribution vector (the gated stitch's MLP runs too) than for an in-domain one."""
    from bench.operators import operators_per_request

    stitch = REPO / "models" / "minilm-to-mpnet"
    query = operators_per_request(stitch, "query")
    assert query == operators_per_request(stitch, "query")
    assert 20 < query < operators_per_request(stitch, "gaussian")
