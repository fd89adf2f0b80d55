"""The training worker: a separate (spawned) process that runs one job at a time.

:func:`worker_main` is the process entry point: it limits torch's threads, lowers its CPU
priority (so translation in the server process stays fast), opens its own SQLite
connection, and then runs the jobs its runner sends it. :func:`run_job` is one job:

1. load the pairs, split them with :func:`lead.splits.holdout_split` (the job's
   ``holdout_fraction`` and ``seed``);
2. fit on the training rows with :func:`lead.fit_stitch`, reporting progress to SQLite and
   stopping (:class:`~lead.errors.JobCancelledError`) once the job is ``cancelling``;
3. score on the held-out rows with :func:`lead.scorecard.score_stitch`, and calibrate the
   per-vector confidence head on them (:func:`lead.confidence.attach_confidence`; none
   with fewer than 50 held-out rows);
4. save the stitch, publish it to the stitch store (``LEAD_STITCH_STORE``, by default
   ``LEAD_DATA_DIR/stitches/<stitch_id>``, atomically) and store the scorecard, with
   the serving decision (:func:`serving_decision`): a stitch whose held-out R² is at or
   below the mean-estimator baseline is kept but neither served nor pushed, unless the job
   set ``allow_below_baseline``;
5. push it to the Hub when asked (and served).

A failure is stored as ``{code, message}``; the runner, told through the event queue,
registers a successful stitch in the server (when ``result.served``) and marks the job
``succeeded``.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import connection, parent_process
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import numpy as np

from lead.errors import JobCancelledError, LeadError
from service.jobs.layout import DataLayout
from service.jobs.stitch_store import StitchStore, open_stitch_store
from service.jobs.store import JobRecord, JobStore

__all__ = ["BASELINE_R2", "WorkerConfig", "run_job", "serving_decision", "worker_main"]

logger = logging.getLogger("lead.jobs.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker process needs (picklable: it crosses the spawn boundary).

    Attributes
    ----------
    data_dir : str
        ``LEAD_DATA_DIR`` (a Ray worker on another machine uses a temporary folder).
    database : str
        The job store: ``LEAD_DATABASE_URL`` or the SQLite file's path.
    stitch_store : str or None
        ``LEAD_STITCH_STORE`` (None: ``data_dir/stitches``).
    owner : str
        The owner id of the runner whose jobs this worker runs; every store write names it.
    engine : str
        ``"process"`` or ``"ray"``: where the job trains (recorded in its result).
    torch_threads : int
        ``torch.set_num_threads`` in the worker.
    nice : int
        Added to the worker's CPU niceness (0 keeps the server's priority).
    hf_token : str or None
        Token for :func:`lead.artifacts.push_stitch`.
    progress_interval_s : float
        Least time between two progress writes / cancellation checks.
    """

    data_dir: str
    database: str = ""
    stitch_store: str | None = None
    owner: str = ""
    engine: str = "process"
    torch_threads: int = 1
    nice: int = 10
    hf_token: str | None = None
    progress_interval_s: float = 0.2


class _Progress:
    """The progress callback: throttled writes to SQLite, and the cancellation check."""

    def __init__(self, store: JobStore, job_id: str, owner: str, interval_s: float) -> None:
        self.store, self.job_id, self.owner, self.interval_s = store, job_id, owner, interval_s
        self._stage: str | None = None
        self._last = 0.0

    def __call__(self, stage: str, step: int, total: int) -> None:
        now = time.monotonic()
        if stage == self._stage and step < total and now - self._last < self.interval_s:
            return
        self._stage, self._last = stage, now
        self.store.update_progress(self.job_id, stage, step, total, owner=self.owner)
        self.check()

    def check(self) -> None:
        """Raise :class:`JobCancelledError` unless the job is still ``running`` here."""
        job = self.store.get_job(self.job_id)
        if job.status != "running" or job.owner != self.owner:
            raise JobCancelledError(f"job {self.job_id} is {job.status}; training stopped")


def _error(exc: BaseException) -> dict[str, str]:
    """The job's ``error``: a :class:`LeadError`'s code and message; a write that found the
    disk full is ``insufficient_storage`` (not an internal error naming the server's
    paths); anything else ``internal_error``."""
    from service.errors import kind_of, storage_full  # the one exception → code table

    full = storage_full(exc)
    if full is not None:
        exc = full
    if isinstance(exc, LeadError):
        return {"code": kind_of(exc).code, "message": exc.message}
    return {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}


def _unit_rows(vectors: np.ndarray) -> bool:
    """Whether every row of ``vectors`` (n, d) has unit L2 norm (to 1e-3)."""
    norms = np.linalg.norm(vectors.astype(np.float64, copy=False), axis=1)
    return bool(np.allclose(norms, 1.0, atol=1e-3))


