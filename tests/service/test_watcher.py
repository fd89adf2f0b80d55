"""StitchWatcher: replicas sharing one job store and one stitch store serve the same stitches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lead.artifacts import load_stitch, save_stitch
from lead.batch_invariance import forward_batch_invariant
from lead.fitting import fit_stitch
from lead.stitches import StitchInfo
from service.jobs.stitch_store import FolderStore, FsspecStore, StitchStore
from service.jobs.store import JobStore, new_id
from service.jobs.watcher import StitchWatcher, SyncReport
from service.registry import StitchRegistry

STITCH = "minilm-to-mpnet"


@dataclass
class Replica:
    """One server's view: its own job store connection, registry and watcher."""

    jobs: JobStore
    registry: StitchRegistry
    watcher: StitchWatcher

    def output(self, stitch_id: str, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.registry.get(stitch_id).stitch(x)


def queue(jobs: JobStore, stitch_id: str) -> Any:
    """A queued job that will train ``stitch_id`` (its JobRecord)."""
    return jobs.create_job(
        job_id=new_id("job"),
        request={"source_model": "a", "target_model": "b"},
        data_path=f"job-data/{stitch_id}.safetensors",
        dataset_id=None,
        pairs=400,
        stitch_id=stitch_id,
    )


def publish(
    jobs: JobStore,
    stitches: StitchStore,
    stitch_id: str,
    folder: Path | None,
    *,
    served: bool = True,
) -> str:
    """What a replica does when a job trains ``stitch_id``: put its folder (None: no files
    in the store), store the outcome, mark the job succeeded. Returns the job id."""
    job = queue(jobs, stitch_id)
    claimed = jobs.claim_next("replica", lease_s=60)
    assert claimed is not None and claimed.id == job.id
    if folder is not None:
        stitches.put(stitch_id, folder)
    result = {"stitch_id": stitch_id, "served": served}
    assert jobs.set_outcome(job.id, scorecard={}, result=result, owner="replica")
    assert jobs.finish_job(job.id, "succeeded", owner="replica")
    return job.id


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Callable[..., Replica]]:
    """``replicas(stitch_store, interval_s=...)``: a replica on the shared SQLite file."""
    made: list[Replica] = []

    def make(stitch_store: StitchStore, interval_s: float = 0.05) -> Replica:
        jobs = JobStore(tmp_path / "lead.sqlite3")
        registry = StitchRegistry(torch.device("cpu"))
        replica = Replica(jobs, registry, StitchWatcher(jobs, stitch_store, registry, interval_s))
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.watcher.stop()
        replica.jobs.close()


@pytest.fixture
def x(queries: Any) -> torch.Tensor:
    return torch.from_numpy(queries["minilm"][:8])


def test_a_stitch_trained_by_one_replica_is_served_by_the_other(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any, x: torch.Tensor
) -> None:
    shared = FolderStore(tmp_path / "shared-stitches")
    a, b = replicas(shared), replicas(shared)
    publish(a.jobs, shared, "s1", fitted.folder(STITCH))
    assert a.watcher.sync().registered == ["s1"]
    assert "s1" not in b.registry
    report = b.watcher.sync()
    assert report.registered == ["s1"] and not report.removed and not report.failed
    entry = b.registry.get("s1")
    assert entry.origin == "job" and entry.folder == shared.local_folder("s1")
    assert torch.equal(b.output("s1", x), a.output("s1", x))  # bit-identical
    with torch.inference_mode():
        assert torch.equal(b.output("s1", x), load_stitch(fitted.folder(STITCH))(x))
    assert b.watcher.sync().registered == []  # nothing new: nothing registered again
    assert b.registry.get("s1").sequence == entry.sequence

    a.jobs.mark_stitch_deleted("s1")  # DELETE /v1/stitches/s1 through replica a
    shared.delete("s1")
    assert a.watcher.sync().removed == ["s1"]
    assert b.watcher.sync().removed == ["s1"]
    assert "s1" not in a.registry and "s1" not in b.registry
    assert b.watcher.sync().registered == []  # a deleted stitch is not registered again


