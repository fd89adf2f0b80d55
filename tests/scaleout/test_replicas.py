"""Two replicas share one PostgreSQL job store, train on one Ray cluster and publish to one
stitch store: a job submitted through either is one job, trained on Ray, served by both;
a replica killed with SIGKILL loses nothing; mixed traffic over both gives no 5xx.

Real parts only, started by the tests (see ``conftest.py``). ``LEAD_SCALEOUT_SECONDS``
sets the length of the traffic test (default 60).
"""

from __future__ import annotations

import base64
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from scripts._harness import Server, alive
from tests.scaleout.conftest import LEASE_S, Cluster, get_json
from tests.service.jobs_helpers import OCTET, dataset_bytes

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}
SERVED_WITHIN_S = 5.0
BUNDLED = "minilm-to-pml3"


@pytest.fixture(scope="module")
def replicas(cluster: Cluster) -> list[Server]:
    return [cluster.replica("a"), cluster.replica("b")]


@pytest.fixture(scope="module")
def dataset(replicas: list[Server], scifact_small: Any) -> Iterator[dict[str, Any]]:
    """The SciFact fixture's MiniLM → paraphrase-MiniLM-L3 pairs, uploaded through A."""
    sf = scifact_small
    data = dataset_bytes(sf.corpus["minilm"], sf.corpus["pml3"], metadata={"name": "scaleout"})
    r = httpx.post(replicas[0].url + "/v1/datasets", content=data, headers=OCTET, timeout=60)
    assert r.status_code == 201, r.text
    yield {
        "id": r.json()["id"],
        "source_model": sf.models["minilm"],
        "target_model": sf.models["pml3"],
        "vectors": sf.corpus["minilm"],
    }


def _job_body(dataset: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "source_model": dataset["source_model"],
        "target_model": dataset["target_model"],
        "dataset": dataset["id"],
        **extra,
    }


def _wait(server: Server, job_id: str, until: Any = None, timeout: float = 240) -> dict[str, Any]:
    done = until or (lambda job: job["status"] in TERMINAL)
    deadline = time.monotonic() + timeout
    while True:
        job = get_json(server, f"/v1/jobs/{job_id}")
        if done(job):
            return job
        assert time.monotonic() < deadline, f"job did not get there in {timeout} s: {job}"
        time.sleep(0.1)


def _stitch_ids(server: Server) -> set[str]:
    return {s["id"] for s in get_json(server, "/v1/stitches")["data"]}


def _served(server: Server, stitch_id: str) -> bool:
    return stitch_id in _stitch_ids(server)


