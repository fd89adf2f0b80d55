"""The ``lead`` command line on the real SciFact fixture: fit, score, translate, errors."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from lead.artifacts import load_stitch
from lead.cli import main
from tests.conftest import FIXTURES

DATA = FIXTURES / "scifact_small.safetensors"
MINILM, MPNET = "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-mpnet-base-v2"


#: small fits: a second intra-op thread only adds overhead (and jitter on a busy machine)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _fit_args(out: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--source",
        f"{DATA}:minilm_corpus",
        "--target",
        f"{DATA}:mpnet_corpus",
        "--source-model",
        MINILM,
        "--target-model",
        MPNET,
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cli") / "minilm-to-mpnet"
    capture: list[str] = []
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        assert main(_fit_args(out, "--method", "ridge")) == 0
    capture.append(stdout.getvalue())
    return out, json.loads(capture[0])


def test_fit_prints_a_sensible_scorecard_and_saves_the_stitch(fitted: tuple[Path, dict]) -> None:
    out, scorecard = fitted
    assert scorecard["pairs"] == 80
    assert scorecard["r2_score"] > 0.2
    assert scorecard["top1_accuracy_score"] > 10 / 80
    stitch = load_stitch(out)
    assert stitch.info.source_model == MINILM and stitch.info.target_model == MPNET
    assert stitch.info.scorecard == scorecard
    fit = stitch.info.fit
    assert fit["method"] == "ridge" and fit["pairs"] == 320
    assert fit["holdout"] == {
        "fraction": 0.2,
        "seed": 0,
        "from_pair": None,
        "train_pairs": 320,
        "test_pairs": 80,
    }
    assert fit["data"] == [
        {"source": f"{DATA}:minilm_corpus", "target": f"{DATA}:mpnet_corpus", "rows": 400}
    ]
    assert stitch.normalize_output is True


def test_score_reproduces_the_fit_scorecard(
    fitted: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    out, scorecard = fitted
    args = [
        "score",
        str(out),
        "--source",
        f"{DATA}:minilm_corpus",
        "--target",
        f"{DATA}:mpnet_corpus",
    ]
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again.keys() == scorecard.keys()
    for key, value in scorecard.items():
        if isinstance(value, float):
            assert again[key] == pytest.approx(value, rel=1e-9), key
    assert again["baselines"]["mean_estimator"] == pytest.approx(
        scorecard["baselines"]["mean_estimator"], rel=1e-9
    )
    assert main([*args, "--all"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert everything["pairs"] == 400 and everything["r2_score"] > scorecard["r2_score"]


def test_fit_mixes_datasets_and_holds_out_from_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = [
        "--source",
        f"{DATA}:minilm_queries",
        "--target",
        f"{DATA}:mpnet_queries",
        "--holdout-from",
        "1",
        "--method",
        "procrustes",
        "--option",
        "scaling=true",
    ]
    assert main(_fit_args(tmp_path / "mixed", *extra)) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 80
    stitch = load_stitch(tmp_path / "mixed")
    assert stitch.architecture == "orthogonal" and stitch.get_config() == {"scaling": True}
    assert stitch.info.fit["pairs"] == 320 + 100
    assert stitch.info.fit["holdout"]["from_pair"] == 1
    assert len(stitch.info.fit["data"]) == 2


def test_fit_mlp_with_options_and_no_holdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = [
        "--method",
        "mlp",
        "--option",
        "hidden_dim=16",
        "--option",
        "max_epochs=2",
        "--holdout",
        "0",
        "--no-normalize-output",
    ]
    assert main(_fit_args(tmp_path / "mlp", *options)) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) is None
    assert "train" in captured.err  # the progress bar
    stitch = load_stitch(tmp_path / "mlp")
    assert stitch.get_config() == {"hidden_dim": 16, "depth": 1}
    assert stitch.info.scorecard is None and stitch.normalize_output is False


@pytest.mark.parametrize("output", ["out.npy", "out.safetensors"])
def test_translate_streams_the_whole_file(
    fitted: tuple[Path, dict], tmp_path: Path, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    target = tmp_path / output
    args = [
        "translate",
        str(out),
        "--input",
        f"{DATA}:minilm_queries",
        "--output",
        str(target),
        "--batch-size",
        "7",
    ]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == {
        "output": str(target),
        "rows": 100,
        "dim": 768,
        "input_normalized": True,  # fitted on unit-length minilm vectors
        "rescaled_inputs": 0,  # which the queries are
    }
    got = np.load(target) if output.endswith(".npy") else load_file(target)["embeddings"]
    source = load_file(DATA)["minilm_queries"]
    with torch.no_grad():
        expected = load_stitch(out)(torch.from_numpy(source)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # an existing --output is kept unless --force, as lead fit keeps an existing --out
    assert main(args) == 2
    assert f"--output {target} exists already; pass --force" in capsys.readouterr().err
    # the same bytes whatever --batch-size (batch-invariant forwards)
    assert main([*args[:-1], "100", "--force"]) == 0
    capsys.readouterr()
    again = np.load(target) if output.endswith(".npy") else load_file(target)["embeddings"]
    assert again.tobytes() == got.tobytes()
    assert main([*args, "--force"]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "pca"], "unknown method"),
        (["--option", "alpha"], "key=value"),
        (["--option", "beta=1"], "unknown option"),
        (["--source", f"{DATA}:minilm_queries"], "as many --source"),
        (["--holdout", "1.5"], "--holdout"),
        (["--holdout-from", "3"], "--holdout-from"),
    ],
)
def test_fit_errors_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(_fit_args(tmp_path / "x", *args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "x").exists()


def test_data_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "fit",
        "--source",
        f"{DATA}:minilm_corpus",
        "--target",
        f"{DATA}:mpnet_queries",
        "--source-model",
        "a",
        "--target-model",
        "b",
        "--out",
        str(tmp_path / "x"),
    ]
    assert main(args) == 2
    assert "400 rows" in capsys.readouterr().err
    args[2] = str(tmp_path / "missing.npy")
    assert main(args) == 2
    assert "no such file" in capsys.readouterr().err


def test_translate_and_score_errors_exit_2(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    wrong = [
        "translate",
        str(out),
        "--input",
        f"{DATA}:mpnet_queries",
        "--output",
        str(tmp_path / "o.npy"),
    ]
    assert main(wrong) == 2
    assert "expects 384" in capsys.readouterr().err
    assert not (tmp_path / "o.npy").exists()
    missing = ["score", str(tmp_path / "none"), "--source", str(DATA), "--target", str(DATA)]
    assert main(missing) == 2
    assert "no stitch" in capsys.readouterr().err
    # refused before any work: no progress bar (it ran to 100 % for a .txt output)
    good = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--output"]
    for args, message in [
        ([str(tmp_path / "o.txt")], "--output " + str(tmp_path / "o.txt") + ": output must be"),
        ([str(tmp_path / "o.npy"), "--batch-size", "0"], "--batch-size must be at least 1"),
    ]:
        assert main(good + args) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and "translate:" not in err, err
    # a device torch cannot parse, or one this machine lacks: one line, exit 2, for both
    score = ["score", str(out), "--source", f"{DATA}:minilm_corpus",
             "--target", f"{DATA}:mpnet_corpus"]  # fmt: skip
    lacking = f"cuda:{torch.cuda.device_count()}"
    for command in (score, [*good, str(tmp_path / "d.npy")]):
        for device, message in [
            ("foo", "unknown device 'foo'"),
            ("", "unknown device ''"),
            ("meta", "unknown device 'meta'"),
            (lacking, f"device '{lacking}': this machine has"),
        ]:
            assert main([*command, f"--device={device}"]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"error: {message}") and "Traceback" not in err, err
    assert not (tmp_path / "d.npy").exists()
    # --all with a split: the split was ignored (an adversarial pass)
    for extra in (["--holdout", "0.5"], ["--holdout-from", "1"]):
        assert main([*score, "--all", *extra]) == 2
        assert "--all scores every row: drop --holdout" in capsys.readouterr().err
    # --confidence-output naming the input: with --force it replaced the vectors
    vectors = tmp_path / "vectors.npy"
    np.save(vectors, load_file(DATA)["minilm_queries"])
    kept = vectors.read_bytes()
    conf = ["translate", str(out), "--input", str(vectors), "--output", str(tmp_path / "t.npy"),
            "--confidence-output", str(vectors), "--force"]  # fmt: skip
    assert main(conf) == 2
    assert "--confidence-output must be another file than --input" in capsys.readouterr().err
    assert vectors.read_bytes() == kept and not (tmp_path / "t.npy").exists()


def test_score_names_the_files_the_stitch_does_not_fit(
    fitted: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    swapped = ["score", str(out), "--source", f"{DATA}:mpnet_corpus",
               "--target", f"{DATA}:minilm_corpus"]  # fmt: skip
    assert main(swapped) == 2
    err = capsys.readouterr().err
    assert f"the --source file ({DATA}:mpnet_corpus) has 768 columns" in err
    assert f"the stitch expects 384 ({MINILM}); did you swap --source and --target?" in err
    assert "X has" not in err and "d_src" not in err  # no internal names
    wrong_target = ["score", str(out), "--source", f"{DATA}:minilm_corpus",
                    "--target", f"{DATA}:pml3_corpus"]  # fmt: skip
    assert main(wrong_target) == 2
    err = capsys.readouterr().err
    assert f"the --target file ({DATA}:pml3_corpus) has 384 columns" in err
    assert f"expects 768 ({MPNET})" in err and "swap" not in err


def test_fit_refuses_to_replace_a_stitch_unless_forced(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stitch"
    assert main(_fit_args(out, "--method", "procrustes")) == 0
    capsys.readouterr()
    before = (out / "model.safetensors").read_bytes()
    assert main(_fit_args(out, "--method", "ridge")) == 2
    err = capsys.readouterr().err
    assert f"--out {out} exists already and holds a stitch; pass --force" in err
    assert (out / "model.safetensors").read_bytes() == before  # untouched
    assert main(_fit_args(out, "--method", "ridge", "--force")) == 0
    assert load_stitch(out).architecture == "affine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stitch"]  # no temporary folders
    unpaired = ["fit-unpaired", "--source", f"{DATA}:minilm_corpus", "--target",
                f"{DATA}:mpnet_corpus", "--source-model", "a", "--target-model", "b",
                "--out", str(out)]  # fmt: skip
    assert main(unpaired) == 2
    assert "pass --force" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # an empty folder is fine without --force
    assert main(_fit_args(tmp_path / "empty", "--method", "procrustes")) == 0
    # --force on a plain file or a folder of other files: refused before the fit (the
    # whole fit ran first, then the save refused; an adversarial pass)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data.csv").write_text("mine")
    for occupied in ("notes.txt", "work"):
        # a --holdout-from past the files would be refused once they are read: the --out
        # refusal comes first, before any file is read
        args = _fit_args(tmp_path / occupied, "--force", "--holdout-from", "9")
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"refusing to replace {tmp_path / occupied}: it is not a stitch folder" in err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_usage_errors_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["fit"]) == 2  # missing required arguments
    assert main(["--help"]) == 0
    assert "translate" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        # argparse left these to `lead` itself: its usage, and the option not named closer
        (["translate", "s", "--input", "a.npy", "--output", "b.npy", "--batch-szie", "10"],
         "usage: lead translate", "--batch-szie (did you mean --batch-size?)"),
        # a mistyped required option was reported only as the required one missing
        (["translate", "s", "--inptu", "a.npy", "--output", "b.npy"],
         "usage: lead translate", "--inptu (did you mean --input?)"),
        (["jobs", "submit", "--dataset", "d", "--source-model", "a", "--target-model", "b",
          "--methd=ridge"], "usage: lead jobs submit", "--methd (did you mean --method?)"),
        (["migrate", "plan", "x.parquet", "--stich", "s"], "usage: lead migrate plan",
         "--stich (did you mean --stitch?)"),
        (["translate", "s", "--input", "a.npy", "--output", "b.npy", "extra"],
         "usage: lead translate", "unrecognized arguments: extra"),
        # other mistakes keep argparse's messages: abbreviations and negative numbers are
        # not unknown options
        (["jobs", "wait", "j", "--interv", "-1"], "usage: lead jobs wait",
         "argument --interval: must be a finite number >= 0, got '-1'"),
    ],
)  # fmt: skip
def test_a_command_names_its_own_unknown_options(
    argv: list[str], usage: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and message in err, err


def test_fit_lists_held_out_ids_and_stores_float16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import safe_open

    with safe_open(str(DATA), "np") as f:
        corpus_ids = json.loads(f.metadata()["corpus_ids"])
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(corpus_ids))
    out = tmp_path / "half"
    assert main(_fit_args(out, "--ids", str(ids), "--save-dtype", "float16")) == 0
    scorecard = json.loads(capsys.readouterr().out)
    config = json.loads((out / "config.json").read_text())
    held_out = config["fit"]["holdout"]["ids"]
    assert len(held_out) == scorecard["pairs"] == 80
    assert set(held_out) <= set(corpus_ids)
    assert " ".join(held_out[:3]) in (out / "README.md").read_text()
    assert config["dtype"] == "float16"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("weight").dtype == torch.float16
    # the scorecard describes the stored (rounded) values: lead score reproduces it
    assert main(["score", str(out), "--source", f"{DATA}:minilm_corpus",
                 "--target", f"{DATA}:mpnet_corpus"]) == 0  # fmt: skip
    again = json.loads(capsys.readouterr().out)
    assert again["r2_score"] == pytest.approx(scorecard["r2_score"], rel=1e-9)


def test_fit_rejects_ids_of_the_wrong_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(["a", "b"]))
    assert main(_fit_args(tmp_path / "x", "--ids", str(ids))) == 2
    assert "400 ids" in capsys.readouterr().err
    ids.write_text("[" * 100_000 + "]" * 100_000)  # json's parser recursed out: a traceback
    assert main(_fit_args(tmp_path / "x", "--ids", str(ids))) == 2
    assert "not a JSON list of ids (nested too deeply)" in capsys.readouterr().err


def test_fit_mlp_progress_bar_ends_full_when_training_stops_early(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--method", "mlp", "--option", "hidden_dim=16", "--option", "max_epochs=60"]
    options += ["--option", "patience=2", "--option", "lr=0.02"]
    assert main(_fit_args(tmp_path / "mlp", *options)) == 0
    epochs = load_stitch(tmp_path / "mlp").info.fit["epochs"]
    assert epochs < 60  # early stopping ended training
    lines = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    last = [line for line in lines if line.startswith("train:")][-1]  # then "confidence:"
    assert last.startswith("train: 100%") and f" {epochs}/{epochs} " in last, last


def test_fit_warns_when_the_stitch_is_below_the_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Misaligned rows (target rows in another order) give a stitch no better than the
    training mean: lead fit still saves it, and says so on stderr."""
    data = load_file(DATA)
    order = np.random.default_rng(0).permutation(len(data["mpnet_corpus"]))
    pairs = tmp_path / "misaligned.safetensors"
    save_file({"source": data["minilm_corpus"], "target": data["mpnet_corpus"][order]}, str(pairs))
    args = _fit_args(tmp_path / "bad", "--method", "ridge")
    args[2], args[4] = f"{pairs}:source", f"{pairs}:target"
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["r2_score"] <= 0
    assert "is at or below the mean-estimator baseline" in captured.err
    assert "same ids, same order" in captured.err
    assert main(_fit_args(tmp_path / "good", "--method", "ridge")) == 0
    assert "baseline" not in capsys.readouterr().err


