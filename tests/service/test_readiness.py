"""Start-up: settings, device, stitch discovery, failures reported, /readyz 503 → 200."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from service_helpers import b64

import service.loader as loader_module
from service.app import create_app
from service.loader import configured_refs, parse_stitch_ref, resolve_device
from service.settings import Settings


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_STITCHES", '["models/minilm-to-mpnet","org/name@abc123"]')
    monkeypatch.setenv("LEAD_API_KEYS", "k1, k2")
    monkeypatch.setenv("LEAD_DEVICE", "CPU")
    monkeypatch.setenv("LEAD_MAX_VECTORS", "10")
    settings = Settings()
    assert settings.stitches == ["models/minilm-to-mpnet", "org/name@abc123"]
    assert [k.get_secret_value() for k in settings.api_keys] == ["k1", "k2"]
    assert "k1" not in repr(settings)
    assert settings.device == "cpu"
    assert settings.max_vectors == 10
    monkeypatch.setenv("LEAD_STITCHES", "a/b, ./local")
    assert Settings().stitches == ["a/b", "./local"]
    monkeypatch.setenv("LEAD_DEVICE", "tpu")
    with pytest.raises(ValueError, match="device"):
        Settings()


def test_stitch_refs(fitted: Any) -> None:
    local = parse_stitch_ref(str(fitted.folder("minilm-to-mpnet")))
    assert (local.id, local.origin, local.revision) == ("minilm-to-mpnet", "local", None)
    hub = parse_stitch_ref("org/name@abc123")
    assert (hub.id, hub.location, hub.origin, hub.revision) == (
        "org/name@abc123",
        "org/name",
        "hub",
        "abc123",
    )
    assert parse_stitch_ref("org/name").revision is None
    refs = configured_refs(Settings(models_dir=fitted.root))
    assert [r.id for r in refs] == sorted(p.name for p in fitted.root.iterdir())


def test_default_serves_every_folder_under_models_dir(fitted: Any, queries: Any) -> None:
    app = create_app(Settings(models_dir=fitted.root, device="cpu", load_in_background=False))
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        ids = [s["id"] for s in client.get("/v1/stitches").json()["data"]]
        assert ids == sorted(p.name for p in fitted.root.iterdir())


def test_device_selection() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            create_app(Settings(device="cuda:1", stitches=[]))


def _broken_copy(fitted: Any, tmp_path: Path) -> Path:
    broken = tmp_path / "broken-stitch"
    shutil.copytree(fitted.folder("minilm-to-pml3"), broken)
    config = json.loads((broken / "config.json").read_text())
    config["architecture"] = "no-such-architecture"
    (broken / "config.json").write_text(json.dumps(config))
    return broken


def test_a_broken_stitch_is_reported_not_skipped(
    make_client: Any, fitted: Any, queries: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _broken_copy(fitted, tmp_path)
    missing = tmp_path / "missing-stitch"
    client = make_client(["minilm-to-mpnet", str(broken), str(missing)])
    r = client.get("/readyz")
    assert r.status_code == 503, r.text
    assert "retry-after" not in r.headers  # all loaded, two failed: retrying will not help
    body = r.json()
    assert body["status"] == "failed"
    assert body["ready"] == ["minilm-to-mpnet"]
    failed = {f["id"]: f for f in body["failed"]}
    assert set(failed) == {"broken-stitch", "missing-stitch"}
    assert "no-such-architecture" in failed["broken-stitch"]["message"]
    assert failed["missing-stitch"]["error"] == "StitchNotFoundError"
    assert "broken-stitch" in caplog.text and "missing-stitch" in caplog.text
    # asking for it says why; the healthy stitch still serves
    r = client.post("/v1/translate", json={"stitch": "broken-stitch", "input": [[0.0] * 384]})
    assert r.status_code == 404, r.text
    assert "failed to load" in r.json()["error"]["message"]
    r = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
    )
    assert r.status_code == 200, r.text
    assert client.get("/healthz").status_code == 200


def test_readyz_503_while_loading_then_200(
    fitted: Any, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_load = loader_module.load_stitch

    def gated_load(*args: Any, **kwargs: Any) -> Any:
        assert gate.wait(10)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loader_module, "load_stitch", gated_load)
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))], device="cpu", load_in_background=True
    )
    with TestClient(create_app(settings)) as client:
        r = client.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "5"
        assert r.json()["status"] == "loading"
        assert r.json()["pending"] == ["minilm-to-mpnet"]
        assert client.get("/healthz").status_code == 200
        # HEAD as GET, for load balancers that probe with it (was 405)
        assert client.head("/healthz").status_code == 200
        head = client.head("/readyz")
        assert (head.status_code, head.headers["retry-after"]) == (503, "5")
        body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"]
        assert r.json()["error"]["code"] == "not_ready"
        gate.set()
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.02)
        assert client.get("/readyz").json() == {
            "status": "ready",
            "ready": ["minilm-to-mpnet"],
            "pending": [],
            "failed": [],
            "retrying": [],
        }
        assert client.post("/v1/translate", json=body).status_code == 200
        assert client.head("/readyz").status_code == 200


def test_shutdown_waits_for_the_stitch_being_loaded(
    fitted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that exited while the background loader was inside torch aborted
    ("terminate called without an active exception", 1 run in 3): the shutdown lets the
    stitch being loaded finish and loads no other."""
    started, loaded = threading.Event(), []
    real_load = loader_module.load_stitch

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        started.set()
        time.sleep(0.5)
        loaded.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loader_module, "load_stitch", slow_load)
    folders = [str(fitted.folder("minilm-to-mpnet")), str(fitted.folder("minilm-to-pml3"))]
    settings = Settings(stitches=folders, device="cpu", load_in_background=True)
    with TestClient(create_app(settings)):
        assert started.wait(10)
    assert not [t for t in threading.enumerate() if t.name == "lead-loader"]
    assert len(loaded) == 1


def test_register_at_run_time(make_client: Any, fitted: Any, queries: Any) -> None:
    from lead.artifacts import load_stitch

    client = make_client(["minilm-to-mpnet"])
    registry = client.app.state.registry  # type: ignore[attr-defined]
    threads = [
        threading.Thread(
            target=registry.register, args=(f"job-{i}", load_stitch(fitted.folder("pml3-to-mpnet")))
        )
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [s["id"] for s in client.get("/v1/stitches").json()["data"]]
    assert ids == ["job-0", "job-1", "job-2", "job-3", "minilm-to-mpnet"]
    assert client.get("/v1/stitches/job-2").json()["origin"] == "job"
    r = client.post("/v1/translate", json={"stitch": "job-3", "input": b64(queries["pml3"][:2])})
    assert r.status_code == 200, r.text
    assert client.get("/readyz").status_code == 200


def test_the_settings_check_exits_1_naming_the_problem() -> None:
    """``python -m service.settings_check`` (run by scripts/serve.sh before uvicorn, whose
    supervisor restarts refusing workers forever) exits 1 and names the problem."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LEAD_WORKERS": "2", "LEAD_JOB_LEASE_SECONDS": "0"}
    cmd = [sys.executable, "-m", "service.settings_check"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "LEAD_JOB_LEASE_SECONDS: Input should be greater than or equal to 1" in done.stderr
    env["LEAD_JOB_LEASE_SECONDS"] = "5"
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=120).returncode == 0
    if not torch.cuda.is_available():  # the device, which create_app checks, is checked too
        env["LEAD_DEVICE"] = "cuda"
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1
        assert "CUDA is not available" in done.stderr
