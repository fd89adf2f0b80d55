"""Helpers of the job store tests: a queued job, and threads released together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from service.jobs.store import JobRecord, JobStore, new_id


def add_job(store: JobStore, stitch_id: str | None = None, **kwargs: Any) -> JobRecord:
    """A queued job with its own stitch id (unless given)."""
    job_id = new_id("job")
    return store.create_job(
        job_id=job_id,
        request={"method": "ridge", "seed": 0},
        data_path=f"job-data/{job_id}.safetensors",
        dataset_id=kwargs.pop("dataset_id", None),
        pairs=50,
        stitch_id=stitch_id or f"s-{job_id[4:16]}",
        **kwargs,
    )


def race(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` for i in range(n) on n threads released together; each thread's return
    value or exception."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = work(i)
        except Exception as exc:  # collected for the test to check
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out