def test_the_baseline_warning_blames_row_order_only_when_top1_is_low_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Procrustes on 320 real pairs of MiniLM and paraphrase-MiniLM-L3 is below the
    baseline in R² while ranking the right row first almost always: the rows are paired,
    and the warning says so instead of sending the user after a row-order bug."""
    args = _fit_args(tmp_path / "rigid", "--method", "procrustes")
    args[4] = f"{DATA}:pml3_corpus"
    args[8] = "sentence-transformers/paraphrase-MiniLM-L3-v2"
    assert main(args) == 0
    captured = capsys.readouterr()
    scorecard = json.loads(captured.out)
    assert scorecard["r2_score"] <= 0 and scorecard["top1_accuracy_score"] > 0.9
    assert "is at or below the mean-estimator baseline" in captured.err
    assert "rows are paired" in captured.err and "try ridge" in captured.err
    assert "same ids, same order" not in captured.err


def test_fit_attaches_a_confidence_head_calibrated_on_the_held_out_rows(
    fitted: tuple[Path, dict],
) -> None:
    out, _ = fitted
    stitch = load_stitch(out)
    assert stitch.confidence_head is not None
    config = json.loads((out / "config.json").read_text())
    report = config["confidence"]["report"]
    assert report["held_out_rows"] == 80 and report["train_rows"] == 320
    assert report["in_domain_spearman_score"] > 0.4  # 80 real held-out rows (measured 0.69)
    assert "Spearman(confidence, true cosine)" in (out / "README.md").read_text()


EVERYDAY = FIXTURES / "everyday_sentences.safetensors"


def test_fit_calibrates_the_confidence_on_general_rows_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--general-from 2``: 60 of the 80 everyday sentences leave training for the head."""
    general = ["--source", f"{EVERYDAY}:minilm", "--target", f"{EVERYDAY}:mpnet"]
    general += ["--holdout-from", "1", "--general-from", "2", "--general-holdout", "0.75"]
    assert main(_fit_args(tmp_path / "g", *general)) == 0
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    holdout, report = config["fit"]["holdout"], config["confidence"]["report"]
    assert holdout["general"] == {"from_pair": 2, "fraction": 0.75, "pairs": 60}
    assert holdout["train_pairs"] == 320 + 20 and holdout["test_pairs"] == 80
    assert (report["held_out_rows"], report["general_rows"], report["train_rows"]) == (80, 60, 340)
    assert report["in_domain_spearman_score"] > 0.4
    # out of fold over the 60 sentences alone (a ridge fitted on 20 of them: 0.16); the
    # bundled stitches' figures on 1,294 STS-B sentences are in models/README.md
    assert -1.0 <= report["out_of_domain_spearman_score"] <= 1.0
    assert report["held_out_ood_fraction"] < 0.1
    assert "on 60 general rows" in capsys.readouterr().err


