"""Keep one replica's registry in step with the stitches every replica trained.

The job store is the source of truth: a stitch is served when the job that trained it
succeeded and its result says it is served and not deleted
(:meth:`~service.jobs.store.JobStore.succeeded_stitches`). :class:`StitchWatcher` reads
that every ``interval_s`` seconds in its own daemon thread and

* registers each such stitch this registry lacks, loaded from the
  :class:`~service.jobs.stitch_store.StitchStore` (oldest job first, so "the newest job"
  keeps its meaning for routing), with ``origin="job"``;
* removes each ``origin="job"`` entry whose record is deleted, not served or gone (and
  drops this machine's cached copy of it).

Nothing is registered while the configured stitches load (they come first). A stitch
that fails to load is logged once and tried again later, after a wait that
doubles up to :attr:`StitchWatcher.max_backoff_s`; nothing stops the thread. Loading
happens in the watcher's thread, so translation never waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from lead.errors import ConflictError, StitchNotFoundError
from service.jobs.records import StitchState
from service.jobs.stitch_store import StitchStore
from service.jobs.store import JobStore
from service.registry import StitchRegistry

__all__ = ["StitchWatcher", "SyncReport"]

logger = logging.getLogger("lead.jobs")

#: How often the watcher's thread looks whether the configured stitches are in (seconds).
_LOADING_POLL_S = 0.05


@dataclass(frozen=True)
class SyncReport:
    """What one pass of :meth:`StitchWatcher.sync` changed."""

    registered: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # could not be loaded (tried again later)


@dataclass
class _Failure:
    message: str
    attempts: int
    retry_at: float  # time.monotonic()


class StitchWatcher:
    """Register and remove job-trained stitches as the job store says.

    Parameters
    ----------
    store : JobStore
        The job records every replica shares.
    stitch_store : StitchStore
        Where the trained stitches are published.
    registry : StitchRegistry
        This replica's served stitches.
    interval_s : float
        Seconds between two passes of the thread (``LEAD_STITCH_POLL_SECONDS``); also the
        first wait before a stitch that failed to load is tried again.

    Notes
    -----
    Stop the watcher before closing ``store``: the thread holds its own connection.
    """

    #: The longest wait (seconds) before trying again a stitch that failed to load.
    max_backoff_s = 60.0

    def __init__(
        self,
        store: JobStore,
        stitch_store: StitchStore,
        registry: StitchRegistry,
        interval_s: float,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.store = store
        self.stitch_store = stitch_store
        self.registry = registry
        self.interval_s = float(interval_s)
        self._failures: dict[str, _Failure] = {}
        self._pass_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pass_error: str | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Start the polling thread (a daemon; call :meth:`sync` first for start-up)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lead-stitch-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for a pass in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        # a pass as soon as the configured stitches are in (a pass skips until then), not
        # up to an interval later: /readyz waits for the stitches published at start-up
        while self.registry.loading:
            if self._stop.wait(_LOADING_POLL_S):
                return
        self._pass()
        while not self._stop.wait(self.interval_s):
            self._pass()

    def _pass(self) -> None:
        """:meth:`sync`, a failure logged once (the next pass tries again)."""
        try:
            self.sync()
        except Exception as error:  # the job store unreachable, say: try again next pass
            message = f"{type(error).__name__}: {error}"
            if message != self._pass_error:
                logger.exception("stitch watcher pass failed (tried again every pass)")
            self._pass_error = message
        else:
            if self._pass_error is not None:
                logger.info("stitch watcher passes work again")
            self._pass_error = None

    # ------------------------------------------------------------------------- pass
    def sync(self) -> SyncReport:
        """One pass, in the calling thread: register new stitches, remove gone ones.

        Returns
        -------
        SyncReport
            The ids registered, removed, and those that failed to load in this pass.

        Raises
        ------
        Exception
            Whatever reading the job store raises; a stitch that fails to load does not
            raise (it is in ``failed`` and logged once).
        """
        with self._pass_lock:
            if self.registry.loading:
                # the configured stitches first: they, not a job's, bind each model's
                # dimension (a job stitch of 8-d MiniLM vectors, registered first, made
                # every bundled stitch fail to load after a restart)
                return SyncReport()
            states = self.store.succeeded_stitches()
            report = SyncReport()
            for entry in self.registry.entries():
                state = states.get(entry.id)
                gone = state is None or (state.finished and (not state.served or state.deleted))
                if entry.origin == "job" and gone:  # not one that its job is still registering
                    self._remove(entry.id, report)
            wanted = self.wanted(states)
            self.registry.stop_awaiting(set(wanted))
            for stitch_id in wanted:
                if stitch_id not in self.registry:
                    self._register(stitch_id, report)
            for stitch_id in set(self._failures) - set(wanted):
                del self._failures[stitch_id]  # deleted meanwhile: stop trying
            return report

    @staticmethod
    def wanted(states: dict[str, StitchState]) -> list[str]:
        """The ids of ``states`` (:meth:`JobStore.succeeded_stitches`) to serve: finished,
        served and not deleted."""
        return [i for i, s in states.items() if s.finished and s.served and not s.deleted]

    def _remove(self, stitch_id: str, report: SyncReport) -> None:
        try:
            self.registry.remove(stitch_id)
        except StitchNotFoundError:  # removed meanwhile (DELETE through this replica)
            return
        try:
            self.stitch_store.evict(stitch_id)
        except Exception:
            logger.exception("could not drop the local copy of stitch %s", stitch_id)
        report.removed.append(stitch_id)
        logger.info("stitch %s is no longer served (its job record says so)", stitch_id)

    def _register(self, stitch_id: str, report: SyncReport) -> None:
        from lead.artifacts import load_stitch

        failure = self._failures.get(stitch_id)
        now = time.monotonic()
        if failure is not None and now < failure.retry_at:
            return
        try:
            folder = self.stitch_store.local_folder(stitch_id)
            stitch = load_stitch(
                folder,
                device=self.registry.device,
                dtype=torch.float32,  # the registry decides the serving precision
            )
            self.registry.register(stitch_id, stitch, origin="job", folder=folder)
        except Exception as error:
            if isinstance(error, ConflictError) and stitch_id in self.registry:
                return  # registered meanwhile by the replica that trained it
            error_type, detail = type(error).__name__, str(getattr(error, "message", None) or error)
            self.registry.await_failed(stitch_id, error_type, detail)
            message = f"{error_type}: {detail}"
            attempts = 1 if failure is None else failure.attempts + 1
            wait = min(self.interval_s * 2 ** (attempts - 1), self.max_backoff_s)
            self._failures[stitch_id] = _Failure(message, attempts, now + wait)
            report.failed.append(stitch_id)
            if failure is None or failure.message != message:
                logger.warning(
                    "trained stitch %s could not be served from %s (%s); trying again later",
                    stitch_id,
                    self.stitch_store.url,
                    message,
                )
            return
        if failure is not None:
            logger.info("trained stitch %s is served now", stitch_id)
            del self._failures[stitch_id]
        report.registered.append(stitch_id)