#: Held-out R² of the mean-estimator baseline: predicting the training target mean for
#: every row scores exactly 0 (``lead.metrics.r2_score`` with that mean as reference).
BASELINE_R2 = 0.0


def serving_decision(scorecard: dict[str, Any], request: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether a job's stitch is served (and pushed), and if not, why.

    Parameters
    ----------
    scorecard : dict
        The held-out scorecard (:meth:`lead.Scorecard.to_dict`), with ``r2_score``.
    request : dict
        The stored job request; ``allow_below_baseline`` (default false) serves the stitch
        whatever its score.

    Returns
    -------
    served : bool
        False when the held-out ``r2_score`` is at or below :data:`BASELINE_R2` (no
        better than answering the training mean) and the job did not allow it.
    reason : str or None
        A sentence for the job's ``result.not_served_reason`` when not served.
    """
    from lead.scorecard import below_baseline_cause

    r2 = float(scorecard["r2_score"])
    if r2 > BASELINE_R2 or request.get("allow_below_baseline", False):
        return True, None
    return False, (
        f"held-out r2_score {r2:.3g} is at or below the mean-estimator baseline "
        f"({BASELINE_R2:g}): the stitch predicts the target no better than the training "
        f"mean. {below_baseline_cause(scorecard)}. To serve it anyway, submit the job again "
        "with allow_below_baseline: true (lead jobs submit --allow-below-baseline)"
    )


def _retrieval_data(data: Any, test_idx: Any, holdout_fraction: float) -> Any:
    """The retrieval part of the held-out scorecard (None without query tensors).

    Raises
    ------
    InvalidInputError
        No query has a document judged relevant among the held-out documents: checked
        before training (the job trained first, then failed).
    """
    from lead.scorecard import RetrievalData
    from service.jobs.datasets import check_judged_held_out

    if data.retrieval is None:
        return None
    r = data.retrieval
    held_out = check_judged_held_out(r, test_idx, holdout_fraction)
    return RetrievalData(
        target_queries=r["target_queries"],
        source_queries=r["source_queries"],
        query_ids=r["query_ids"],
        corpus_ids=held_out,
        qrels=r["qrels"],
    )


def _push(folder: Path, repo_id: str, token: str | None) -> dict[str, Any]:
    from lead.artifacts import push_stitch

    if not token:
        return {
            "status": "failed",
            "repo_id": repo_id,
            "reason": "no Hugging Face token configured (LEAD_HF_TOKEN); the stitch is kept here",
        }
    try:
        pushed = push_stitch(folder, repo_id, token=token)
    except LeadError as exc:
        return {"status": "failed", "repo_id": repo_id, "reason": exc.message}
    except Exception as exc:  # the push never fails the job; the stitch is kept locally
        return {"status": "failed", "repo_id": repo_id, "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "succeeded", "repo_id": repo_id, "stitch": pushed}


def run_job(
    store: JobStore,
    stitches: StitchStore,
    layout: DataLayout,
    job: JobRecord,
    config: WorkerConfig,
) -> str:
    """Run one claimed (``running``) job to its end; return its outcome.

    Every store write names ``config.owner``: a job taken from this worker (its lease ran
    out and another server claimed it) is left alone.

    Returns
    -------
    str
        ``"succeeded"`` (stitch published, scorecard stored; the runner finishes the job),
        ``"failed"`` or ``"cancelled"`` (already stored).
    """
    from lead.artifacts import save_stitch
    from lead.confidence import (
        MIN_HELD_OUT_ROWS,
        attach_confidence,
        no_confidence_reason,
        note_no_confidence,
    )
    from lead.fitting import fit_stitch
    from lead.scorecard import score_stitch
    from lead.splits import holdout_split
    from lead.stitches import StitchInfo
    from service.jobs.datasets import load_paired

    request, owner = job.request, config.owner
    progress = _Progress(store, job.id, owner, config.progress_interval_s)
    try:
        progress("loading", 0, 1)
        data = load_paired(layout.local_file(store, job.data_path))
        train_idx, test_idx = holdout_split(
            data.source.shape[0], request["holdout_fraction"], request["seed"]
        )
        retrieval = _retrieval_data(data, test_idx, request["holdout_fraction"])
        Y_train = data.target[train_idx]
        info = StitchInfo(
            source_model=request["source_model"],
            target_model=request["target_model"],
            source_normalized=_unit_rows(data.source),
            target_normalized=_unit_rows(data.target),
        )
        info.fit = {"data": request.get("dataset") or "inline", "job_id": job.id}
        stitch = fit_stitch(
            data.source[train_idx],
            Y_train,
            request["method"],
            info=info,
            seed=request["seed"],
            progress=progress,
            **request["options"],
        )
        progress("scoring", 0, 1)
        card = score_stitch(
            stitch,
            data.source[test_idx],
            data.target[test_idx],
            target_train_mean=Y_train.mean(axis=0),  # as `lead fit` / `lead score` do
            retrieval=retrieval,
        ).to_dict()
        stitch.info.scorecard = card
        stitch.info.fit["holdout_fraction"] = request["holdout_fraction"]
        report = attach_confidence(  # per-vector confidence, calibrated on the held-out rows
            stitch,
            data.source[train_idx],
            Y_train,
            data.source[test_idx],
            data.target[test_idx],
            seed=request["seed"],
        )
        if report is None and len(test_idx) < MIN_HELD_OUT_ROWS:
            share = request["holdout_fraction"]
            fewest = math.ceil(MIN_HELD_OUT_ROWS / share) if share > 0 else None
            hint = f"send at least {fewest} pairs or " if fewest else ""
            note_no_confidence(
                stitch,
                f"{no_confidence_reason(stitch)} (the job held out {share:g} of its "
                f"{len(data.source)} pairs; {hint}raise holdout_fraction)",
            )
        progress("saving", 0, 1)
        progress.check()
        with layout.scratch(f"stitch-{job.stitch_id}") as scratch:
            folder = scratch / job.stitch_id
            save_stitch(stitch, folder)
            stitches.put(job.stitch_id, folder)  # a retried attempt replaces its own copy
        repo_id = request.get("push_to_hub")
        served, reason = serving_decision(card, request)
        result: dict[str, Any] = {
            "stitch_id": job.stitch_id,
            "served": served,
            "not_served_reason": reason,
            "push": None,
            "worker": {"engine": config.engine, "host": socket.gethostname(), "pid": os.getpid()},
        }
        if repo_id:
            result["push"] = (
                {"status": "pending", "repo_id": repo_id}
                if served
                else {"status": "skipped", "repo_id": repo_id, "reason": f"not served: {reason}"}
            )
        if not store.set_outcome(job.id, scorecard=card, result=result, owner=owner):
            # settled or taken meanwhile: the published copy is another attempt's to replace
            raise JobCancelledError(f"job {job.id} is no longer running here")
        if repo_id and served:
            progress("pushing", 0, 1)
            result["push"] = _push(stitches.local_folder(job.stitch_id), repo_id, config.hf_token)
            store.set_outcome(job.id, scorecard=card, result=result, owner=owner)
        return "succeeded"
    except JobCancelledError:
        store.finish_job(job.id, "cancelled", owner=owner)
        return "cancelled"
    except Exception as exc:
        error = _error(exc)
        if error["code"] == "internal_error":
            logger.error("job %s failed:\n%s", job.id, traceback.format_exc())
        elif not isinstance(exc, LeadError):  # the disk is full: no traceback
            logger.error("job %s failed: %s (%s)", job.id, error["message"], exc)
        store.finish_job(job.id, "failed", error=error, owner=owner)
        return "failed"


def _exit_with_parent() -> None:
    """Exit at once when the server process dies (so no orphan keeps writing files)."""
    parent = parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        connection.wait([sentinel])
        os._exit(3)

    threading.Thread(target=watch, name="lead-parent-watch", daemon=True).start()


def worker_main(
    config: WorkerConfig, slot: int, tasks: Queue[str | None], events: Queue[tuple[Any, ...]]
) -> None:
    """Entry point of a worker process: run the jobs sent on ``tasks`` until ``None``.

    Each job id arrives already claimed (``running``) by the runner; the worker answers
    ``("finished", slot, job_id, outcome)`` on ``events``.
    """
    _exit_with_parent()
    # The server decides when workers stop (it kills them at shutdown and queues their jobs
    # again): Ctrl-C, or a SIGTERM sent to the whole process group (systemd's default
    # KillMode, `kill -- -PGID`), must not end a job before the server can. A worker killed
    # by SIGTERM was taken for a crash and its job failed for good.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if config.nice:
        os.nice(config.nice)
    import torch

    import lead.training  # noqa: F401  (import the heavy modules before the first job)

    torch.set_num_threads(max(1, config.torch_threads))
    layout = DataLayout(Path(config.data_dir))
    store = JobStore(config.database or layout.db)
    stitches = open_stitch_store(config.stitch_store, layout.root, config.hf_token)
    events.put(("ready", slot, os.getpid()))
    while (job_id := tasks.get()) is not None:
        try:
            outcome = run_job(store, stitches, layout, store.get_job(job_id), config)
        except Exception:  # the store itself failed; the runner marks the job failed
            logger.error("job %s crashed the worker loop:\n%s", job_id, traceback.format_exc())
            outcome = "crashed"
        events.put(("finished", slot, job_id, outcome))