HOLDOUT_FROM_1 = ["--holdout-from", "1"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([*HOLDOUT_FROM_1, "--general-from", "1"], "another pair than --holdout-from"),
        ([*HOLDOUT_FROM_1, "--general-from", "3"], "between 1 and 2"),
        (
            [*HOLDOUT_FROM_1, "--general-from", "2", "--general-holdout", "0.25"],
            "leaves 20 general rows",
        ),
        ([*HOLDOUT_FROM_1, "--general-from", "2", "--no-confidence"], "needs the confidence head"),
        ([*HOLDOUT_FROM_1, "--general-from", "2", "--holdout", "0"], "a --holdout above 0"),
        ([*HOLDOUT_FROM_1, "--general-from", "2", "--general-holdout", "1"], "in \\(0, 1\\)"),
        ([*HOLDOUT_FROM_1, "--general-holdout", "0.5"], "--general-holdout needs --general-from"),
        # 20 held-out documents: no head, so no rows may leave training for one
        (
            [
                *HOLDOUT_FROM_1,
                "--general-from",
                "2",
                "--general-holdout",
                "0.75",
                "--holdout",
                "0.05",
            ],
            "needs at least 50 held-out pairs, got 20",
        ),
        (["--general-from", "2"], "which it needs"),  # no --holdout-from
    ],
)
def test_fit_refuses_general_rows_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    general = ["--source", f"{EVERYDAY}:minilm", "--target", f"{EVERYDAY}:mpnet"]
    assert main(_fit_args(tmp_path / "g", *general, *extra)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "g" / "config.json").exists()


