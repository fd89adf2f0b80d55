"""A server restart loses nothing: finished jobs keep their results and stitches, a job that
was training is started again (``LEAD_JOB_MAX_ATTEMPTS``) or, after its last attempt,
``failed`` / ``interrupted``; queued jobs run, leftovers are removed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from jobs_helpers import make_jobs_client, scifact_dataset, upload, wait_job
from service_helpers import b64

from service.jobs.store import JobStore
from tests.conftest import REPO

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
SLOW_MLP = {"hidden_dim": 16, "batch_size": 64, "max_epochs": 100000, "patience": 100000}
#: One attempt per job and a short lease: a crashed server's job fails within seconds.
ONE_ATTEMPT = {"job_lease_seconds": 2.0, "job_max_attempts": 1}


def _training(job: dict[str, Any]) -> bool:
    return job["progress"]["stage"] == "train" and job["progress"]["step"] >= 1


@pytest.mark.slow
def test_restart_in_the_middle_of_a_job(tmp_path: Path, scifact_small: Any) -> None:
    data_dir = tmp_path / "data"
    models = {"source_model": MINILM, "target_model": MPNET}
    first = make_jobs_client(data_dir, **ONE_ATTEMPT)
    try:
        dataset = upload(first, scifact_dataset(scifact_small))["id"]
        r = first.post("/v1/jobs", json={**models, "dataset": dataset})
        done = wait_job(first, r.json()["id"])
        assert done["status"] == "succeeded", done
        r = first.post(
            "/v1/jobs",
            json={**models, "dataset": dataset, "method": "mlp", "options": SLOW_MLP,
                  "stitch_id": "cut-short"},
        )  # fmt: skip
        slow = wait_job(first, r.json()["id"], until=_training)
        queued = first.post("/v1/jobs", json={**models, "dataset": dataset, "seed": 1}).json()
        assert queued["status"] == "queued"
        first.app.state.jobs.runner.kill()  # type: ignore[attr-defined]  # as a crash would
    finally:
        first.__exit__(None, None, None)
    store = JobStore(data_dir / "lead.sqlite3")
    assert store.get_job(slow["id"]).status == "running"  # what a crash leaves behind
    store.close()
    # leftovers of writes that a crash interrupted
    (data_dir / "stitches" / ".cut-short.tmp-x1y2").mkdir()
    (data_dir / "stitches" / ".cut-short.tmp-x1y2" / "model.safetensors").write_bytes(b"half")
    (data_dir / "datasets" / ".tmp-ds_partial.safetensors").write_bytes(b"half")
    (data_dir / "job-data" / "job_never_recorded.safetensors").write_bytes(b"orphan")

    second = make_jobs_client(data_dir, **ONE_ATTEMPT)
    try:
        after = wait_job(second, slow["id"], timeout=10)  # once its lease has run out
        assert after["status"] == "failed", after
        assert after["error"]["code"] == "interrupted" and after["finished_at"] is not None
        assert after["result"] is None
        kept = second.get(f"/v1/jobs/{done['id']}").json()
        assert kept == done  # results, scorecard and timestamps intact
        r = second.post(
            "/v1/translate",
            json={"stitch": done["stitch_id"], "input": b64(scifact_small.queries["minilm"][:3])},
        )
        assert r.status_code == 200, r.text  # saved stitches are served after a restart
        # no leftover and no folder of the interrupted job (the queued job may be done already)
        saved = {p.name for p in (data_dir / "stitches").iterdir()}
        assert done["stitch_id"] in saved <= {done["stitch_id"], queued["stitch_id"]}
        assert [p.name for p in (data_dir / "datasets").iterdir()] == [f"{dataset}.safetensors"]
        assert not list((data_dir / "job-data").iterdir())
        assert second.get(f"/v1/datasets/{dataset}").status_code == 200
        requeued = wait_job(second, queued["id"])  # queued jobs run after the restart
        assert requeued["status"] == "succeeded", requeued

        # a normal shutdown during the last attempt queues it again, the attempt given
        # back (it was failed as interrupted: two deploys lost a long training)
        r = second.post("/v1/jobs", json={**models, "dataset": dataset, "method": "mlp",
                                          "options": SLOW_MLP})  # fmt: skip
        stopped = wait_job(second, r.json()["id"], until=_training)
    finally:
        second.__exit__(None, None, None)
    store = JobStore(data_dir / "lead.sqlite3")
    job = store.get_job(stopped["id"])
    assert (job.status, job.attempts, job.error) == ("queued", 0, None)
    assert store.get_job(requeued["id"]).status == "succeeded"
    store.close()


def test_the_newest_of_equal_stitches_still_wins_after_a_restart(
    tmp_path: Path, scifact_small: Any
) -> None:
    """Routing by model names prefers, at equal held-out R², the newest job's stitch; a
    restart registers the job stitches in the order they were trained, not by name."""
    sf = scifact_small
    pairs = {
        "source_model": "test/minilm",
        "target_model": "test/pml3",
        "source": b64(sf.corpus["minilm"][:60]),
        "target": b64(sf.corpus["pml3"][:60]),
    }
    x = {
        "source_model": "test/minilm",
        "target_model": "test/pml3",
        "input": b64(sf.queries["minilm"][:2]),
    }
    client = make_jobs_client(tmp_path / "data")
    try:
        for stitch_id in ("z-older", "a-newer"):  # the same data: the same R²
            r = client.post("/v1/jobs", json={**pairs, "stitch_id": stitch_id,
                                               "allow_below_baseline": True})  # fmt: skip
            assert r.status_code == 202, r.text
            assert wait_job(client, r.json()["id"])["status"] == "succeeded"
        r = client.post("/v1/translate", json=x)
        assert r.status_code == 200, r.text
        assert r.json()["stitch"]["id"] == "a-newer"
    finally:
        client.__exit__(None, None, None)
    restarted = make_jobs_client(tmp_path / "data")
    try:
        r = restarted.post("/v1/translate", json=x)
        assert r.status_code == 200, r.text
        assert r.json()["stitch"]["id"] == "a-newer"
    finally:
        restarted.__exit__(None, None, None)


@pytest.mark.slow
def test_a_job_cut_short_by_a_crash_is_started_again(tmp_path: Path, scifact_small: Any) -> None:
    """With the default ``LEAD_JOB_MAX_ATTEMPTS`` (2) a job whose server died trains again
    once its lease has run out, and its stitch is served."""
    data_dir = tmp_path / "data"
    short = {**SLOW_MLP, "max_epochs": 300}
    first = make_jobs_client(data_dir, job_lease_seconds=1.0)
    try:
        dataset = upload(first, scifact_dataset(scifact_small))["id"]
        body = {"source_model": MINILM, "target_model": MPNET, "dataset": dataset}
        r = first.post("/v1/jobs", json={**body, "method": "mlp", "options": short})
        job = wait_job(first, r.json()["id"], until=_training)
        assert job["attempts"] == 1
        first.app.state.jobs.runner.kill()  # type: ignore[attr-defined]  # as a crash would
    finally:
        first.__exit__(None, None, None)
    second = make_jobs_client(data_dir, job_lease_seconds=1.0)
    try:
        again = wait_job(second, job["id"], timeout=120)
        assert (again["status"], again["attempts"]) == ("succeeded", 2), again  # a crash counts
        r = second.post(
            "/v1/translate",
            json={"stitch": again["stitch_id"], "input": b64(scifact_small.queries["minilm"][:3])},
        )
        assert r.status_code == 200, r.text
    finally:
        second.__exit__(None, None, None)


def _train_a_stitch(data_dir: Path, sf: Any) -> None:
    """Serve stitch ``trained`` (60 SciFact pairs, MiniLM -> mpnet) from a server that then
    stops, its job store and stitches left in ``data_dir``."""
    pairs = {"source_model": MINILM, "target_model": MPNET, "stitch_id": "trained",
             "source": b64(sf.corpus["minilm"][:60]), "target": b64(sf.corpus["mpnet"][:60]),
             "allow_below_baseline": True}  # fmt: skip
    client = make_jobs_client(data_dir)
    try:
        r = client.post("/v1/jobs", json=pairs)
        assert wait_job(client, r.json()["id"])["status"] == "succeeded"
    finally:
        client.__exit__(None, None, None)


def test_a_job_stitch_not_loaded_yet_after_a_restart_is_503_not_404(
    tmp_path: Path, scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the watcher registers a published job stitch after a restart, requests naming
    it get 503 not_ready (with Retry-After), not 404: a client that takes 404 as final
    dropped a stitch about to be served again (an adversarial pass: ~5 s of 404s)."""
    import lead.artifacts

    sf = scifact_small
    _train_a_stitch(tmp_path / "data", sf)
    x = {"stitch": "trained", "input": b64(sf.queries["minilm"][:2])}
    load = lead.artifacts.load_stitch

    def busy(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the disk is busy")

    monkeypatch.setattr(lead.artifacts, "load_stitch", busy)  # its first try fails
    restarted = make_jobs_client(tmp_path / "data", stitch_poll_seconds=0.2)
    try:
        r = restarted.post("/v1/translate", json=x)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] and r.json()["error"]["code"] == "not_ready"
        assert "'trained' (trained by a job) is still loading; its last try failed" in r.text
        assert "OSError: the disk is busy" in r.text
        ready = restarted.get("/readyz")  # listed, but one job's stitch keeps no replica out
        assert ready.status_code == 200, ready.text
        assert ready.json()["retrying"] == [
            {"id": "trained", "error": "OSError", "message": "the disk is busy"}
        ]
        r = restarted.post("/v1/translate", json={**x, "stitch": "never-trained"})
        assert r.status_code == 404, r.text
        monkeypatch.setattr(lead.artifacts, "load_stitch", load)
        for _ in range(100):  # the watcher tries again within a few polls
            r = restarted.post("/v1/translate", json=x)
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.status_code == 200, r.text
        assert restarted.get("/readyz").json()["retrying"] == []
    finally:
        restarted.__exit__(None, None, None)