def test_a_replica_with_an_fsspec_store_loads_its_own_copy(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any, x: torch.Tensor
) -> None:
    import fsspec

    url = f"memory://lead-test-{new_id('w')}/stitches"
    try:
        trainer = FsspecStore(url, tmp_path / "cache-a")
        b = replicas(FsspecStore(url, tmp_path / "cache-b"))
        publish(b.jobs, trainer, "s1", fitted.folder(STITCH))
        assert b.watcher.sync().registered == ["s1"]
        folder = b.registry.get("s1").folder
        assert folder is not None and folder.is_relative_to(tmp_path / "cache-b")
        with torch.inference_mode():
            assert torch.equal(b.output("s1", x), load_stitch(fitted.folder(STITCH))(x))
        b.jobs.mark_stitch_deleted("s1")
        trainer.delete("s1")
        assert b.watcher.sync().removed == ["s1"]
        assert not folder.exists()  # the watcher dropped this replica's copy
    finally:
        fsspec.filesystem("memory").rm(
            url.removeprefix("memory:/").rsplit("/", 1)[0], recursive=True
        )


def test_only_served_stitches_are_registered_oldest_job_first(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any
) -> None:
    shared = FolderStore(tmp_path / "shared-stitches")
    a = replicas(shared)
    publish(a.jobs, shared, "newer-name-older-job", fitted.folder(STITCH))
    publish(a.jobs, shared, "a-newer-job", fitted.folder("minilm-to-mpnet-raw"))
    below_baseline = publish(a.jobs, shared, "not-served", fitted.folder(STITCH), served=False)
    assert a.jobs.get_job(below_baseline).status == "succeeded"
    b = replicas(shared)
    assert b.watcher.sync().registered == ["newer-name-older-job", "a-newer-job"]
    assert "not-served" not in b.registry
    older, newer = b.registry.get("newer-name-older-job"), b.registry.get("a-newer-job")
    assert older.sequence < newer.sequence  # "the newest job" keeps its meaning for routing


def test_job_entries_without_a_record_are_removed_configured_ones_kept(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any
) -> None:
    a = replicas(FolderStore(tmp_path / "shared-stitches"))
    stitch = load_stitch(fitted.folder(STITCH))
    a.registry.register("configured", stitch, origin="local")
    a.registry.register("no-record", stitch, origin="job")
    assert a.watcher.sync().removed == ["no-record"]
    assert [e.id for e in a.registry.entries()] == ["configured"]


def test_a_stitch_its_job_is_still_registering_is_kept(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any
) -> None:
    """The replica that trained a stitch registers it, then marks the job succeeded: a
    watcher pass in between removed it, and a client that then saw ``succeeded`` got 404
    (found as a CI flake of tests/lead/test_client.py)."""
    shared = FolderStore(tmp_path / "shared-stitches")
    a = replicas(shared)
    job = queue(a.jobs, "pending")
    assert a.jobs.claim_next("replica", lease_s=60) is not None
    shared.put("pending", fitted.folder(STITCH))
    assert a.jobs.set_outcome(job.id, scorecard={}, result={"served": True}, owner="replica")
    a.registry.register("pending", load_stitch(fitted.folder(STITCH)), origin="job")
    report = a.watcher.sync()  # the job is still running
    assert report.removed == [] and report.registered == []
    assert "pending" in a.registry
    b = replicas(shared)
    assert b.watcher.sync().registered == []  # other replicas wait for the job to finish
    assert a.jobs.finish_job(job.id, "succeeded", owner="replica")
    assert b.watcher.sync().registered == ["pending"]
    assert a.watcher.sync().removed == []


