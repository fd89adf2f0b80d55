"""The README's walkthrough, step by step through ``lead migrate`` on a real pgvector table
(SciFact documents by all-MiniLM-L6-v2, the shipped fixture), and the CLI's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lead.cli import main
from lead.migrate.registry import open_source, open_target
from lead.migrate.translator import LocalTranslator
from scripts.migrate_demo import build_demo, load_scifact
from tests._http import answering
from tests.conftest import REPO
from tests.migrate._data import write_parquet
from tests.migrate.conftest import checksum, sql


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


@pytest.fixture(scope="module")
def demo(pg_uri: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    data = load_scifact(native_sample=300, prefer_shared=False)
    return build_demo(pg_uri, tmp_path_factory.mktemp("demo"), data, table="walk")


def test_walkthrough_plan_calibrate_apply_verify(demo, pg_uri, tmp_path, capsys):
    before = checksum(pg_uri, "walk", "embedding")
    code, plan = _run(capsys, "migrate", "plan", demo["source"], "--stitch", "minilm-to-mpnet")
    assert code == 0 and plan["ok"] and plan["problems"] == []
    assert (plan["source"]["rows"], plan["source"]["dim"], plan["stitch"]["target_dim"]) == (
        400,
        384,
        768,
    )
    assert plan["estimated_seconds"] > 0

    stitch = str(tmp_path / "stitch")
    retrieval = [
        *("--queries", demo["queries"], "--source-queries", demo["source_queries"]),
        *("--qrels", demo["qrels"]),
    ]
    code, calibrated = _run(
        capsys,
        "migrate",
        "calibrate",
        demo["source"],
        demo["native"],
        "--stitch",
        stitch,
        *retrieval,
    )
    assert code == 0 and calibrated["decision"] == "go"
    assert (Path(stitch) / "model.safetensors").is_file()

    code, applied = _run(
        capsys,
        "migrate",
        "apply",
        demo["source"],
        demo["target"],
        "--stitch",
        stitch,
        "--batch-size",
        "64",
        "--quiet",
    )
    assert code == 0 and (applied["rows_written"], applied["rows_total"]) == (400, 400)
    with open_source(demo["source"]) as source, open_target(demo["target"]) as target:
        ids = source.sample_ids(50, seed=1)
        expected = LocalTranslator(stitch)(source.fetch(ids))
        assert np.abs(target.fetch(ids) - expected).max() <= 1e-5
    code, again = _run(
        capsys, "migrate", "apply", demo["source"], demo["target"], "--stitch", stitch, "--quiet"
    )
    assert code == 0 and again["rows_written"] == 0 and again["already_done"]

    report, junit = tmp_path / "report", tmp_path / "junit.xml"
    code, verified = _run(
        capsys,
        "migrate",
        "verify",
        demo["source"],
        demo["target"],
        "--native",
        demo["native"],
        "--stitch",
        stitch,
        *retrieval,
        "--report",
        str(report),
        "--junit",
        str(junit),
    )
    assert code == 0 and verified["passed"]
    written = json.loads((report / "report.json").read_text())
    assert written["passed"] is True
    assert written["sample"]["excluded"] == calibrated["scorecard"]["pairs"] * 4  # 80 % fitted
    assert "PASSED" in (report / "report.md").read_text()
    assert ET.parse(junit).getroot().find(".//failure") is None
    # a gate the migration cannot meet: exit status 1 and a JUnit failure
    code, failed = _run(
        capsys,
        "migrate",
        "verify",
        demo["source"],
        demo["target"],
        "--native",
        demo["native"],
        "--min-mean-cosine",
        "0.999",
        "--report",
        str(report),
        "--junit",
        str(junit),
    )
    assert code == 1 and not failed["passed"]
    assert ET.parse(junit).getroot().find(".//failure") is not None
    # a bundled stitch id, as plan and apply take it (it was "no stitch folder at ..."):
    # it records no store ids, so none are left out of the sample
    code = main([
        "migrate", "verify", demo["source"], demo["target"], "--native",
        demo["native"], "--stitch", "minilm-to-mpnet", "--min-mean-cosine", "0",
        "--report", str(tmp_path / "bundled-report"),
    ])  # fmt: skip
    out, err = capsys.readouterr()
    bundled = json.loads(out.strip().splitlines()[-1])
    assert code in (0, 1) and bundled["sample"]["excluded"] == 0, bundled
    # and says so: a new user read its figures as held-out ones
    assert "records no ids of a store it was fitted on" in err
    assert checksum(pg_uri, "walk", "embedding") == before


def test_plan_lists_problems_instead_of_failing(pg_uri, capsys):
    sql(pg_uri, "DROP TABLE IF EXISTS plan_nulls")
    sql(pg_uri, "CREATE TABLE plan_nulls (id bigint PRIMARY KEY, emb vector(384))")
    sql(pg_uri, "INSERT INTO plan_nulls VALUES (1, NULL)")
    uri = pg_uri + "&table=plan_nulls&column=emb"
    code, plan = _run(capsys, "migrate", "plan", uri, "--stitch", "minilm-to-mpnet")
    assert code == 1 and not plan["ok"]
    assert "NULL" in plan["problems"][0] and "id 1" in plan["problems"][0]
    code, plan = _run(capsys, "migrate", "plan", uri, "--stitch", "mpnet-to-minilm")
    assert code == 1 and "expects 768" in plan["problems"][0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["apply", "nope.parquet", "out", "--stitch", "minilm-to-mpnet"], "no such file"),
        (["apply", "mysql://h/db", "out", "--stitch", "minilm-to-mpnet"], "unknown store scheme"),
        (["plan", "x.npy", "--stitch", "no-such-stitch"], "no stitch"),
        (["apply", "a.npy", "b", "--stitch", "minilm-to-mpnet", "--batch-size", "0"], "at least 1"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.ones((2, 384), np.float32))
    assert main(["migrate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_a_no_go_stitch_is_refused_unless_allowed(demo, pg_uri, tmp_path, capsys):
    stitch = str(tmp_path / "strict")
    code, calibrated = _run(
        capsys,
        "migrate",
        "calibrate",
        demo["source"],
        demo["native"],
        "--stitch",
        stitch,
        "--min-r2",
        "0.99",
    )
    assert code == 1 and calibrated["decision"] == "no-go"
    assert "ids (in config.json)" in json.dumps(calibrated)  # no id lists on stdout
    code, plan = _run(capsys, "migrate", "plan", demo["source"], "--stitch", stitch)
    assert code == 1 and "no-go" in plan["problems"][0] and "min_r2" in plan["problems"][0]
    target = str(tmp_path / "out")
    assert main(["migrate", "apply", demo["source"], target, "--stitch", stitch, "--quiet"]) == 2
    assert "--allow-no-go" in capsys.readouterr().err and not Path(target).exists()
    code, applied = _run(
        capsys,
        "migrate",
        "apply",
        demo["source"],
        target,
        "--stitch",
        stitch,
        "--allow-no-go",
        "--quiet",
    )
    assert code == 0 and applied["rows_written"] == 400


def test_resume_as_another_user_or_by_another_name(demo, pg_uri, tmp_path, capsys):
    """The same table and the same stitch files resume, however they are written."""
    import shutil

    from lead.artifacts import BUNDLED_MODELS_DIR

    copy = tmp_path / "copy"
    shutil.copytree(BUNDLED_MODELS_DIR / "minilm-to-mpnet", copy)
    target = str(tmp_path / "resumed")
    assert (
        main(["migrate", "apply", demo["source"], target, "--stitch", "minilm-to-mpnet", "--quiet"])
        == 0
    )
    other_user = demo["source"].replace("postgres:@", "postgres:secret@")
    code, again = _run(
        capsys, "migrate", "apply", other_user, target, "--stitch", f"{copy}/", "--quiet"
    )
    assert code == 0 and again["already_done"]


def test_python_verify_mirrors_the_cli(demo, tmp_path):
    from lead import migrate

    target = str(tmp_path / "t")
    migrate.apply(demo["source"], target, "minilm-to-mpnet", progress=False)
    result = migrate.verify(demo["source"], target, demo["native"], report_dir=tmp_path / "report")
    assert result.passed and (tmp_path / "report" / "report.md").is_file()


def test_a_file_target_must_be_a_folder(demo, tmp_path, capsys):
    assert (
        main(
            [
                "migrate",
                "apply",
                demo["source"],
                str(tmp_path / "x.npy"),
                "--stitch",
                "minilm-to-mpnet",
            ]
        )
        == 2
    )
    assert "Parquet folder" in capsys.readouterr().err


def test_apply_on_an_unreachable_ray_address_fails_at_once(
    scifact_small: Any, tmp_path: Path
) -> None:
    """``ray.init`` retries an unreachable head for minutes; the migration says so at once."""
    pytest.importorskip("ray")
    source = write_parquet(
        tmp_path / "rows.parquet", np.arange(8), scifact_small.corpus["minilm"][:8]
    )
    lead = Path(sys.executable).with_name("lead")
    argv = [str(lead), "migrate", "apply", source, str(tmp_path / "out"), "--stitch",
            str(REPO / "models" / "minilm-to-mpnet"), "--engine", "ray",
            "--ray-address", "127.0.0.1:1", "--quiet"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:1 (--ray-address)" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_migrate_takes_the_servers_api_key_as_the_other_commands_do(tmp_path, capsys):
    """`lead migrate apply --server URL --api-key K` was "unrecognized arguments": only
    LEAD_API_KEY reached the server (a new user's trial). A real HTTP server records the
    header and refuses every key."""
    seen: list[str | None] = []

    def refuse(method: str, path: str, headers: Any, sent: bytes) -> tuple[int, dict, bytes]:
        seen.append(headers.get("authorization"))
        error = {"error": {"code": "invalid_api_key", "message": "invalid API key"}}
        return 401, {}, json.dumps(error).encode()

    with answering(refuse) as url:
        source = write_parquet(tmp_path / "src.parquet", np.arange(4), np.ones((4, 384)))
        argv = ["migrate", "apply", source, str(tmp_path / "out"), "--stitch", "minilm-to-mpnet"]
        assert main([*argv, "--server", url, "--api-key", "k-123"]) == 2
    assert seen and set(seen) == {"Bearer k-123"}
    assert "the one of --api-key, else LEAD_API_KEY" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
