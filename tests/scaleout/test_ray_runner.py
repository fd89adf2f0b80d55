"""Jobs as Ray tasks (``LEAD_RAY_ADDRESS``), on a Ray cluster of the test process
(``ray.init(address="local")``): cancelled with Ray's cancel, a Ray worker killed once is
retried by Ray, killed twice fails the job with a clear reason; never ``running`` forever."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.jobs_helpers import make_jobs_client, scifact_dataset, upload, wait_job

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
SLOW_MLP = {"hidden_dim": 16, "batch_size": 64, "max_epochs": 400, "patience": 100000}


def _training(job: dict[str, Any]) -> bool:
    return job["progress"]["stage"] == "train" and job["progress"]["step"] >= 1


def _ray_task_pids(job_id: str) -> list[int]:
    """Process ids of the Ray workers running a job (titled ``ray::lead-job-<job id>``)."""
    title = f"ray::lead-job-{job_id}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(title):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _kill_the_task(job_id: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not (pids := _ray_task_pids(job_id)):
        assert time.monotonic() < deadline, "no Ray worker runs the job"
        time.sleep(0.05)
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


@pytest.fixture(scope="module")
def ray_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    pytest.importorskip("ray")
    client = make_jobs_client(
        tmp_path_factory.mktemp("ray-jobs"),
        ray_address="local",
        job_cancel_grace_seconds=5.0,
    )
    try:
        yield client
    finally:
        client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def dataset(ray_client: TestClient, scifact_small: Any) -> str:
    return str(upload(ray_client, scifact_dataset(scifact_small))["id"])


def _submit(client: TestClient, dataset: str, **extra: Any) -> str:
    body = {"source_model": MINILM, "target_model": MPNET, "dataset": dataset, **extra}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_a_job_trains_as_a_ray_task(ray_client: TestClient, dataset: str) -> None:
    job = wait_job(ray_client, _submit(ray_client, dataset, resources={"cpus": 1}), timeout=120)
    assert job["status"] == "succeeded", job
    assert job["result"]["worker"]["engine"] == "ray"
    assert job["result"]["worker"]["pid"] != os.getpid()
    assert job["resources"] == {"cpus": 1, "gpus": 0}
    assert ray_client.get("/v1/info").json()["jobs"]["engine"] == "ray"


def test_a_cancelled_ray_job_stops_its_task(ray_client: TestClient, dataset: str) -> None:
    job_id = _submit(ray_client, dataset, method="mlp", options={**SLOW_MLP, "max_epochs": 100000})
    wait_job(ray_client, job_id, until=_training, timeout=120)
    r = ray_client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelling", r.text
    asked = time.monotonic()
    job = wait_job(ray_client, job_id, timeout=60)
    assert job["status"] == "cancelled", job
    assert time.monotonic() - asked < 5.0 + 2.0  # within the grace period (and a poll)
    deadline = time.monotonic() + 10
    while _ray_task_pids(job_id):  # the task stopped: no worker keeps training
        assert time.monotonic() < deadline, _ray_task_pids(job_id)
        time.sleep(0.1)


def test_a_ray_worker_killed_once_is_retried_by_ray(ray_client: TestClient, dataset: str) -> None:
    job_id = _submit(ray_client, dataset, method="mlp", options=SLOW_MLP)
    wait_job(ray_client, job_id, until=_training, timeout=120)
    killed = _kill_the_task(job_id)
    job = wait_job(ray_client, job_id, timeout=180)
    assert job["status"] == "succeeded", job
    assert job["result"]["worker"]["pid"] != killed  # trained by the second Ray worker


def test_a_ray_worker_killed_twice_fails_the_job_with_a_reason(
    ray_client: TestClient, dataset: str
) -> None:
    job_id = _submit(ray_client, dataset, method="mlp", options=SLOW_MLP)
    wait_job(ray_client, job_id, until=_training, timeout=120)
    first = _kill_the_task(job_id)
    wait_job(
        ray_client,
        job_id,
        until=lambda job: _training(job) and first not in _ray_task_pids(job_id),
        timeout=120,
    )
    _kill_the_task(job_id)
    job = wait_job(ray_client, job_id, timeout=120)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "worker_crashed"
    assert "Ray worker died twice" in job["error"]["message"]
