"""Job leases on both backends: claiming, renewing, reaping, releasing, owner-guarded writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter

from store_helpers import add_job, race

from service.jobs.store import JobStore, owner_id, owner_is_dead


def dead_owner() -> str:
    """The owner id of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return f"{socket.gethostname()}/{child.pid}/0000abcd"


def test_owner_ids() -> None:
    mine, other = owner_id(), owner_id()
    assert mine != other and mine.startswith(f"{socket.gethostname()}/{os.getpid()}/")
    assert not owner_is_dead(mine)
    assert owner_is_dead(dead_owner())
    assert not owner_is_dead(f"another-host/{2**22 + 7}/0000abcd")  # only its lease tells
    assert not owner_is_dead("not an owner id") and not owner_is_dead("")


def test_claim_next_takes_the_oldest_queued_job(job_store: JobStore) -> None:
    store = job_store
    first, second = add_job(store), add_job(store)
    store.request_cancel(first.id)
    before = time.time()
    job = store.claim_next("me", lease_s=30)
    assert job is not None and job.id == second.id
    assert (job.status, job.owner, job.attempts, job.stage, job.error) == (
        "running", "me", 1, "starting", None,
    )  # fmt: skip
    assert job.started_at is not None and job.started_at >= before
    assert job.lease_until is not None and before + 29 < job.lease_until < time.time() + 31
    assert store.get_job(job.id) == job
    assert store.claim_next("me", lease_s=30) is None


def test_concurrent_claims_never_share_a_job(job_store: JobStore) -> None:
    store = job_store
    jobs = {add_job(store).id for _ in range(40)}

    def claim_all(i: int) -> list[str]:
        claimed = []
        while (job := store.claim_next(f"runner-{i}", lease_s=30)) is not None:
            claimed.append(job.id)
        return claimed

    out = race(8, claim_all)
    counts = Counter(job_id for claimed in out for job_id in claimed)
    assert set(counts) == jobs and set(counts.values()) == {1}, out
    assert {store.get_job(j).attempts for j in jobs} == {1}


def test_renew_leases_and_active_statuses(job_store: JobStore) -> None:
    store = job_store
    a, b, c = (add_job(store) for _ in range(3))
    held = [store.claim_next("me", lease_s=5) for _ in range(2)]
    assert [j.id for j in held if j] == [a.id, b.id]
    store.request_cancel(b.id)  # cancelling: still held, still renewed
    assert store.renew_leases("me", [a.id, b.id, c.id, "job_nope"], lease_s=60) == {a.id, b.id}
    lease = store.get_job(a.id).lease_until
    assert lease is not None and lease > time.time() + 55
    assert store.renew_leases("someone-else", [a.id], lease_s=600) == set()
    assert store.get_job(a.id).lease_until == lease
    assert store.renew_leases("me", [], lease_s=60) == set()
    store.finish_job(a.id, "succeeded")
    assert store.renew_leases("me", [a.id, b.id], lease_s=60) == {b.id}
    assert store.get_job(a.id).lease_until is None  # a finished job holds no lease
    assert store.active_statuses([a.id, b.id, c.id, "job_nope"]) == {
        a.id: "succeeded", b.id: "cancelling", c.id: "queued",
    }  # fmt: skip
    assert store.active_statuses([]) == {}


