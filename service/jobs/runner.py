"""Run training jobs outside the event loop: the :class:`Runner` protocol and the lease loop
every runner shares.

A runner never trusts its own memory for what to run: the job store is the queue. Any
number of runners (one per server process, on any number of machines) share one store:

- a runner with a free slot **claims** the oldest queued job (``queued`` → ``running`` with
  its owner id and a lease, :meth:`~service.jobs.store.JobStore.claim_next`; on
  PostgreSQL with ``SKIP LOCKED``, so no job is claimed twice);
- it **renews** the leases of its running jobs every third of the lease; a job whose lease
  it could not renew was taken away from it (its lease ran out meanwhile) and is stopped;
- every runner **reaps** jobs whose lease ran out or whose owner process is gone
  (:meth:`~service.jobs.store.JobStore.reap`): queued again until they have been started
  ``max_attempts`` times, then ``failed`` with the code ``interrupted``; a runner that
  stops gracefully hands its jobs back queued, their attempts given back;
- a cancellation asked through any server (``cancelling`` in the store) is seen within half
  a second; the job has ``cancel_grace_s`` seconds to stop itself before it is killed;
- on a job's success, ``on_succeeded`` (which registers the stitch for translation) runs
  *before* the job is marked ``succeeded``, so a client that sees the status can translate
  with the stitch in its next request to this server (other servers register it within
  ``LEAD_STITCH_POLL_SECONDS``).

:class:`~service.jobs.process_runner.ProcessRunner` runs jobs in spawned processes,
:class:`~service.jobs.ray_runner.RayRunner` as Ray tasks; they only say how a job is
started, polled and stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from lead.errors import InvalidInputError
from service.jobs.store import JobRecord, JobStore, owner_id

__all__ = ["JobLoop", "OnSucceeded", "Outcome", "Runner"]

logger = logging.getLogger("lead.jobs.runner")

#: Called in the runner's thread with a job whose stitch is published; registers the stitch.
OnSucceeded = Callable[[JobRecord], None]
#: What a finished attempt reports: (job id, ``succeeded`` | ``failed`` | ``cancelled`` |
#: ``crashed``, a message for ``crashed``).
Outcome = tuple[str, str, str | None]

_TICK_S = 0.05
_STATUS_EVERY_S = 0.5
#: How often the runner removes what jobs finished elsewhere left (``on_sweep``).
_SWEEP_EVERY_S = 30.0


class Runner(Protocol):
    """Executes queued jobs; job state lives in the :class:`~service.jobs.store.JobStore`."""

    def start(self) -> None:
        """Start executing (threads, connections; workers may start later)."""

    def stop(self) -> None:
        """Stop executing; jobs still running are queued again (or failed ``interrupted``)."""

    def submit(self, job_id: str) -> None:
        """A job was queued: look for work now rather than at the next poll."""

    def cancel(self, job_id: str) -> None:
        """Stop a job that the store already marked ``cancelling``."""


class JobLoop:
    """The claim / lease / reap / cancel loop, in one supervisor thread.

    Subclasses implement :meth:`_free_slots`, :meth:`_launch`, :meth:`_poll`,
    :meth:`_abort` and :meth:`_close`, and may override :meth:`_ask_to_stop`.

    Parameters
    ----------
    store : JobStore
        The shared job records.
    on_succeeded : callable, optional
        ``on_succeeded(job)`` for a job whose stitch is published; if it raises, the job
        fails with ``registration_failed``.
    lease_s : float, default 15
        Lease of a running job (``LEAD_JOB_LEASE_SECONDS``).
    max_attempts : int, default 2
        Starts of a job at most (``LEAD_JOB_MAX_ATTEMPTS``).
    cancel_grace_s : float, default 10
        Seconds a job has to stop after a cancellation before it is killed.
    poll_s : float, default 1
        How often to look for jobs queued through other servers.
    on_sweep : callable, optional
        ``on_sweep()`` after this runner settles jobs and every :data:`_SWEEP_EVERY_S`
        seconds (jobs finished elsewhere): removes what finished jobs left (their inline
        pairs). What it raises is logged.
    """

    def __init__(
        self,
        store: JobStore,
        *,
        on_succeeded: OnSucceeded | None = None,
        lease_s: float = 15.0,
        max_attempts: int = 2,
        cancel_grace_s: float = 10.0,
        poll_s: float = 1.0,
        on_sweep: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.on_succeeded = on_succeeded
        self.on_sweep = on_sweep
        self.lease_s, self.max_attempts = lease_s, max_attempts
        self.cancel_grace_s, self.poll_s = cancel_grace_s, poll_s
        self.owner = owner_id()
        self.running: dict[str, float | None] = {}  # job id → cancellation deadline
        self._cancels: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._due: dict[str, float] = {}

    # ------------------------------------------------------------ protocol
    def start(self) -> None:
        """Start the supervisor thread."""
        self._stopping.clear()
        self._wake.set()  # jobs queued before the start
        self._thread = threading.Thread(target=self._supervise, name="lead-job-runner", daemon=True)
        self._thread.start()

    def submit(self, job_id: str) -> None:
        """Look for queued jobs now."""
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        """Start the grace period of a job being cancelled."""
        with self._lock:
            self._cancels.add(job_id)

    def stop(self) -> None:
        """Stop the supervisor and every job of this runner; its running jobs are queued
        again for another server, their attempts given back (a graceful stop does not count
        against ``max_attempts``).
        """
        if not self._halt():
            return
        for job_id in list(self.running):
            self._abort(job_id)
        self.store.release(self.owner)
        self.running.clear()
        self._close()

    def kill(self) -> None:
        """Stop at once as a crash would, leaving the store untouched (tests)."""
        if self._halt():
            for job_id in list(self.running):
                self._abort(job_id)
            self.running.clear()
            self._close()

    # ------------------------------------------------------------- hooks
    def _free_slots(self) -> int:
        """Jobs this runner can start now."""
        raise NotImplementedError

    def _launch(self, job: JobRecord) -> None:
        """Start a claimed job."""
        raise NotImplementedError

    def _poll(self) -> list[Outcome]:
        """Attempts that ended since the last call."""
        raise NotImplementedError

    def _ask_to_stop(self, job_id: str) -> None:
        """A cancellation began (the job also sees it in the store at its next check)."""

    def _abort(self, job_id: str) -> None:
        """Kill a job's execution now (its store writes are owner-guarded)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Release workers and connections."""
        raise NotImplementedError

    # ---------------------------------------------------------- internals
    def _halt(self) -> bool:
        """Stop the supervisor thread; False if the runner was not running."""
        if self._thread is None:
            return False
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        self._thread = None
        return True

    def _every(self, name: str, seconds: float) -> bool:
        """True at most once per ``seconds`` for each ``name``."""
        now = time.monotonic()
        if now < self._due.get(name, 0.0):
            return False
        self._due[name] = now + seconds
        return True

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            try:
                self._tick()
            except Exception:  # keep supervising; a failing store is logged, not fatal
                logger.exception("job runner supervisor error")
                self._stopping.wait(0.5)

    def _tick(self) -> None:
        settled = False
        for job_id, outcome, message in self._poll():
            self._settle(job_id, outcome, message)
            settled = True
        if self.on_sweep is not None and (settled or self._every("sweep", _SWEEP_EVERY_S)):
            self.on_sweep()
        if self.running and self._every("renew", self.lease_s / 3):
            kept = self.store.renew_leases(self.owner, list(self.running), self.lease_s)
            for job_id in set(self.running) - kept:
                logger.warning("job %s was taken from this server (lease lost); stopping", job_id)
                self._abort(job_id)
                self.running.pop(job_id, None)
        if self.running and self._every("status", _STATUS_EVERY_S):
            statuses = self.store.active_statuses(list(self.running))
            with self._lock:
                self._cancels |= {j for j, s in statuses.items() if s == "cancelling"}
        self._enforce_cancellations()
        reap = self._every("reap", self.lease_s / 3)
        if reap and any(job.status == "queued" for job in self.store.reap(self.max_attempts)):
            self._wake.set()
        if self._wake.is_set() or self._every("claim", self.poll_s):
            self._wake.clear()
            self._dispatch()
        self._stopping.wait(_TICK_S)

    def _dispatch(self) -> None:
        while self._free_slots() > 0 and not self._stopping.is_set():
            job = self.store.claim_next(self.owner, self.lease_s)
            if job is None:
                return
            self.running[job.id] = None
            try:
                self._launch(job)
            except InvalidInputError as exc:  # the job asks what this runner cannot give
                logger.warning("job %s cannot start: %s", job.id, exc.message)
                self.running.pop(job.id, None)
                error = {"code": "resources_unavailable", "message": exc.message}
                self.store.finish_job(job.id, "failed", error=error, owner=self.owner)
            except Exception as exc:
                logger.exception("could not start job %s", job.id)
                self.running.pop(job.id, None)
                self.store.finish_job(
                    job.id,
                    "failed",
                    error={"code": "internal_error", "message": f"could not start: {exc}"},
                    owner=self.owner,
                )

    def _enforce_cancellations(self) -> None:
        with self._lock:
            cancels = self._cancels & set(self.running)
            self._cancels &= set(self.running)
        now = time.monotonic()
        for job_id in cancels:
            deadline = self.running[job_id]
            if deadline is None:
                self.running[job_id] = now + self.cancel_grace_s
                self._ask_to_stop(job_id)
            elif now > deadline:
                logger.warning("job %s ignored its cancellation; killing it", job_id)
                self._abort(job_id)
                self.running.pop(job_id, None)
                self.store.finish_job(job_id, "cancelled", owner=self.owner)

    def _settle(self, job_id: str, outcome: str, message: str | None) -> None:
        cancelling = self.running.pop(job_id, None) is not None
        with self._lock:
            self._cancels.discard(job_id)
        if outcome == "succeeded":
            self._finalize(job_id)
        elif outcome == "crashed" or (outcome == "cancelled" and cancelling):
            self.store.finish_job(
                job_id,
                "cancelled" if cancelling else "failed",
                error=None if cancelling else {"code": "worker_crashed", "message": message or ""},
                owner=self.owner,
            )

    def _finalize(self, job_id: str) -> None:
        job = self.store.get_job(job_id)
        if job.owner != self.owner or job.status not in ("running", "cancelling"):
            return  # settled elsewhere meanwhile (its lease ran out)
        try:
            self.store.update_progress(job_id, "registering", 0, 1, owner=self.owner)
            if self.on_succeeded is not None:
                self.on_succeeded(job)
        except Exception as exc:
            logger.exception("could not register the stitch of job %s", job_id)
            message = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
            # the result recorded by the training said "served": it is not (nor kept)
            result = {
                **(job.result or {}),
                "served": False,
                "not_served_reason": f"the stitch could not be registered: {message}",
            }
            self.store.finish_job(
                job_id,
                "failed",
                error={"code": "registration_failed", "message": message},
                result=result,
                owner=self.owner,
            )
            return
        self.store.update_progress(job_id, "done", 1, 1, owner=self.owner)
        self.store.finish_job(job_id, "succeeded", owner=self.owner)