def test_a_stitch_that_fails_to_load_is_logged_once_and_tried_again(
    replicas: Callable[..., Replica],
    tmp_path: Path,
    fitted: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = FolderStore(tmp_path / "shared-stitches")
    a = replicas(shared, interval_s=0.5)
    # served, but its files are not in the store (yet): a broken or lagging shared store
    publish(a.jobs, shared, "late", None)
    with caplog.at_level(logging.WARNING, logger="lead.jobs"):
        assert a.watcher.sync().failed == ["late"]
        assert a.watcher.sync().failed == []  # waiting: not tried on every pass
        time.sleep(0.6)
        assert a.watcher.sync().failed == ["late"]  # tried again after the wait
    warnings = [r for r in caplog.records if "late" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "StitchNotFoundError" in warnings[0].getMessage()
    shared.put("late", fitted.folder(STITCH))
    time.sleep(1.1)  # the wait doubled to 1 s after the second failure
    assert a.watcher.sync().registered == ["late"]


def test_the_thread_picks_up_and_drops_stitches_within_seconds(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any, x: torch.Tensor
) -> None:
    shared = FolderStore(tmp_path / "shared-stitches")
    a, b = replicas(shared), replicas(shared, interval_s=0.05)
    b.watcher.start()
    assert b.watcher.running
    publish(a.jobs, shared, "s1", fitted.folder(STITCH))
    deadline = time.monotonic() + 5.0
    while "s1" not in b.registry:
        assert time.monotonic() < deadline, "the watcher did not register s1 within 5 s"
        time.sleep(0.02)
    with torch.inference_mode():
        assert torch.equal(b.output("s1", x), load_stitch(fitted.folder(STITCH))(x))
    a.jobs.mark_stitch_deleted("s1")
    shared.delete("s1")
    deadline = time.monotonic() + 5.0
    while "s1" in b.registry:
        assert time.monotonic() < deadline, "the watcher did not remove s1 within 5 s"
        time.sleep(0.02)
    b.watcher.stop()
    assert not b.watcher.running


def test_configured_stitches_load_before_job_stitches_bind_a_model(
    replicas: Callable[..., Replica], tmp_path: Path, fitted: Any
) -> None:
    """A job stitch of 8-d vectors named after the configured stitch's 384-d source model,
    registered first at start-up, made every configured stitch of that model fail ("gives
    model ... dimension 384, but another stitch gives it 8"). The watcher waits for the
    configured stitches; the job stitch is then the one that cannot be served."""
    configured = load_stitch(fitted.folder(STITCH))
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(60, 8)), rng.normal(size=(60, 6))
    info = StitchInfo(source_model=configured.info.source_model, target_model="org/other")
    squatter = save_stitch(fit_stitch(X, Y, "ridge", info=info), tmp_path / "squatter")
    shared = FolderStore(tmp_path / "shared-stitches")
    a = replicas(shared)
    publish(a.jobs, shared, "squatter", squatter)
    b = replicas(shared)
    b.registry.expect(["configured"])
    assert b.watcher.sync() == SyncReport()  # still loading: nothing yet
    b.registry.register("configured", configured, origin="local")
    b.registry.finish_loading()
    assert b.watcher.sync().failed == ["squatter"]
    assert [e.id for e in b.registry.entries()] == ["configured"]


def test_a_translation_only_replica_serves_the_stitches_the_others_train(
    make_client: Callable[..., Any], tmp_path: Path, fitted: Any, x: torch.Tensor
) -> None:
    """LEAD_ENABLE_JOBS=false on a replica sharing the job store: it registered no trained
    stitch at all (the watcher lived with the job runner), so translating with one was a
    404 there and 200 on the training replica. Now it serves and follows them, and runs
    nothing: a queued job stays queued."""
    data = tmp_path / "data"
    data.mkdir()
    jobs = JobStore(data / "lead.sqlite3")  # the training replica's view (default layout)
    shared = FolderStore(data / "stitches")
    try:
        publish(jobs, shared, "s1", fitted.folder(STITCH))
        client = make_client(enable_jobs=False, data_dir=str(data), stitch_poll_seconds=0.05)

        def served() -> set[str]:
            return {s["id"] for s in client.get("/v1/stitches").json()["data"]}

        assert "s1" in served()  # at start-up
        publish(jobs, shared, "s2", fitted.folder(STITCH))
        deadline = time.monotonic() + 5.0
        while "s2" not in served():
            assert time.monotonic() < deadline, "s2 was not served within 5 s"
            time.sleep(0.05)
        r = client.post("/v1/translate", json={"stitch": "s2", "input": x.tolist()})
        assert r.status_code == 200, r.text
        with torch.inference_mode():  # the server's forward: the same bytes for any batch
            want = forward_batch_invariant(load_stitch(fitted.folder(STITCH)), x).numpy()
        got = np.array([row["embedding"] for row in r.json()["data"]], dtype=np.float32)
        np.testing.assert_array_equal(got, want)

        queued = queue(jobs, "q")
        jobs.mark_stitch_deleted("s1")
        shared.delete("s1")
        deadline = time.monotonic() + 5.0
        while "s1" in served():
            assert time.monotonic() < deadline, "s1 was still served 5 s after its deletion"
            time.sleep(0.05)
        assert jobs.get_job(queued.id).status == "queued"  # no runner here
        assert client.post("/v1/jobs", json={}).status_code == 503
    finally:
        jobs.close()