def test_reap_retries_fails_cancels_and_keeps_saved_results(job_store: JobStore) -> None:
    store = job_store
    jobs = [add_job(store) for _ in range(6)]
    expired = [store.claim_next("gone", lease_s=-1) for _ in range(4)]
    assert all(expired)
    live = store.claim_next("alive", lease_s=60)
    dead = store.claim_next(dead_owner(), lease_s=60)  # its lease runs, its process does not
    assert live is not None and dead is not None
    retry, cancel, saved, last = (j.id for j in jobs[:4])
    store.request_cancel(cancel)
    store.set_outcome(saved, result={"stitch_id": "s", "push": {"status": "pending",
                                                                  "repo_id": "org/s"}})  # fmt: skip
    # `last` had its last attempt: claim it once more after a first reap
    reaped = {j.id: j for j in store.reap(max_attempts=2)}
    assert set(reaped) == {retry, cancel, saved, last, dead.id}
    assert store.get_job(live.id).status == "running"  # its lease runs: untouched
    again = store.claim_next("gone", lease_s=-1)
    assert again is not None and again.id == retry and again.attempts == 2
    assert (reaped[retry].status, reaped[retry].owner, reaped[retry].lease_until) == (
        "queued", None, None,
    )  # fmt: skip
    assert (reaped[retry].stage, reaped[retry].step, reaped[retry].started_at) == (None, 0, None)
    assert reaped[cancel].status == "cancelled" and reaped[cancel].finished_at is not None
    assert reaped[saved].status == "succeeded" and reaped[saved].result is not None
    assert reaped[saved].result["push"] == {
        "status": "failed", "repo_id": "org/s", "reason": "the server stopped during the upload",
    }  # fmt: skip
    final = {j.id: j for j in store.reap(max_attempts=2)}
    assert set(final) == {retry}
    assert final[retry].status == "failed" and final[retry].error is not None
    assert final[retry].error["code"] == "interrupted"
    assert "lease expired) after 2 attempt(s)" in final[retry].error["message"]
    assert store.reap(max_attempts=2) == []


def test_release_hands_back_a_runners_jobs(job_store: JobStore) -> None:
    store = job_store
    jobs = [add_job(store) for _ in range(4)]
    mine = [store.claim_next("me", lease_s=60) for _ in range(3)]
    other = store.claim_next("other", lease_s=60)
    assert all(mine) and other is not None
    store.request_cancel(jobs[1].id)
    released = {j.id: (j.status, j.attempts) for j in store.release("me")}
    queued = ("queued", 0)  # the attempt given back: a graceful stop is not the job's fault
    assert released == {jobs[0].id: queued, jobs[1].id: ("cancelled", 1), jobs[2].id: queued}
    assert store.get_job(other.id).status == "running"
    # graceful stops never fail a job (two used to: an adversarial pass lost a long training)
    for _ in range(3):
        assert {store.claim_next("me", lease_s=60).id for _ in range(2)} == {  # type: ignore[union-attr]
            jobs[0].id,
            jobs[2].id,
        }
        released = {j.id: (j.status, j.attempts) for j in store.release("me")}
        assert released == {jobs[0].id: queued, jobs[2].id: queued}
    assert store.release("me") == []
    # a run that dies still counts: the first one, its lease gone, is queued; a second fails
    for _ in range(2):
        claimed = store.claim_next("me", lease_s=-1)
        assert claimed is not None and claimed.id == jobs[0].id
        settled = {j.id: j for j in store.reap(max_attempts=2)}
    assert settled[jobs[0].id].status == "failed" and settled[jobs[0].id].attempts == 2


def test_a_runner_whose_job_was_taken_cannot_write_it(job_store: JobStore) -> None:
    store = job_store
    job = add_job(store)
    assert store.claim_next("first", lease_s=-1) is not None
    assert store.update_progress(job.id, "train", 1, 10, owner="first")
    store.reap(max_attempts=2)  # the lease expired: queued again, then claimed by another
    assert store.claim_next("second", lease_s=60) is not None
    assert not store.update_progress(job.id, "train", 9, 10, owner="first")
    assert not store.set_outcome(job.id, result={"by": "first"}, owner="first")
    assert not store.finish_job(job.id, "failed", error={"code": "x", "message": "y"},
                                owner="first")  # fmt: skip
    now = store.get_job(job.id)
    assert (now.status, now.owner, now.stage, now.step, now.result) == (
        "running", "second", "starting", 0, None,
    )  # fmt: skip
    assert store.update_progress(job.id, "train", 5, 10, owner="second")
    assert store.set_outcome(job.id, result={"by": "second"}, owner="second")
    assert store.finish_job(job.id, "succeeded", owner="second")
    assert not store.update_progress(job.id, "train", 6, 10, owner="second")  # finished
    done = store.get_job(job.id)
    assert (done.status, done.result, done.step) == ("succeeded", {"by": "second"}, 5)
