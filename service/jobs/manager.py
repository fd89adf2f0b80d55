"""The jobs side of one server: start-up recovery, job creation, datasets, registration.

:class:`JobManager` owns the data directory (:class:`~service.jobs.layout.DataLayout`), the
SQLite store and the runner. Routes call it; it never fits or scores (the worker calls
``lead``), and every failure is a :class:`lead.errors.LeadError` that ``service/errors.py``
maps to HTTP.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import logging
import re
import threading
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch

from lead.data import check_embeddings
from lead.errors import (
    ConflictError,
    DecodeError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    LeadError,
    LimitExceededError,
    ModelMismatchError,
    NotReadyError,
    ShapeMismatchError,
    StitchNotFoundError,
    TooFewPairsError,
)
from service.encoding import decode_vectors
from service.errors import echo
from service.jobs.datasets import (
    check_dimension,
    check_judged_held_out,
    inspect_dataset,
    load_paired,
    publish,
    receive_upload,
    retrieval_meta,
    save_pairs,
)
from service.jobs.layout import DataLayout
from service.jobs.process_runner import ProcessRunner
from service.jobs.ray_runner import RayRunner
from service.jobs.records import StitchState
from service.jobs.runner import Runner
from service.jobs.schemas import AlignRequest, JobCreate, PairsInput
from service.jobs.stitch_store import StitchStore, open_stitch_store
from service.jobs.store import DatasetRecord, IdempotencyKeyTaken, JobRecord, JobStore, new_id
from service.jobs.watcher import StitchWatcher
from service.jobs.worker import WorkerConfig
from service.registry import StitchRegistry
from service.settings import Settings

__all__ = ["JobManager", "follows_jobs", "request_hash"]

logger = logging.getLogger("lead.jobs")


def request_hash(fields: dict[str, Any], arrays: tuple[np.ndarray, ...] = ()) -> str:
    """SHA-256 of a request: the canonical JSON of its ``fields`` (sorted keys, no spaces),
    then the shape and little-endian float32 bytes of each of its decoded vector ``arrays``
    (inline pairs: hashing their bytes takes milliseconds where their JSON took a second, with
    the interpreter held)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8"))
    for array in arrays:
        digest.update(repr(array.shape).encode("ascii"))
        digest.update(np.ascontiguousarray(array, dtype="<f4").data)
    return digest.hexdigest()


def follows_jobs(settings: Settings) -> bool:
    """Whether a server opens a job store: it runs jobs (``enable_jobs``), or it only
    translates but shares a job store with replicas that train (``database_url``, or the
    SQLite file of a ``data_dir`` that holds one), whose stitches it then serves too."""
    if settings.enable_jobs or settings.database_url is not None:
        return True
    return DataLayout(Path(settings.data_dir).expanduser().resolve()).db.is_file()


#: Parameter names of lead.alignment_scores → fields of POST /v1/align.
_ALIGN_PARAMS = {"X": "source", "Y": "target"}


def _slug(model: str) -> str:
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9._-]+", "-", name).strip("-._")[:40] or "model"


def _decode_side(items: list[Any], name: str, limit: int, max_dim: int) -> np.ndarray:
    """Inline vectors (float arrays or base64 float32) → float32 ``(n, d)``, errors naming
    ``name[i]``."""
    if len(items) > limit:
        raise LimitExceededError(
            f"{name} has {len(items)} vectors; inline pairs are limited to {limit} "
            "(upload a dataset with POST /v1/datasets for more)",
            limit=limit,
            got=len(items),
            param=name,
        )
    try:
        if not items:
            raise DecodeError(f"{name} is empty", param=name)
        first = items[0]
        if isinstance(first, str):
            try:
                dim = len(base64.b64decode(first, validate=True)) // 4
            except (binascii.Error, ValueError):
                raise DecodeError(f"{name}[0] is not valid base64", param=f"{name}[0]") from None
        else:
            dim = len(first)
        if dim < 1:
            raise ShapeMismatchError(f"{name}[0] is empty", expected=">= 1", got=0, param=name)
        check_dimension(dim, max_dim, name)
        return decode_vectors(items, dim)
    except LeadError as exc:
        exc.message = exc.message.replace("input", name).replace(
            "the stitch expects", f"{name}[0] has"
        )
        exc.param = None if exc.param is None else exc.param.replace("input", name)
        raise


