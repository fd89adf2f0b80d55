"""Training jobs as Ray tasks (``LEAD_RAY_ADDRESS``: ``auto``, ``host:port`` or
``ray://host:port``).

Each claimed job is one Ray task, :func:`train_on_ray`, scheduled with the job's
``resources`` (``cpus`` → ``num_cpus`` and torch threads, ``gpus`` → ``num_gpus``, and a
gradient method then trains on ``cuda``). The task opens the job store itself
(``LEAD_DATABASE_URL``), reads the job's data from it, trains, and publishes the stitch to
``LEAD_STITCH_STORE`` (the server's ``LEAD_DATA_DIR/stitches`` when unset, which only a
worker on the same machine can reach): nothing but the job id crosses to the worker.

- A worker or node that dies is retried once by Ray (``max_retries=1``); a second death
  fails the job with ``worker_crashed`` and Ray's reason.
- A cancellation is :func:`ray.cancel` (``KeyboardInterrupt`` in the task), then after the
  grace period ``ray.cancel(force=True)``, which kills the worker process.
- Ray ties a task to the driver that submitted it: when this server dies its tasks die with
  it, the job's lease runs out, and another server claims it again (``max_attempts``).

Every Ray worker needs ``lead`` installed (the ``ray`` extra), as the servers have it. With
Ray on several machines, the database must be PostgreSQL and the stitch store shared.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from lead._ray import check_ray_reachable
from lead.errors import InvalidInputError, StoreError
from service.jobs.layout import DataLayout
from service.jobs.runner import JobLoop, OnSucceeded, Outcome
from service.jobs.stitch_store import open_stitch_store
from service.jobs.store import JobRecord, JobStore
from service.jobs.worker import WorkerConfig, run_job

__all__ = ["RayRunner", "train_on_ray"]

logger = logging.getLogger("lead.jobs.runner")


def _with_device(request: dict[str, Any], device: str) -> dict[str, Any]:
    """The request with ``options.device`` set when the method trains with torch (mlp, ...)
    and the job did not choose a device itself."""
    from lead.fitting import check_method_options

    options = dict(request["options"])
    if "device" in options:
        return request
    try:
        check_method_options(request["method"], {**options, "device": device})
    except InvalidInputError:  # a closed-form method: no device option
        return request
    return {**request, "options": {**options, "device": device}}


def _asked(resources: dict[str, Any] | None) -> tuple[int, float]:
    """(CPUs, GPUs) a job asks for (``resources`` of its request; 1 CPU by default)."""
    resources = resources or {}
    return int(resources.get("cpus", 1)), float(resources.get("gpus", 0))


def train_on_ray(config: WorkerConfig, job_id: str, threads: int) -> str:
    """One attempt of a job, inside a Ray worker; returns its outcome (see
    :func:`service.jobs.worker.run_job`).

    Parameters
    ----------
    config : WorkerConfig
        The submitting server's worker config (database URL, stitch store, owner id).
    job_id : str
        A job that the server claimed (``running``, owned by ``config.owner``).
    threads : int
        torch threads (the task's ``num_cpus``).
    """
    import ray
    import torch

    torch.set_num_threads(max(1, threads))
    root = Path(config.data_dir)  # the server's: on its machine the data files are there
    if not (root.is_dir() and os.access(root, os.W_OK)):  # elsewhere they come from the store
        root = Path(tempfile.gettempdir()) / f"lead-ray-worker-{os.getuid()}"
    layout = DataLayout(root)
    layout.prepare()
    store = JobStore(config.database or layout.db)
    try:
        stitches = open_stitch_store(config.stitch_store, layout.root, config.hf_token)
        job = store.get_job(job_id)
        if ray.get_gpu_ids():
            job = dataclasses.replace(job, request=_with_device(job.request, "cuda"))
        return run_job(store, stitches, layout, job, config)
    finally:
        store.close()


class RayRunner(JobLoop):
    """Runs each job as a Ray task on the cluster at ``address``.

    Parameters
    ----------
    store : JobStore
        The job records (shared with the routes).
    config : WorkerConfig
        Sent with every task (the database URL and stitch store say where to work).
    address : str
        ``ray.init(address=...)``: ``auto``, ``host:port``, ``ray://host:port`` or ``local``
        (a cluster of this process alone).
    workers : int, default 1
        Jobs of this server in flight at once (Ray queues them by resources beyond that).
    **loop : Any
        ``lease_s``, ``max_attempts``, ``cancel_grace_s``, ``poll_s`` of
        :class:`~service.jobs.runner.JobLoop`.
    """

    def __init__(
        self,
        store: JobStore,
        config: WorkerConfig,
        *,
        address: str,
        workers: int = 1,
        on_succeeded: OnSucceeded | None = None,
        **loop: Any,
    ) -> None:
        super().__init__(store, on_succeeded=on_succeeded, **loop)
        self.config = dataclasses.replace(config, owner=self.owner, engine="ray")
        self.address, self.workers = address, max(1, workers)
        self._refs: dict[str, Any] = {}
        self._task: Any = None
        self._owns_ray = False

    def start(self) -> None:
        """Connect to the Ray cluster, then start the supervisor.

        Raises
        ------
        StoreError
            If the cluster cannot be reached or joined (see :func:`check_ray_reachable`).
        """
        import ray

        if not ray.is_initialized():
            check_ray_reachable(self.address)
            try:
                ray.init(
                    address=self.address,
                    namespace="lead",
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except ConnectionError as exc:  # a wrong token, a port that is not Ray's
                raise StoreError(
                    f"cannot join the Ray cluster at {self.address} (LEAD_RAY_ADDRESS): {exc}; "
                    "a cluster with token authentication needs RAY_AUTH_MODE=token and its "
                    "RAY_AUTH_TOKEN"
                ) from None
            self._owns_ray = True
        self._task = ray.remote(max_retries=1, retry_exceptions=False)(train_on_ray)
        super().start()

    def check_resources(self, resources: dict[str, Any] | None) -> None:
        """Refuse ``resources`` that no live node of the cluster has (Ray would keep such a
        task pending forever, and the job ``running`` with it).

        Raises
        ------
        InvalidInputError
            Naming ``resources.cpus`` or ``resources.gpus`` and the largest node's.
        """
        import ray

        cpus, gpus = _asked(resources)
        alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        nodes = [n.get("Resources", {}) for n in alive]
        if any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
            return
        most_cpus = max((n.get("CPU", 0) for n in nodes), default=0)
        most_gpus = max((n.get("GPU", 0) for n in nodes), default=0)
        param = "resources.gpus" if gpus > most_gpus else "resources.cpus"
        raise InvalidInputError(
            f"no node of the Ray cluster has {cpus} CPU(s) and {gpus:g} GPU(s) (the most on "
            f"one node: {most_cpus:g} CPU(s), {most_gpus:g} GPU(s)); ask for less",
            param=param,
        )

    # --------------------------------------------------------------- hooks
    def _free_slots(self) -> int:
        return self.workers - len(self._refs)

    def _launch(self, job: JobRecord) -> None:
        resources = job.request.get("resources") or {}
        self.check_resources(resources)  # the cluster may have shrunk since the job was made
        cpus, gpus = _asked(resources)
        ref = self._task.options(num_cpus=cpus, num_gpus=gpus, name=f"lead-job-{job.id}").remote(
            self.config, job.id, cpus
        )
        self._refs[job.id] = ref

    def _poll(self) -> list[Outcome]:
        import ray
        from ray.exceptions import RayError, TaskCancelledError

        if not self._refs:
            return []
        ready, _ = ray.wait(list(self._refs.values()), num_returns=len(self._refs), timeout=0)
        done = {id(ref) for ref in ready}
        outcomes: list[Outcome] = []
        for job_id, ref in list(self._refs.items()):
            if id(ref) not in done:
                continue
            del self._refs[job_id]
            try:
                outcomes.append((job_id, str(ray.get(ref)), None))
            except TaskCancelledError:
                outcomes.append((job_id, "cancelled", None))
            except RayError as exc:
                reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                message = f"the Ray worker died twice ({type(exc).__name__}: {reason})"
                outcomes.append((job_id, "crashed", message))
        return outcomes

    def _ask_to_stop(self, job_id: str) -> None:
        import ray

        if job_id in self._refs:
            ray.cancel(self._refs[job_id])

    def _abort(self, job_id: str) -> None:
        import ray

        ref = self._refs.pop(job_id, None)
        if ref is not None:
            ray.cancel(ref, force=True)

    def _close(self) -> None:
        import ray

        for job_id in list(self._refs):
            self._abort(job_id)
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