def test_fit_without_confidence_or_with_too_few_held_out_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_fit_args(tmp_path / "off", "--no-confidence")) == 0
    assert load_stitch(tmp_path / "off").confidence_head is None
    capsys.readouterr()
    assert main(_fit_args(tmp_path / "few", "--holdout", "0.1")) == 0  # 40 held-out rows
    err = capsys.readouterr().err
    assert "no confidence head (a confidence head needs at least 50 held-out pairs, got 40)" in err
    assert "raise --holdout" in err
    assert load_stitch(tmp_path / "few").confidence_head is None
    # the reason goes with the stitch (the service's 422 no_confidence quotes it)
    reasons = {
        "off": "it was fitted with --no-confidence",
        "few": "a confidence head needs at least 50 held-out pairs, got 40",
    }
    for name, reason in reasons.items():
        assert load_stitch(tmp_path / name).info.fit["no_confidence"] == reason
    # nothing held out: the scorecard is null, and a note says why (it printed "null" alone)
    capsys.readouterr()
    assert main(_fit_args(tmp_path / "all", "--holdout", "0")) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "null" and "note: nothing was held out (--holdout 0)" in err
    assert load_stitch(tmp_path / "all").info.scorecard is None


def test_translate_writes_confidences_beside_the_same_vectors(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    base = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--batch-size", "7"]
    assert main([*base, "--output", str(tmp_path / "plain.npy")]) == 0
    capsys.readouterr()
    scored = [*base, "--output", str(tmp_path / "y.npy")]
    assert main([*scored, "--confidence-output", str(tmp_path / "c.npy")]) == 0
    summary = json.loads(capsys.readouterr().out)
    # real MiniLM vectors, but of queries (short claims) where the stitch saw 320 abstracts
    assert summary["out_of_distribution"] <= 2  # (measured 1 of 100)
    assert summary["confidence_output"] == str(tmp_path / "c.npy")
    confidence = np.load(tmp_path / "c.npy")
    assert confidence.dtype == np.float32 and confidence.shape == (100,)
    assert ((confidence >= 0) & (confidence <= 1)).all() and confidence.std() > 0
    assert np.load(tmp_path / "y.npy").tobytes() == np.load(tmp_path / "plain.npy").tobytes()
    # batch-invariant: the same confidences whatever --batch-size
    again = [*base[:-1], "100", "--output", str(tmp_path / "y2.npy")]
    assert main([*again, "--confidence-output", str(tmp_path / "c2.npy")]) == 0
    assert np.load(tmp_path / "c2.npy").tobytes() == confidence.tobytes()


def test_translate_counts_rows_out_of_distribution(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    garbage = np.random.default_rng(0).normal(size=(30, 384)).astype(np.float32)
    np.save(tmp_path / "garbage.npy", garbage)
    args = ["translate", str(out), "--input", str(tmp_path / "garbage.npy")]
    args += ["--output", str(tmp_path / "y.npy"), "--confidence-output", str(tmp_path / "c.npy")]
    assert main(args) == 0
    captured = capsys.readouterr()
    flagged = json.loads(captured.out)["out_of_distribution"]
    assert flagged >= 25  # 320 training rows: a loose threshold (measured 30 of 30)
    assert f"{flagged} of 30 rows are far outside" in captured.err


def test_translate_refuses_confidence_without_a_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_fit_args(tmp_path / "off", "--no-confidence")) == 0
    capsys.readouterr()
    args = ["translate", str(tmp_path / "off"), "--input", f"{DATA}:minilm_queries"]
    args += ["--output", str(tmp_path / "y.npy"), "--confidence-output", str(tmp_path / "c.npy")]
    assert main(args) == 2
    # the reason its fit recorded, not a guess
    assert "has no confidence head: it was fitted with --no-confidence" in capsys.readouterr().err
    assert not (tmp_path / "y.npy").exists() and not (tmp_path / "c.npy").exists()
    wrong = [*args[:-1], str(tmp_path / "c.csv")]
    assert main(wrong) == 2
    assert "must be a .npy file" in capsys.readouterr().err


def test_translate_refuses_one_file_for_vectors_and_confidences(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output y.npy --confidence-output ./y.npy`` wrote both to one file: the vectors
    replaced the confidences, and the command said it had written both."""
    out, _ = fitted
    args = ["translate", str(out), "--input", f"{DATA}:minilm_queries"]
    args += ["--output", str(tmp_path / "y.npy")]
    args += ["--confidence-output", f"{tmp_path}/./y.npy"]
    assert main(args) == 2
    assert "another file than --output" in capsys.readouterr().err
    assert not (tmp_path / "y.npy").exists()


def test_fit_local_weighs_each_pair_of_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queries = ["--source", f"{DATA}:minilm_queries", "--target", f"{DATA}:mpnet_queries"]
    common = [*queries, "--holdout-from", "1", "--method", "local", "--option", "k=5"]
    assert main(_fit_args(tmp_path / "w", *common, "--weight", "1", "--weight", "0")) == 0
    stitch = load_stitch(tmp_path / "w")
    assert stitch.architecture == "local"
    assert stitch.memory == 320  # the training documents; the zero-weight queries stay out
    assert main(_fit_args(tmp_path / "all", *common)) == 0
    assert load_stitch(tmp_path / "all").memory == 420
    capsys.readouterr()
    assert main(_fit_args(tmp_path / "bad", *common, "--weight", "1")) == 2
    assert "1 --weight for 2 --source/--target pairs" in capsys.readouterr().err
    assert main(_fit_args(tmp_path / "ridge", "--weight", "1")) == 2
    assert "methods local and gated only" in capsys.readouterr().err


def test_fit_calibrate_variance_records_the_output_scale(tmp_path: Path) -> None:
    assert main(_fit_args(tmp_path / "plain", "--method", "ridge")) == 0
    assert main(_fit_args(tmp_path / "scaled", "--method", "ridge", "--calibrate-variance")) == 0
    plain, scaled = load_stitch(tmp_path / "plain"), load_stitch(tmp_path / "scaled")
    assert "output_scale" not in plain.info.fit
    assert scaled.info.fit["output_scale"] > 1  # ridge shrinks: the scale restores the spread


def test_a_tensor_spec_does_not_bypass_the_existing_output_check(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output keep.safetensors:emb`` replaced the whole file (its other tensors lost):
    the check looked for a file named ``keep.safetensors:emb``."""
    out, _ = fitted
    keep = tmp_path / "keep.safetensors"
    save_file({"mine": np.ones((2, 3), dtype=np.float32)}, keep)
    before = keep.read_bytes()
    args = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--output", f"{keep}:emb"]
    assert main(args) == 2
    assert f"--output {keep} exists already; pass --force" in capsys.readouterr().err
    assert keep.read_bytes() == before
    assert main([*args, "--force"]) == 0
    assert list(load_file(keep)) == ["emb"]


@pytest.mark.parametrize(
    "command",
    [
        ["fit", "--source", f"{DATA}:minilm_corpus", "--target", f"{DATA}:mpnet_corpus",
         "--source-model", "a", "--target-model", "b", "--out", "never", "--seed", "-1"],
        ["score", "never", "--source", str(DATA), "--target", str(DATA), "--seed", "-1"],
    ],
)  # fmt: skip
def test_a_negative_seed_is_a_usage_error(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """NumPy refused it with a traceback deep in the fit."""
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "--seed: must be in [0, 2**63 - 1], got -1" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--out", "", "--out: must not be empty"),  # it wrote into the current folder
        ("--source-model", " ", "--source-model: must not be empty"),  # recorded as is
        ("--source-model", "m ", "--source-model: must not start or end with whitespace"),
        ("--target-model", "x\ny", "--target-model: must not hold the control or format"),
    ],
)
def test_empty_names_and_paths_are_usage_errors(
    flag: str, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _fit_args(tmp_path / "out")
    args[args.index(flag) + 1] = value
    assert main(args) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_files_that_cannot_be_written_are_a_message_not_a_traceback(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    inside = blocker / "sub.npy"  # its parent is a file
    args = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--output", str(inside)]
    assert main(args) == 2  # an error, as every other (1: a check that did not pass)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(blocker) in err and "Traceback" not in err


def test_an_output_that_is_a_directory_leaves_no_temporary_file(
    fitted: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = fitted
    (tmp_path / "out.npy").mkdir()
    args = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--output"]
    assert main([*args, str(tmp_path / "out.npy"), "--force"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["out.npy"]


def test_a_full_disk_leaves_no_temporary_file(
    fitted: tuple[Path, dict],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The .npy output is a memory map of a sparse file: on a full disk the process died of
    SIGBUS mid-write and left ``.out.npy.tmp-PID``. Its blocks are reserved first now, and a
    full disk is an error before any work (the kernel's ENOSPC, simulated here)."""
    import errno
    import os

    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate on this platform")

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    out, _ = fitted
    target = tmp_path / "out.npy"
    args = ["translate", str(out), "--input", f"{DATA}:minilm_queries", "--output", str(target)]
    assert main(args) == 2
    assert "no space left on device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_stops_early_is_not_an_error(tmp_path: Path) -> None:
    """``lead ... | head``: the pipe closes before the output is written; lead exits
    quietly with 141 (as a tool killed by SIGPIPE), not with ``error: broken pipe`` and
    2 (BrokenPipeError is an OSError, which the file errors' handler caught first)."""
    import subprocess

    args = [sys.executable, "-m", "lead.cli", "align", "--source", f"{DATA}:minilm_corpus"]
    args += ["--target", f"{DATA}:mpnet_corpus"]
    with (tmp_path / "stderr").open("wb") as stderr:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr)
        assert child.stdout is not None
        child.stdout.close()  # long before the figures are written (torch alone takes longer)
        status = child.wait(timeout=120)
    err = (tmp_path / "stderr").read_text()
    assert status == 141, err
    assert "error" not in err and "Traceback" not in err and "Exception" not in err