def test_readyz_waits_for_the_job_stitches_served_before_a_restart(
    tmp_path: Path, scifact_small: Any
) -> None:
    """With the configured stitches loading in the background, /readyz said 200 before the
    job stitches published before the restart were served again: requests naming them got
    503 and the listing lacked them (an adversarial pass). The watcher's interval here is
    far longer than the test, so only a pass right after the configured stitches load
    serves it in time."""
    sf = scifact_small
    _train_a_stitch(tmp_path / "data", sf)
    bundled = str(REPO / "models" / "minilm-to-mpnet")
    restarted = make_jobs_client(
        tmp_path / "data", stitches=[bundled], load_in_background=True, stitch_poll_seconds=60
    )
    try:
        seen = []
        deadline = time.monotonic() + 60
        while (r := restarted.get("/readyz")).status_code != 200:
            assert r.status_code == 503 and time.monotonic() < deadline, r.text
            seen.extend(r.json()["pending"])
            time.sleep(0.02)
        assert set(r.json()["ready"]) == {"minilm-to-mpnet", "trained"}, r.text
        assert "trained" in {s["id"] for s in restarted.get("/v1/stitches").json()["data"]}
        x = {"stitch": "trained", "input": b64(sf.queries["minilm"][:2])}
        assert restarted.post("/v1/translate", json=x).status_code == 200
        assert "trained" in seen or "minilm-to-mpnet" in seen  # it was loading at first
    finally:
        restarted.__exit__(None, None, None)


