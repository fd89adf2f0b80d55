"""Settings that point the jobs somewhere unusable stop the server at start-up, fast, in one
line that never shows a password; ``python -m service.settings_check`` catches them first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from scripts._harness import REPO, free_port
from service.settings import Settings

PASSWORD = "hunter2-secret"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"mysql://lead:{PASSWORD}@db:3306/lead", "a mysql:// URL"),
        (f"postgresql+psycopg://lead:{PASSWORD}@db/lead", "a postgresql+psycopg:// URL"),
        (f"sqlite:///{PASSWORD}.db", "a sqlite:// URL"),
        (f"lead:{PASSWORD}@db/lead", "not a URL"),
    ],
)
def test_a_database_url_that_is_not_postgresql_is_refused_without_its_password(
    url: str, named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(database_url=url)
    text = str(caught.value)
    assert "database_url must be a PostgreSQL URL" in text and named in text
    assert PASSWORD not in text


def test_a_postgresql_url_and_an_empty_one_are_accepted() -> None:
    url = f"postgres://lead:{PASSWORD}@db:5432/lead"
    settings = Settings(database_url=url)
    assert settings.database_url is not None and settings.database_url.get_secret_value() == url
    assert Settings(database_url="").database_url is None


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "LEAD_DATA_DIR": str(tmp_path / "data"),
        "LEAD_STITCHES": "[]",
        "LEAD_DEVICE": "cpu",
        "LEAD_LOAD_IN_BACKGROUND": "false",
        **extra,
    }


def _settings_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "service.settings_check"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def _serve(env: dict[str, str], timeout: float = 90) -> tuple[int, str]:
    """Start uvicorn; its exit status and output (it must stop by itself)."""
    cmd = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
    cmd += ["--port", str(free_port())]
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )  # a hang raises TimeoutExpired
    return done.returncode, done.stdout + done.stderr


def test_an_unreachable_job_database_stops_the_check_and_the_server_in_one_line(
    tmp_path: Path,
) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://lead:{PASSWORD}@127.0.0.1:{free_port()}/lead"
    env = _env(tmp_path, LEAD_DATABASE_URL=url)
    check = _settings_check(env)
    assert check.returncode == 1
    assert check.stderr.count("\n") == 1, check.stderr
    assert "cannot connect to the job database postgresql://lead@127.0.0.1" in check.stderr
    code, output = _serve(env)
    assert code != 0
    assert "LEAD cannot start: cannot connect to the job database" in output, output
    assert "Traceback" not in output and PASSWORD not in output + check.stderr


def test_an_unknown_stitch_store_protocol_stops_the_check_and_the_server(tmp_path: Path) -> None:
    env = _env(tmp_path, LEAD_STITCH_STORE="nosuchproto://bucket/stitches")
    check = _settings_check(env)
    assert check.returncode == 1 and "Protocol not known: nosuchproto" in check.stderr
    code, output = _serve(env)
    assert code != 0 and "LEAD cannot start: LEAD_STITCH_STORE nosuchproto://" in output, output
    assert "Traceback" not in output


def test_a_stitch_store_folder_that_cannot_be_made_is_caught_by_the_check(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    check = _settings_check(_env(tmp_path, LEAD_STITCH_STORE=str(blocker / "stitches")))
    assert check.returncode == 1 and "cannot write stitches under" in check.stderr


def test_an_unreachable_ray_address_stops_the_server_within_seconds(tmp_path: Path) -> None:
    """``ray.init`` retries an unreachable head for minutes (the server hung at start-up,
    deaf to SIGTERM); the head's port is tried first."""
    pytest.importorskip("ray")
    env = _env(tmp_path, LEAD_RAY_ADDRESS=f"127.0.0.1:{free_port()}")
    check = _settings_check(env)
    assert check.returncode == 1 and "cannot reach the Ray cluster at 127.0.0.1:" in check.stderr
    code, output = _serve(env, timeout=60)
    assert code != 0
    assert "LEAD cannot start: cannot reach the Ray cluster" in output, output
    assert "Traceback" not in output
    env["LEAD_RAY_ADDRESS"] = "127.0.0.1"  # no port
    check = _settings_check(env)
    assert check.returncode == 1 and "is not auto, host:port or ray://host:port" in check.stderr


def test_a_refused_setting_is_named_by_its_variable_and_a_misspelt_one_is_warned_about(
    tmp_path: Path,
) -> None:
    """pydantic named the field (``max_vectors``) with a documentation link, and a misspelt
    variable (``LEAD_MAX_VECTOR``) was ignored without a word (a new user's trial)."""
    env = _env(
        tmp_path, LEAD_MAX_VECTORS="lots", LEAD_DEVICE="gpu", LEAD_MAX_VECTOR="10"
    )  # fmt: skip
    env["LEAD_API_KEYS"] = f"{PASSWORD}:nosuchscope"
    check = _settings_check(env)
    assert check.returncode == 1
    lines = check.stderr.splitlines()
    assert "LEAD settings: LEAD_MAX_VECTORS: Input should be a valid integer" in check.stderr
    assert "LEAD settings: LEAD_DEVICE: device must be auto, cpu, cuda or cuda:N" in check.stderr
    assert any(line.startswith("LEAD settings: LEAD_API_KEYS: ") for line in lines), lines
    assert (
        "LEAD settings: warning: LEAD_MAX_VECTOR is not a LEAD setting and is ignored "
        "(did you mean LEAD_MAX_VECTORS?)"
    ) in lines
    assert "pydantic.dev" not in check.stderr and PASSWORD not in check.stderr
    good = _settings_check(_env(tmp_path, LEAD_SHARED_DATA="/nowhere"))  # not a setting: quiet
    assert good.returncode == 0 and "LEAD_SHARED_DATA" not in good.stderr


def test_a_misspelt_local_stitch_is_caught_by_the_check(tmp_path: Path) -> None:
    """A misspelt bundled id in ``LEAD_STITCHES`` passed the check; the server started and
    ``/readyz`` stayed 503 for good (a new user's trial). Hub ids are left to the loader."""
    check = _settings_check(_env(tmp_path, LEAD_STITCHES="minilm-to-mpnt,minilm-to-pml3"))
    assert check.returncode == 1
    assert check.stderr.startswith(
        "LEAD settings: LEAD_STITCHES: no stitch folder, bundled stitch or Hub repo "
        "'minilm-to-mpnt' (bundled: "
    ), check.stderr
    check = _settings_check(_env(tmp_path, LEAD_STITCHES='["models/minilm-to-mpnett"]'))
    assert check.returncode == 1
    assert "no stitch folder 'models/minilm-to-mpnett': the folder models has no" in check.stderr
    good = "minilm-to-mpnet,models/minilm-to-pml3,some-org/some-stitch@v1"
    assert _settings_check(_env(tmp_path, LEAD_STITCHES=good)).returncode == 0
