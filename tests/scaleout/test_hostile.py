"""A careless client against two replicas on PostgreSQL and Ray: jobs asking what the
cluster lacks are refused (a Ray task no node can run stayed pending forever, its job
``running``). Real parts only (see ``conftest.py``)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from scripts._harness import Server
from tests.scaleout.conftest import Cluster
from tests.service.jobs_helpers import OCTET, dataset_bytes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicas(cluster: Cluster) -> list[Server]:
    return [cluster.replica("a"), cluster.replica("b")]


@pytest.fixture(scope="module")
def dataset(replicas: list[Server], scifact_small: Any) -> dict[str, Any]:
    sf = scifact_small
    data = dataset_bytes(sf.corpus["minilm"], sf.corpus["pml3"])
    r = httpx.post(replicas[0].url + "/v1/datasets", content=data, headers=OCTET, timeout=60)
    assert r.status_code == 201, r.text
    return {
        "dataset": r.json()["id"],
        "source_model": sf.models["minilm"],
        "target_model": sf.models["pml3"],
        "method": "ridge",
    }


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
    for server in replicas:
        r = httpx.post(server.url + "/v1/jobs", json={**dataset, "resources": resources})
        assert r.status_code == 400, r.text  # as resources.gpus on a server without Ray
        error = r.json()["error"]
        assert error["param"] == param and "no node of the Ray cluster has" in error["message"]
    assert cluster.sql("SELECT count(*) FROM jobs WHERE status <> 'succeeded'") == [(0,)]


def test_resources_the_cluster_has_still_train(
    replicas: list[Server], dataset: dict[str, Any]
) -> None:
    r = httpx.post(replicas[1].url + "/v1/jobs", json={**dataset, "resources": {"cpus": 2}})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    for _ in range(1200):
        job = httpx.get(f"{replicas[0].url}/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.1)
    assert job["status"] == "succeeded", job