def _translate(server: Server, stitch_id: str, vectors: np.ndarray) -> list[str]:
    body = {
        "stitch": stitch_id,
        "input": [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors],
        "encoding_format": "base64",
    }
    r = httpx.post(server.url + "/v1/translate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return [row["embedding"] for row in r.json()["data"]]


def _wait_served(servers: list[Server], stitch_id: str, since: float) -> float:
    """Seconds from ``since`` until every server lists ``stitch_id``."""
    while not all(_served(s, stitch_id) for s in servers):
        assert time.monotonic() - since < SERVED_WITHIN_S, f"{stitch_id} not served by all"
        time.sleep(0.05)
    return time.monotonic() - since


def test_a_job_through_both_replicas_is_one_job_trained_on_ray_and_served_by_both(
    cluster: Cluster, replicas: list[Server], dataset: dict[str, Any]
) -> None:
    a, b = replicas
    body = _job_body(dataset, method="ridge", stitch_id="scaleout-ridge")
    key = {"Idempotency-Key": "scaleout-one-job"}
    first = httpx.post(b.url + "/v1/jobs", json=body, headers=key, timeout=30)
    again = httpx.post(a.url + "/v1/jobs", json=body, headers=key, timeout=30)
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    rows = cluster.sql("SELECT count(*) FROM jobs WHERE idempotency_key = 'scaleout-one-job'")
    assert rows == [(1,)]

    job = _wait(a, first.json()["id"])
    finished = time.monotonic()
    assert job["status"] == "succeeded", job
    worker = job["result"]["worker"]
    assert worker["engine"] == "ray"
    assert worker["pid"] not in {a.pid, b.pid, *a.children(), *b.children()}  # a Ray worker
    seconds = _wait_served([a, b], "scaleout-ridge", finished)
    print(f"served by both replicas {seconds:.2f} s after success")
    rows = dataset["vectors"][:16]
    assert _translate(a, "scaleout-ridge", rows) == _translate(b, "scaleout-ridge", rows)


@pytest.mark.parametrize(
    ("resources", "param"),
    [({"gpus": 0.5}, "resources.gpus"), ({"cpus": 64}, "resources.cpus")],
)
def test_resources_no_node_has_are_refused_by_every_replica(
    cluster: Cluster,
    replicas: list[Server],
    dataset: dict[str, Any],
    resources: dict[str, Any],
    param: str,
) -> None:
    """A Ray task no node can run would stay pending forever, its job ``running``."""
    before = cluster.sql("SELECT count(*) FROM jobs")
    for server in replicas:
        body = _job_body(dataset, method="ridge", resources=resources)
        r = httpx.post(server.url + "/v1/jobs", json=body, timeout=30)
        assert r.status_code == 400, r.text  # as resources.gpus on a server without Ray
        error = r.json()["error"]
        assert error["param"] == param and "no node of the Ray cluster has" in error["message"]
    assert cluster.sql("SELECT count(*) FROM jobs") == before


def test_resources_the_cluster_has_still_train(
    replicas: list[Server], dataset: dict[str, Any]
) -> None:
    body = _job_body(dataset, method="ridge", resources={"cpus": 2})
    r = httpx.post(replicas[1].url + "/v1/jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job = _wait(replicas[0], r.json()["id"])
    assert job["status"] == "succeeded", job
    assert job["resources"] == {"cpus": 2, "gpus": 0}


def test_a_replica_killed_while_its_job_trains_loses_nothing(
    cluster: Cluster, replicas: list[Server], dataset: dict[str, Any]
) -> None:
    slow = {"hidden_dim": 16, "batch_size": 64, "max_epochs": 1500, "patience": 100000}
    body = _job_body(dataset, method="mlp", options=slow, stitch_id="scaleout-mlp")
    r = httpx.post(replicas[0].url + "/v1/jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]

    def training(job: dict[str, Any]) -> bool:
        return job["progress"]["stage"] == "train" and job["progress"]["step"] >= 1

    _wait(replicas[1], job_id, until=training)
    ((owner,),) = cluster.sql("SELECT owner FROM jobs WHERE id = %s", (job_id,))
    pid = int(owner.split("/")[1])
    victim = next(s for s in replicas if s.pid == pid)  # the replica that runs the job
    survivor = next(s for s in replicas if s is not victim)
    victim.kill9()
    assert not alive(pid)

    job = _wait(survivor, job_id)
    finished = time.monotonic()
    assert job["status"] == "succeeded", job
    assert job["attempts"] in (1, 2)  # 2: the lease ran out and the survivor trained it again
    _wait_served([survivor], "scaleout-mlp", finished)
    assert cluster.sql("SELECT count(*) FROM jobs WHERE status IN ('running', 'cancelling')") == [
        (0,)
    ]
    replicas[replicas.index(victim)] = cluster.replica(f"restarted-{victim.port}")
    time.sleep(LEASE_S)


def _traffic(
    servers: list[Server], dataset: dict[str, Any], seconds: float
) -> tuple[Counter[int], list[str], list[str]]:
    """32 clients over both replicas: 28 translate, 4 submit and watch jobs."""
    statuses: Counter[int] = Counter()
    jobs: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    vectors = dataset["vectors"]

    def record(r: httpx.Response) -> None:
        with lock:
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                errors.append(f"{r.request.method} {r.request.url.path}: {r.text[:200]}")

    def translator(index: int) -> None:
        rng = random.Random(index)
        with httpx.Client(base_url=servers[index % 2].url, timeout=30) as client:
            while time.monotonic() < stop:
                rows = vectors[rng.sample(range(len(vectors)), rng.choice((1, 1, 1, 32)))]
                body = {"stitch": BUNDLED, "input": rows.tolist()}
                record(client.post("/v1/translate", json=body))

    def submitter(index: int) -> None:
        rng = random.Random(100 + index)
        n = 0
        while time.monotonic() < stop:
            n += 1
            home, other = servers[(index + n) % 2], servers[(index + n + 1) % 2]
            body = _job_body(dataset, method=rng.choice(("ridge", "procrustes")))
            key = {"Idempotency-Key": f"traffic-{index}-{n}"}
            r = httpx.post(home.url + "/v1/jobs", json=body, headers=key, timeout=30)
            record(r)
            if r.status_code != 202:
                continue
            job_id = r.json()["id"]
            with lock:
                jobs.append(job_id)
            if rng.random() < 0.3:  # a client retrying through the other replica
                twin = httpx.post(other.url + "/v1/jobs", json=body, headers=key, timeout=30)
                record(twin)
                assert twin.json()["id"] == job_id
            if rng.random() < 0.15:
                record(httpx.post(f"{other.url}/v1/jobs/{job_id}/cancel", timeout=30))
            while time.monotonic() < stop:
                r = httpx.get(f"{other.url}/v1/jobs/{job_id}", timeout=30)
                record(r)
                if r.status_code != 200 or r.json()["status"] in TERMINAL:
                    break
                time.sleep(0.2)

    def client(index: int) -> None:
        try:
            (submitter if index % 8 == 7 else translator)(index)
        except Exception as exc:  # a connection refused or reset: a replica failed
            with lock:
                errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses, jobs, errors


def _job_gauges(server: Server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    found = re.finditer(r'^lead_jobs\{status="(\w+)"\} (\S+)$', text, re.M)
    return {m[1]: float(m[2]) for m in found}


def _all_jobs(server: Server) -> list[dict[str, Any]]:
    jobs, after = [], None
    while True:
        page = get_json(server, "/v1/jobs?limit=100" + (f"&after={after}" if after else ""))
        jobs += page["data"]
        if not page["has_more"]:
            return jobs
        after = page["last_id"]


def test_mixed_traffic_over_both_replicas_has_no_5xx_and_loses_no_job(
    cluster: Cluster, replicas: list[Server], dataset: dict[str, Any]
) -> None:
    seconds = float(os.environ.get("LEAD_SCALEOUT_SECONDS", "60"))
    statuses, created, errors = _traffic(replicas, dataset, seconds)
    total = sum(statuses.values())
    print(f"{total} requests in {seconds:.0f} s: {dict(statuses)}; {len(created)} jobs")
    assert not errors, errors[:5]
    assert created and statuses[200] > 0
    for job_id in created:
        _wait(replicas[0], job_id, timeout=300)
    settled = time.monotonic()
    a_jobs, b_jobs = _all_jobs(replicas[0]), _all_jobs(replicas[1])
    assert a_jobs == b_jobs  # one store: both replicas list the same records
    listed = Counter(job["id"] for job in a_jobs)
    assert all(listed[job_id] == 1 for job_id in created)  # none lost, none twice
    assert cluster.sql(
        "SELECT count(*) FROM jobs WHERE status <> ALL(%s)", (sorted(TERMINAL),)
    ) == [(0,)]
    for job in a_jobs:
        assert job["status"] in TERMINAL
        assert job["started_at"] is None or job["started_at"] <= job["finished_at"]
        if job["status"] == "succeeded":
            assert job["scorecard"] is not None and job["result"]["stitch_id"] == job["stitch_id"]
            assert 1 <= job["attempts"] <= 2
        elif job["status"] == "failed":
            assert job["error"]["message"]
    gauges = [_job_gauges(server) for server in replicas]  # one store: the same counts
    assert gauges[0] == gauges[1] and sum(gauges[0].values()) == len(a_jobs)
    # every replica serves every trained stitch (a stitch below the mean-estimator baseline
    # is kept but served by none: result.served false)
    served = {
        j["stitch_id"] for j in a_jobs if j["status"] == "succeeded" and j["result"]["served"]
    }
    assert served
    while True:
        missing = {s.url: sorted(served - _stitch_ids(s)) for s in replicas}
        if not any(missing.values()):
            break
        assert time.monotonic() - settled < SERVED_WITHIN_S, missing
        time.sleep(0.1)