def test_a_sigterm_to_the_process_group_leaves_the_job_to_the_server(
    tmp_path: Path, scifact_small: Any
) -> None:
    """systemd's default KillMode sends SIGTERM to every process of the service: the
    training process died of it first, and its job was failed for good as a crash (an
    adversarial pass). It now ignores SIGTERM; the server's shutdown queues the job again,
    and after the restart it trains to the end."""
    import os
    import signal

    data_dir = tmp_path / "data"
    short = {**SLOW_MLP, "max_epochs": 100}
    first = make_jobs_client(data_dir)
    try:
        dataset = upload(first, scifact_dataset(scifact_small))["id"]
        body = {"source_model": MINILM, "target_model": MPNET, "dataset": dataset}
        r = first.post("/v1/jobs", json={**body, "method": "mlp", "options": short})
        job = wait_job(first, r.json()["id"], until=_training)
        runner = first.app.state.jobs.runner  # type: ignore[attr-defined]
        workers = runner.worker_pids()
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
        time.sleep(2.0)  # the supervisor polls its workers meanwhile
        still = first.get(f"/v1/jobs/{job['id']}").json()
        assert still["status"] == "running", still  # was failed, worker_crashed (code -15)
    finally:
        first.__exit__(None, None, None)  # the server's own shutdown
    second = make_jobs_client(data_dir)
    try:
        again = wait_job(second, job["id"], timeout=120)
        # the graceful stop gave its attempt back: this run is the first that counts
        assert (again["status"], again["attempts"]) == ("succeeded", 1), again
    finally:
        second.__exit__(None, None, None)