class JobManager:
    """Training jobs and datasets under ``settings.data_dir``.

    Parameters
    ----------
    settings : Settings
        ``data_dir``, ``job_workers``, ``job_torch_threads``, ``job_nice``, ``hf_token``
        and the dataset / inline / align limits.
    registry : StitchRegistry, optional
        Where trained stitches are registered for translation (saved ones at start too).
    runner : Runner, optional
        Default: a :class:`~service.jobs.ray_runner.RayRunner` with ``ray_address``, else
        a :class:`~service.jobs.process_runner.ProcessRunner`.
    """

    def __init__(
        self,
        settings: Settings,
        registry: StitchRegistry | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.layout = DataLayout(Path(settings.data_dir).expanduser().resolve())
        self.runner: Runner | None = runner
        self._store: JobStore | None = None
        self._stitches: StitchStore | None = None
        self.watcher: StitchWatcher | None = None
        self._deleting = threading.Lock()
        #: inline-pair files of finished jobs removed already (by this process)
        self._forgotten: set[str] = set()

    @property
    def store(self) -> JobStore:
        """The job and dataset records (opened by :meth:`start`)."""
        if self._store is None:
            raise NotReadyError("the job store is not open yet")
        return self._store

    @property
    def stitches(self) -> StitchStore:
        """Where trained stitches are published (opened by :meth:`start`)."""
        if self._stitches is None:
            raise NotReadyError("the stitch store is not open yet")
        return self._stitches

    # -------------------------------------------------------------- life cycle
    def start(self, *, run_jobs: bool = True) -> None:
        """Open the stores, settle jobs left by dead servers, serve the published stitches,
        start the runner and the stitch watcher.

        Leftovers of interrupted writes are removed. Running jobs whose server is gone (this
        one, before a crash) are queued again or ``failed`` (``interrupted``) after their
        last attempt (:meth:`JobStore.reap`). Published stitches are served again, oldest
        job first, except those whose job decided not to serve them (below the baseline)
        and deleted ones (a folder that survived a crash during the deletion is removed).

        Without ``run_jobs`` (a translation-only replica, ``LEAD_ENABLE_JOBS=false``) only
        the stitches the other replicas trained are served and followed: nothing in the
        stores is changed and no runner starts.
        """
        settings = self.settings
        self.layout.prepare()
        if run_jobs:
            self.layout.clean_leftovers()
        database = settings.database_url
        self._store = JobStore(self.layout.db if database is None else database.get_secret_value())
        token = None if settings.hf_token is None else settings.hf_token.get_secret_value()
        self._stitches = open_stitch_store(settings.stitch_store, self.layout.root, token)
        if not run_jobs:
            self._watch(self.store.succeeded_stitches())
            return
        self.store.reap(settings.job_max_attempts)
        known = self.store.data_paths()
        for path in [*self.layout.datasets.iterdir(), *self.layout.job_data.iterdir()]:
            if self.layout.relative(path) not in known:  # written just before a crash
                logger.warning("removing %s: no dataset or job refers to it", path)
                path.unlink(missing_ok=True)
        published = self.store.succeeded_stitches()
        for stitch_id, state in published.items():
            if state.deleted and self.stitches.exists(stitch_id):  # stopped while deleting
                logger.warning("removing stitch %s: it was deleted", stitch_id)
                self.stitches.delete(stitch_id)
        self._watch(published)
        if self.runner is None:
            self.runner = self._new_runner(token)
        self.runner.start()

    def _watch(self, published: dict[str, StitchState]) -> None:
        """Serve the ``published`` stitches (:meth:`JobStore.succeeded_stitches`) and start
        the watcher that follows the job store (nothing without a registry)."""
        if self.registry is None:
            return
        self.registry.await_stitches(StitchWatcher.wanted(published), at_start=True)
        self.watcher = StitchWatcher(
            self.store, self.stitches, self.registry, self.settings.stitch_poll_seconds
        )
        self.watcher.sync()
        self.watcher.start()

    def _new_runner(self, token: str | None) -> Runner:
        settings = self.settings
        database = settings.database_url
        config = WorkerConfig(
            data_dir=str(self.layout.root),
            database=str(self.layout.db if database is None else database.get_secret_value()),
            stitch_store=settings.stitch_store or str(self.layout.stitches),
            torch_threads=settings.job_torch_threads,
            nice=settings.job_nice,
            hf_token=token,
        )
        loop: dict[str, Any] = {
            "on_succeeded": self._on_succeeded,
            "lease_s": settings.job_lease_seconds,
            "max_attempts": settings.job_max_attempts,
            "cancel_grace_s": settings.job_cancel_grace_seconds,
            "poll_s": settings.stitch_poll_seconds,
            "on_sweep": self._forget_finished_job_data,
        }
        if settings.ray_address:
            return RayRunner(
                self.store,
                config,
                address=settings.ray_address,
                workers=settings.job_workers,
                **loop,
            )
        return ProcessRunner(self.store, config, workers=settings.job_workers, **loop)

    def stop(self) -> None:
        """Stop the runner (jobs still training become ``interrupted``)."""
        if self.watcher is not None:
            self.watcher.stop()
        if self.runner is not None:
            self.runner.stop()
        if self._store is not None:
            self._store.close()

    def _forget_finished_job_data(self) -> None:
        """Remove the inline pairs of finished jobs: the local file and the shared bytes
        (they were kept for good, ~9 MB for 3,000 pairs of 384 dimensions a job)."""
        for path in self.store.finished_job_data() - self._forgotten:
            (self.layout.root / path).unlink(missing_ok=True)
            self.store.delete_blob(path)
            self._forgotten.add(path)

    def _on_succeeded(self, job: JobRecord) -> None:
        """Serve a finished job's stitch here at once, unless its result says not to (below
        baseline); other servers' watchers serve it within ``stitch_poll_seconds``. A stitch
        that cannot be served is removed from the stitch store (the job fails)."""
        if self.registry is None or not (job.result or {}).get("served", True):
            return
        from lead.artifacts import load_stitch

        try:
            folder = self.stitches.local_folder(job.stitch_id)
            stitch = load_stitch(folder, device=self.registry.device, dtype=torch.float32)
            self.registry.register(job.stitch_id, stitch, origin="job", folder=folder)
        except Exception:
            self.stitches.delete(job.stitch_id)
            raise

    # -------------------------------------------------------------------- jobs
    def create_job(
        self, body: JobCreate, *, idempotency_key: str | None = None
    ) -> tuple[JobRecord, bool]:
        """Validate a job request, store its data, queue it.

        Returns
        -------
        job : JobRecord
        created : bool
            False when ``idempotency_key`` returned the job made earlier for the same body.

        Raises
        ------
        IdempotencyKeyReusedError
            If the key was used with a different body (HTTP 422).
        DatasetNotFoundError
            Unknown ``dataset``.
        DecodeError, ShapeMismatchError, NonFiniteError, LimitExceededError, TooFewPairsError
            Bad inline vectors, or too few pairs for the hold-out split.
        InvalidInputError
            Method ``local`` or ``gated`` with ``k`` above its memory (the training pairs, at
            most ``max_memory``).
        IllConditionedError
            Inline vectors whose column spreads are too far apart for float32.
        ConflictError
            If ``stitch_id`` is served, saved or produced by another job.
        ModelMismatchError
            If the dataset records a source or target model other than the job names.
        ShapeMismatchError
            If a model's dimension disagrees with the served stitches (the stitch could not
            be registered).
        """
        from lead.fitting import METHODS
        from lead.local import check_local_rows
        from lead.splits import holdout_split

        stored = body.model_dump(mode="json", exclude={"source", "target"})
        inline = None if body.dataset is not None else self._inline_pairs(body)
        digest = request_hash(stored, inline or ())
        if idempotency_key is not None:
            earlier = self._idempotent(idempotency_key, digest)
            if earlier is not None:
                return earlier, False
        job_id = new_id("job")
        if body.dataset is not None:
            dataset = self.store.get_dataset(body.dataset)
            pairs, data_path = int(dataset.info["pairs"]), dataset.path
            d_src, d_tgt = int(dataset.info["source_dim"]), int(dataset.info["target_dim"])
            for side in ("source_model", "target_model"):
                recorded, asked = dataset.info.get(side), getattr(body, side)
                if recorded is not None and recorded != asked:
                    raise ModelMismatchError(
                        f"{side} is {echo(asked)} but dataset {body.dataset} was recorded with "
                        f"{echo(recorded)}; a stitch must name the models that made its vectors",
                        param=side,
                    )
        else:
            assert inline is not None
            pairs, data_path = (
                inline[0].shape[0],
                self.layout.relative(self.layout.job_file(job_id)),
            )
            d_src, d_tgt = inline[0].shape[1], inline[1].shape[1]
        if self.registry is not None:  # a stitch that could never be registered: refuse now
            self.registry.check_model_dims(
                {
                    "source_model": (body.source_model, d_src),
                    "target_model": (body.target_model, d_tgt),
                }
            )
        # enough pairs on both sides?
        train, test = holdout_split(pairs, body.holdout_fraction, body.seed)
        if body.dataset is not None and dataset.info.get("retrieval"):
            # a held-out split without a judged document: the job would train, then fail
            meta = retrieval_meta(self.layout.root / data_path)
            if meta is not None:
                check_judged_held_out(meta, test, body.holdout_fraction)
        if METHODS[body.method] in ("local", "gated"):  # k within the memory, before training
            check_local_rows(body.options, len(train), param="options.k")
        _check_early_stopping_rows(
            METHODS[body.method], body.options, pairs, body.holdout_fraction, body.seed
        )
        stitch_id = (
            body.stitch_id
            or f"{_slug(body.source_model)}-to-{_slug(body.target_model)}-{job_id[4:12]}"
        )
        if (self.registry is not None and stitch_id in self.registry) or self.stitches.exists(
            stitch_id
        ):
            raise ConflictError(f"a stitch with id {stitch_id!r} exists already", param="stitch_id")
        token = self.settings.hf_token
        if body.push_to_hub and not (token is not None and token.get_secret_value()):
            # known now: the job would train, then fail its push
            raise InvalidInputError(
                "push_to_hub needs a Hugging Face token, and this server has none "
                "(LEAD_HF_TOKEN); drop push_to_hub to keep the stitch on this server",
                param="push_to_hub",
            )
        if body.resources is not None and body.resources.gpus > 0 and not self.settings.ray_address:
            raise InvalidInputError(
                "resources.gpus needs jobs on Ray (LEAD_RAY_ADDRESS); this server trains in its "
                "own processes",
                param="resources.gpus",
            )
        if body.resources is not None and isinstance(self.runner, RayRunner):
            self.runner.check_resources(body.resources.model_dump())
        if inline is not None:
            save_pairs(self.layout.root / data_path, *inline)
            if self.store.shares_files:  # every server and Ray worker reads it from the store
                self.store.put_blob(data_path, self.layout.root / data_path)
        try:
            job = self.store.create_job(
                job_id=job_id,
                request=stored,
                data_path=data_path,
                dataset_id=body.dataset,
                pairs=pairs,
                stitch_id=stitch_id,
                idempotency_key=idempotency_key,
                request_hash=digest,
            )
        except BaseException as exc:
            if inline is not None:
                (self.layout.root / data_path).unlink(missing_ok=True)
                if self.store.shares_files:
                    self.store.delete_blob(data_path)
            if isinstance(exc, IdempotencyKeyTaken) and idempotency_key is not None:
                earlier = self._idempotent(idempotency_key, digest)  # a concurrent twin won
                if earlier is not None:
                    return earlier, False
            raise
        assert self.runner is not None
        self.runner.submit(job.id)
        return job, True

    def _idempotent(self, key: str, digest: str) -> JobRecord | None:
        found = self.store.find_idempotent(key)
        if found is None:
            return None
        job, earlier_digest = found
        if earlier_digest != digest:
            raise IdempotencyKeyReusedError(
                f"Idempotency-Key {key!r} was used for job {job.id} with a different request "
                "body; use a new key for a new job",
                param="Idempotency-Key",
            )
        return job

    def _inline_pairs(self, body: PairsInput) -> tuple[np.ndarray, np.ndarray]:
        limit = self.settings.max_inline_pairs
        assert body.source is not None and body.target is not None
        max_dim = self.settings.max_dimension
        source = _decode_side(body.source, "source", limit, max_dim)
        target = _decode_side(body.target, "target", limit, max_dim)
        if source.shape[0] != target.shape[0]:
            raise ShapeMismatchError(
                f"source has {source.shape[0]} vectors but target has {target.shape[0]}; "
                "they must be pairs",
                expected=source.shape[0],
                got=target.shape[0],
                param="target",
            )
        for name, vectors in (("source", source), ("target", target)):
            check_embeddings(vectors, name=name)  # ill-conditioned: 422 now, not a failed job
        return source, target

    def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel a queued job, or stop a running one (``cancelling`` until it has stopped).

        Raises
        ------
        JobNotFoundError
            Unknown job.
        ConflictError
            If the job has finished.
        """
        job = self.store.request_cancel(job_id)
        if job.status == "cancelling" and self.runner is not None:
            self.runner.cancel(job_id)
        return job

    # ---------------------------------------------------------------- stitches
    def delete_stitch(self, stitch_id: str) -> JobRecord | None:
        """Stop serving a stitch trained by a job and delete its folder.

        The job that trained it is marked first (``result.stitch_deleted_at``): that is the
        commit point, so a published copy whose stitch was deleted is removed at start-up
        when the server stopped half-way, and every other server stops serving it within
        ``stitch_poll_seconds``. Requests already translating with the stitch finish with
        it. Its id is not used again by later jobs.

        Returns
        -------
        JobRecord or None
            The job that trained it, or None for a stitch folder no job record names.

        Raises
        ------
        StitchNotFoundError
            If no stitch with this id is served or saved here.
        ConflictError
            If the stitch is configured (bundled, a local folder, the Hub) rather than
            trained by a job, or its job has not finished.
        NotReadyError
            If it is a configured stitch that is still loading.
        """
        with self._deleting:
            entry, missing = None, None
            if self.registry is not None:
                try:
                    entry = self.registry.get(stitch_id)
                except StitchNotFoundError as error:
                    missing = error  # a saved folder may still be there (it failed to load)
            if entry is not None and entry.origin != "job":
                raise ConflictError(
                    f"stitch {echo(stitch_id)} is configured ({entry.origin}), not trained by "
                    "a job, so it cannot be deleted over HTTP: remove it from LEAD_STITCHES "
                    "(or models/) and restart the server",
                    param="stitch_id",
                )
            saved = self._saved(stitch_id)
            if entry is None and not saved:
                deleted = self.store.stitch_deleted_at(stitch_id)
                if deleted is not None:
                    raise StitchNotFoundError(
                        f"stitch {echo(stitch_id)} was deleted already (Unix time "
                        f"{deleted[1]}; job {deleted[0]} keeps its record)",
                        param="stitch_id",
                    )
                raise missing or StitchNotFoundError(
                    f"no stitch {echo(stitch_id)}", param="stitch_id"
                )
            job = self.store.mark_stitch_deleted(stitch_id)
            if entry is not None and self.registry is not None:
                with contextlib.suppress(StitchNotFoundError):  # the watcher was quicker
                    self.registry.remove(stitch_id)
            if saved:
                self.stitches.delete(stitch_id)
            logger.info("deleted stitch %s (job %s)", stitch_id, job.id if job else "none")
            return job

    def _saved(self, stitch_id: str) -> bool:
        """Whether a trained stitch with this id is in the stitch store."""
        try:
            return self.stitches.exists(stitch_id)
        except ValueError:  # not a trained stitch's id (a Hub id, say)
            return False

    # ---------------------------------------------------------------- datasets
    async def upload_dataset(
        self, chunks: AsyncIterator[bytes], *, name: str | None = None
    ) -> DatasetRecord:
        """Receive, validate and store a ``.safetensors`` dataset (see :mod:`.datasets`).

        Raises
        ------
        PayloadTooLargeError
            More than ``max_dataset_bytes`` (HTTP 413).
        DecodeError
            Not a safetensors file (HTTP 400).
        InvalidInputError, ShapeMismatchError, NonFiniteError, TooFewPairsError, LimitExceededError
            Content that is not a usable paired dataset (HTTP 4xx, see ``service/errors.py``).
        """
        dataset_id = new_id("ds")
        final = self.layout.dataset_file(dataset_id)
        tmp = final.with_name(f".tmp-{final.name}")
        size, sha256 = await receive_upload(chunks, tmp, max_bytes=self.settings.max_dataset_bytes)
        try:
            info = await anyio.to_thread.run_sync(
                partial(
                    inspect_dataset,
                    tmp,
                    max_rows=self.settings.max_dataset_rows,
                    max_dim=self.settings.max_dimension,
                )
            )
            await anyio.to_thread.run_sync(publish, tmp, final)
            if self.store.shares_files:  # every server and Ray worker reads it from the store
                relative = self.layout.relative(final)
                await anyio.to_thread.run_sync(self.store.put_blob, relative, final)
        finally:
            tmp.unlink(missing_ok=True)
        info.update(bytes=size, sha256=sha256, name=name or info.get("name"))
        try:
            return await anyio.to_thread.run_sync(
                self.store.add_dataset, dataset_id, info, self.layout.relative(final)
            )
        except BaseException:
            final.unlink(missing_ok=True)
            if self.store.shares_files:
                self.store.delete_blob(self.layout.relative(final))
            raise

    def delete_dataset(self, dataset_id: str) -> DatasetRecord:
        """Delete a dataset record and its file (409 while an unfinished job reads it)."""
        record = self.store.delete_dataset(dataset_id)
        (self.layout.root / record.path).unlink(missing_ok=True)
        return record

    # ------------------------------------------------------------------- align
    def align(self, body: AlignRequest) -> dict[str, Any]:
        """:func:`lead.alignment.alignment_scores` of a dataset or inline pairs (run it in a
        thread). A dataset larger than ``max_align_pairs`` is scored on a seeded random
        subset of that many pairs (the response's ``pairs`` says how many were used)."""
        from lead.alignment import alignment_scores

        if body.dataset is not None:
            dataset = self.store.get_dataset(body.dataset)
            data = load_paired(self.layout.local_file(self.store, dataset.path))
            source, target = data.source, data.target
        else:
            source, target = self._inline_pairs(body)
        try:
            scores = alignment_scores(
                source,
                target,
                folds=body.folds,
                seed=body.seed,
                max_pairs=self.settings.max_align_pairs,
            )
        except LeadError as exc:  # lead names the arrays X and Y; the request, source/target
            exc.param = _ALIGN_PARAMS.get(exc.param or "", exc.param)
            exc.message = re.sub(
                r"\b[XY]\b", lambda m: "source" if m[0] == "X" else "target", exc.message
            )
            raise
        return {"object": "alignment", **scores}


def _check_early_stopping_rows(
    method: str, options: dict[str, Any], pairs: int, holdout: float, seed: int
) -> None:
    """Refuse at submission a trained method whose early-stopping split of the training
    pairs (what the job's ``holdout`` of its ``pairs`` leaves) would fail
    (``too_few_pairs``) once the job runs.

    Raises
    ------
    TooFewPairsError
        Naming the fewest training pairs that are enough, and the fewest pairs to send.
    """
    from lead.invertible import InvertibleConfig
    from lead.splits import early_stopping_split
    from lead.training import MLPConfig

    option = "holdout_fraction"
    defaults = {
        "mlp": ("MLP", MLPConfig.holdout_fraction, option),
        "invertible": ("invertible", InvertibleConfig.holdout_fraction, option),
        # the gated stitch's MLP expert, on every training pair, with MLPConfig's share
        # (not an option of the gated method)
        "gated": ("gated stitch's MLP", MLPConfig.holdout_fraction, None),
    }
    if method not in defaults:
        return
    name, fraction, settable = defaults[method]

    def _training(n: int) -> int:
        return n - round(n * holdout)  # holdout_split's training rows of n pairs

    train = _training(pairs)
    try:
        early_stopping_split(
            train, float(options.get(option, fraction)), seed, method=name, option=settable
        )
    except TooFewPairsError as error:
        param = f"options.{option}" if option in options else "pairs"
        # the user sends pairs, not training pairs: the fewest to send for enough of them
        send = next(
            (n for n in range(pairs, pairs + 100 * error.minimum) if _training(n) >= error.minimum),
            None,
        )
        if send is None or error.minimum <= train:  # a share too small for any number
            error.param = param
            raise
        raise TooFewPairsError(
            f"{error.message}; the job holds out {holdout:g} of its {pairs} pairs for its "
            f"scorecard, leaving {train} to train on: send at least {send} pairs",
            minimum=send,
            got=pairs,
            param=param,
        ) from None
