"""Run training jobs outside the event loop: the :class:`Runner` protocol and a process pool.

:class:`ProcessRunner` keeps up to ``workers`` worker processes, started with the ``spawn``
method (never ``fork``: the server holds threads, sockets and torch state that a forked
child must not inherit). A worker is spawned when the first job needs it and then stays,
so torch is imported once per worker rather than once per job. A supervisor thread in the
server process

- claims queued jobs (``queued`` → ``running`` in SQLite) and hands each to an idle worker;
- on a worker's ``finished`` event, calls ``on_succeeded`` (which registers the new stitch
  for translation, unless the job's result says it is not served) *before* marking the job
  ``succeeded``, so a client that sees the status can translate with the stitch in its next
  request;
- replaces a worker that died (its job is ``failed`` with the code ``worker_crashed``; a
  worker that dies before it is ready is restarted after a growing delay, up to 30 s), and
  kills one that ignores a cancellation for ``cancel_grace_s`` seconds.

Spawned workers re-import the ``__main__`` module of the server process, as every ``spawn``
child does: a script that starts the app must guard it with ``if __name__ == "__main__":``
(the ``uvicorn`` and ``pytest`` entry points need nothing).

The routes only use :class:`Runner` (``submit``, ``cancel``, ``start``, ``stop``), so a queue
engine such as RQ can replace this class without touching them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any, Protocol

from service.jobs.layout import DataLayout
from service.jobs.store import JobRecord, JobStore
from service.jobs.worker import WorkerConfig, worker_main

__all__ = ["OnSucceeded", "ProcessRunner", "Runner"]

logger = logging.getLogger("lead.jobs.runner")

#: Called in the supervisor thread with a job whose stitch is saved; registers the stitch.
OnSucceeded = Callable[[JobRecord], None]

_TICK_S = 0.05
_INTERRUPTED = {
    "code": "interrupted",
    "message": "the server stopped while the job was running; submit it again",
}


class Runner(Protocol):
    """Executes queued jobs; job state lives in the :class:`~service.jobs.store.JobStore`."""

    def start(self) -> None:
        """Start executing (threads, connections; workers may start later)."""

    def stop(self) -> None:
        """Stop executing; jobs still running are ``failed`` with ``interrupted``."""

    def submit(self, job_id: str) -> None:
        """Execute a ``queued`` job when capacity allows."""

    def cancel(self, job_id: str) -> None:
        """Stop a job that the store already marked ``cancelling``."""


@dataclass
class _Slot:
    """One worker process with its own task and event queues (a killed worker can corrupt
    a queue it was writing to, so no queue is shared between workers)."""

    process: BaseProcess
    tasks: Queue[str | None]
    events: Queue[tuple[Any, ...]]
    job_id: str | None = None
    cancel_deadline: float | None = None
    ready: bool = False

    def close(self) -> None:
        """Close the queues and release the (exited) process."""
        for q in (self.tasks, self.events):
            q.close()
            q.cancel_join_thread()
        self.process.close()


class ProcessRunner:
    """A pool of spawned worker processes, one job each at a time.

    Parameters
    ----------
    store : JobStore
        The job records (shared with the routes).
    config : WorkerConfig
        What each worker needs (data dir, torch threads, niceness, Hub token).
    workers : int, default 1
        Jobs that train at once.
    on_succeeded : callable, optional
        ``on_succeeded(job)`` for a job whose stitch is saved; if it raises, the job fails
        with ``registration_failed`` and the stitch folder is removed.
    cancel_grace_s : float, default 10
        Seconds a running job has to stop after a cancellation before its worker is killed.
    """

    def __init__(
        self,
        store: JobStore,
        config: WorkerConfig,
        *,
        workers: int = 1,
        on_succeeded: OnSucceeded | None = None,
        cancel_grace_s: float = 10.0,
    ) -> None:
        self.store, self.config, self.workers = store, config, max(1, workers)
        self.on_succeeded = on_succeeded
        self.cancel_grace_s = cancel_grace_s
        self.layout = DataLayout(Path(config.data_dir))
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot | None] = []
        self._respawn_at: dict[int, float] = {}
        self._crash_streak = 0
        self._pending: deque[str] = deque()
        self._cancels: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ protocol
    def start(self) -> None:
        """Start the supervisor thread; workers are spawned when jobs arrive."""
        self._stopping.clear()
        self._slots = [None] * self.workers
        self._thread = threading.Thread(target=self._supervise, name="lead-job-runner", daemon=True)
        self._thread.start()

    def submit(self, job_id: str) -> None:
        """Queue a job id; the supervisor hands it to the next idle worker."""
        with self._lock:
            self._pending.append(job_id)

    def cancel(self, job_id: str) -> None:
        """Start the grace period of a job being cancelled (the worker checks the store)."""
        with self._lock:
            self._cancels.add(job_id)

    def stop(self) -> None:
        """Stop the supervisor and kill the workers; running jobs become ``interrupted``.

        Workers are killed rather than asked to finish: a job may train for hours, and an
        idle worker holds nothing that needs a clean exit.
        """
        if not self._halt():
            return
        for slot in self._live_slots():
            if slot.job_id is not None:
                self.store.finish_job(slot.job_id, "failed", error=_INTERRUPTED)
        self._close()

    # --------------------------------------------------------------- extra
    def kill(self) -> None:
        """Kill every worker at once, as a crash would, leaving the store untouched (tests)."""
        if self._halt():
            self._close()

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for monitoring and tests)."""
        return [s.process.pid for s in self._live_slots() if s.process.pid is not None]

    # ---------------------------------------------------------- internals
    def _live_slots(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot is not None]

    def _halt(self) -> bool:
        """Stop the supervisor thread; False if the runner was not running."""
        if self._thread is None:
            return False
        self._stopping.set()
        self._thread.join()
        self._thread = None
        return True

    def _close(self) -> None:
        """Kill and reap every worker, close its queues."""
        for slot in self._live_slots():
            if slot.process.is_alive():
                slot.process.kill()
            slot.process.join()
            slot.close()
        self._slots = []

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

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            try:
                self._drain_events()
                self._replace_dead_workers()
                self._enforce_cancellations()
                self._dispatch()
            except Exception:  # keep supervising; a failing store is logged, not fatal
                logger.exception("job runner supervisor error")
                self._stopping.wait(0.5)

    def _drain_events(self) -> None:
        handled = 0
        for slot in self._live_slots():
            while True:
                try:
                    event = slot.events.get_nowait()
                except (queue.Empty, OSError, EOFError):
                    break
                self._handle(slot, event)
                handled += 1
        if not handled:
            self._stopping.wait(_TICK_S)

    def _handle(self, slot: _Slot, event: tuple[Any, ...]) -> None:
        if event[0] == "ready":
            slot.ready, self._crash_streak = True, 0
            return
        _, _, job_id, outcome = event
        if slot.job_id == job_id:
            slot.job_id, slot.cancel_deadline = None, None
        with self._lock:
            self._cancels.discard(job_id)
        if outcome == "succeeded":
            self._finalize(job_id)
        elif outcome == "crashed":
            self.store.finish_job(
                job_id,
                "failed",
                error={"code": "internal_error", "message": "the training worker failed"},
            )

    def _finalize(self, job_id: str) -> None:
        job = self.store.get_job(job_id)
        try:
            self.store.update_progress(job_id, "registering", 0, 1)
            if self.on_succeeded is not None:
                self.on_succeeded(job)
        except Exception as exc:
            logger.exception("could not register the stitch of job %s", job_id)
            shutil.rmtree(self.layout.stitch_dir(job.stitch_id), ignore_errors=True)
            self.store.finish_job(
                job_id,
                "failed",
                error={"code": "registration_failed", "message": f"{type(exc).__name__}: {exc}"},
            )
            return
        self.store.update_progress(job_id, "done", 1, 1)
        self.store.finish_job(job_id, "succeeded")

    def _replace_dead_workers(self) -> None:
        for index, slot in enumerate(self._slots):
            if slot is None or slot.process.is_alive():
                continue
            code = slot.process.exitcode
            self._drain_events()  # a job that finished just before the exit
            if slot.job_id is not None:
                cancelled = slot.cancel_deadline is not None
                self.store.finish_job(
                    slot.job_id,
                    "cancelled" if cancelled else "failed",
                    error=None
                    if cancelled
                    else {
                        "code": "worker_crashed",
                        "message": f"the training process exited unexpectedly (code {code})",
                    },
                )
            if not slot.ready:  # died while starting: back off before the next try
                self._crash_streak += 1
            delay = min(30.0, 0.5 * 2**self._crash_streak) if self._crash_streak else 0.0
            logger.warning("job worker %d exited (code %s); restart in %.1f s", index, code, delay)
            slot.close()
            self._slots[index] = None
            self._respawn_at[index] = time.monotonic() + delay

    def _enforce_cancellations(self) -> None:
        with self._lock:
            cancels = set(self._cancels)
        now = time.monotonic()
        for slot in self._live_slots():
            if slot.job_id is None or slot.job_id not in cancels:
                continue
            if slot.cancel_deadline is None:
                slot.cancel_deadline = now + self.cancel_grace_s
            elif now > slot.cancel_deadline and slot.process.is_alive():
                logger.warning("job %s ignored its cancellation; killing its worker", slot.job_id)
                slot.process.kill()
                slot.process.join()  # _replace_dead_workers marks it cancelled

    def _next_pending(self) -> str | None:
        with self._lock:
            return self._pending.popleft() if self._pending else None

    def _dispatch(self) -> None:
        """Hand pending jobs to idle workers, spawning workers as needed."""
        for index, slot in enumerate(self._slots):
            if not self._pending:
                return
            if slot is None:
                if time.monotonic() < self._respawn_at.get(index, 0.0):
                    continue
                slot = self._slots[index] = self._spawn(index)
            if slot.job_id is not None or not slot.process.is_alive():
                continue
            while (job_id := self._next_pending()) is not None:
                if self.store.claim_job(job_id):
                    slot.job_id = job_id
                    slot.tasks.put(job_id)
                    break
                with self._lock:  # cancelled while queued
                    self._cancels.discard(job_id)
