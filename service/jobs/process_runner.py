"""Training jobs in worker processes spawned by this server (``LEAD_RAY_ADDRESS`` unset).

:class:`ProcessRunner` keeps up to ``workers`` worker processes, started with the ``spawn``
method (never ``fork``: the server holds threads, sockets and torch state that a forked
child must not inherit). A worker is spawned when the first job needs it and then stays,
so torch is imported once per worker rather than once per job. A worker that dies fails its
job with the code ``worker_crashed`` (one that dies before it is ready is restarted after a
growing delay, up to 30 s).

Spawned workers re-import the ``__main__`` module of the server process, as every ``spawn``
child does: a script that starts the app must guard it with ``if __name__ == "__main__":``
(the ``uvicorn`` and ``pytest`` entry points need nothing).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

from service.jobs.runner import JobLoop, OnSucceeded, Outcome
from service.jobs.store import JobRecord, JobStore
from service.jobs.worker import WorkerConfig, worker_main

__all__ = ["ProcessRunner"]

logger = logging.getLogger("lead.jobs.runner")


@dataclass
class _Slot:
    """One worker process with its own task and event queues (a killed worker can corrupt
    a queue it was writing to, so no queue is shared between workers)."""

    process: BaseProcess
    tasks: Queue[str | None]
    events: Queue[tuple[Any, ...]]
    job_id: str | None = None
    ready: bool = False

    def close(self) -> None:
        """Close the queues and release the (exited) process."""
        for q in (self.tasks, self.events):
            q.close()
            q.cancel_join_thread()
        self.process.close()


class ProcessRunner(JobLoop):
    """A pool of spawned worker processes, one job each at a time.

    Parameters
    ----------
    store : JobStore
        The job records (shared with the routes).
    config : WorkerConfig
        What each worker needs (data dir, database, stitch store, torch threads, ...).
    workers : int, default 1
        Jobs that train at once.
    **loop : Any
        ``on_succeeded``, ``lease_s``, ``max_attempts``, ``cancel_grace_s``, ``poll_s`` of
        :class:`~service.jobs.runner.JobLoop`.
    """

    def __init__(
        self,
        store: JobStore,
        config: WorkerConfig,
        *,
        workers: int = 1,
        on_succeeded: OnSucceeded | None = None,
        **loop: Any,
    ) -> None:
        super().__init__(store, on_succeeded=on_succeeded, **loop)
        self.config = dataclasses.replace(config, owner=self.owner)
        self.workers = max(1, workers)
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot | None] = [None] * self.workers
        self._respawn_at: dict[int, float] = {}
        self._crash_streak = 0

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for monitoring and tests)."""
        return [s.process.pid for s in self._live_slots() if s.process.pid is not None]

    # --------------------------------------------------------------- hooks
    def _free_slots(self) -> int:
        now = time.monotonic()
        return sum(
            1
            for index, slot in enumerate(self._slots)
            if (slot is None and now >= self._respawn_at.get(index, 0.0))
            or (slot is not None and slot.job_id is None and slot.process.is_alive())
        )

    def _launch(self, job: JobRecord) -> None:
        for index, slot in enumerate(self._slots):
            if slot is None:
                if time.monotonic() < self._respawn_at.get(index, 0.0):
                    continue
                slot = self._slots[index] = self._spawn(index)
            if slot.job_id is None and slot.process.is_alive():
                slot.job_id = job.id
                slot.tasks.put(job.id)
                return
        raise RuntimeError("no idle worker")

    def _poll(self) -> list[Outcome]:
        outcomes = self._drain_events()
        for index, slot in enumerate(self._slots):
            if slot is None or slot.process.is_alive():
                continue
            code = slot.process.exitcode
            outcomes += self._drain_events()  # a job that finished just before the exit
            if slot.job_id is not None:
                message = f"the training process exited unexpectedly (code {code})"
                outcomes.append((slot.job_id, "crashed", message))
            if not slot.ready:  # died while starting: back off before the next try
                self._crash_streak += 1
            delay = min(30.0, 0.5 * 2**self._crash_streak) if self._crash_streak else 0.0
            logger.warning("job worker %d exited (code %s); restart in %.1f s", index, code, delay)
            slot.close()
            self._slots[index] = None
            self._respawn_at[index] = time.monotonic() + delay
        return outcomes

    def _abort(self, job_id: str) -> None:
        for slot in self._live_slots():
            if slot.job_id == job_id and slot.process.is_alive():
                slot.process.kill()
                slot.process.join()
                slot.job_id = None  # the dead slot is replaced at the next poll

    def _close(self) -> None:
        """Kill and reap every worker, close its queues."""
        for slot in self._live_slots():
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join()
            slot.close()
        self._slots = [None] * self.workers

    # ---------------------------------------------------------- internals
    def _live_slots(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot is not None]

    def _spawn(self, index: int) -> _Slot:
        tasks: Queue[str | None] = self._ctx.Queue()
        events: Queue[tuple[Any, ...]] = self._ctx.Queue()
        process = self._ctx.Process(
            target=worker_main,
            args=(self.config, index, tasks, events),
            name=f"lead-job-worker-{index}",
            daemon=True,
        )
        process.start()
        return _Slot(process, tasks, events)

    def _drain_events(self) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for slot in self._live_slots():
            while True:
                try:
                    event = slot.events.get_nowait()
                except (queue.Empty, OSError, EOFError, ValueError):
                    break
                if event[0] == "ready":
                    slot.ready, self._crash_streak = True, 0
                    continue
                _, _, job_id, outcome = event
                if slot.job_id == job_id:
                    slot.job_id = None
                outcomes.append((job_id, outcome, "the training worker failed"))
        return outcomes
