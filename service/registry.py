"""The loaded stitches: lookup by id, by (source model, target model), and shortest chains.

:class:`StitchRegistry` is thread-safe: the start-up loader (a thread), training jobs
(:meth:`StitchRegistry.register` at run time) and request threads share it. Every stitch
passes a test vector before it is served: a forward on a fixed batch must give finite
output of the right shape.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lead.errors import (
    ConflictError,
    InvalidInputError,
    NoConfidenceError,
    NotReadyError,
    ShapeMismatchError,
    StitchFormatError,
    StitchNotFoundError,
)
from lead.stitches import Stitch
from service.errors import echo
from service.routing import (
    Origin,
    Route,
    StitchEntry,
    probe_stitch,
    serving_copy,
    shortest_chain,
)

__all__ = ["LoadFailure", "Readiness", "Route", "StitchEntry", "StitchRegistry"]

#: Stitch ids a "no stitch" message lists at most.
_LISTED = 20


@dataclass(frozen=True)
class LoadFailure:
    """A configured stitch that could not be loaded or failed its test vector."""

    id: str
    error: str
    message: str


@dataclass(frozen=True)
class Readiness:
    ready: list[str]
    pending: list[str]
    failed: list[LoadFailure]
    loading: bool
    #: Job-trained stitches whose last try to load failed; tried again, and they do not
    #: make the server unready (one job's broken files must not take a replica out).
    retrying: list[LoadFailure] = field(default_factory=list)

    @property
    def is_ready(self) -> bool:
        return not self.pending and not self.failed and not self.loading


class StitchRegistry:
    """Stitches served by one app, on one device and dtype.

    Parameters
    ----------
    device : torch.device
    dtype : torch.dtype
    """

    def __init__(self, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        self.device = device
        self.dtype = dtype
        self._lock = threading.Lock()
        self._sequence = 0
        self._entries: dict[str, StitchEntry] = {}
        self._pending: set[str] = set()
        #: Job-trained stitches that this server will load (id → why the last try failed,
        #: or None): 503, not 404, until they are registered (see :meth:`await_stitches`).
        self._awaited: dict[str, LoadFailure | None] = {}
        #: Those of them found published at start-up and not tried yet: ``/readyz`` waits
        #: for each one's first try (a restarted server said ready, then answered 503 for
        #: the stitches it had served before; later ones never make a ready server unready).
        self._at_start: set[str] = set()
        self._failures: dict[str, LoadFailure] = {}
        self._model_dims: dict[str, int] = {}
        self._loading = False
        self.closed = threading.Event()

    # -- loading ---------------------------------------------------------------------------

    def expect(self, stitch_ids: list[str]) -> None:
        """Mark configured stitches as pending (``/readyz`` answers 503 until they load)."""
        with self._lock:
            self._loading = True
            self._pending.update(stitch_ids)

    def await_stitches(self, stitch_ids: list[str], *, at_start: bool = False) -> None:
        """Mark published job-trained stitches as coming: until :meth:`register` serves one,
        requests naming it get 503 ``not_ready`` (after a restart they got 404 for the
        seconds the watcher took, and a client that takes 404 as final dropped them).
        ``at_start``: found at start-up, so pending in :meth:`readiness` until its first
        try (:meth:`register` or :meth:`await_failed`)."""
        with self._lock:
            for stitch_id in stitch_ids:
                if stitch_id not in self._entries:
                    self._awaited.setdefault(stitch_id, None)
                    if at_start:
                        self._at_start.add(stitch_id)

    def await_failed(self, stitch_id: str, error: str, message: str) -> None:
        """Record why an awaited stitch failed to load (``error``: the exception's type
        name): it is tried again, still 503, and listed as retrying by :meth:`readiness`."""
        with self._lock:
            if stitch_id in self._awaited:
                self._awaited[stitch_id] = LoadFailure(stitch_id, error, message)
            self._at_start.discard(stitch_id)  # tried: no longer holds /readyz

    def stop_awaiting(self, keep: set[str]) -> None:
        """Forget the awaited stitches not in ``keep`` (deleted or no longer served)."""
        with self._lock:
            for stitch_id in set(self._awaited) - keep:
                del self._awaited[stitch_id]
                self._at_start.discard(stitch_id)

    @property
    def loading(self) -> bool:
        """Whether the configured stitches are still loading."""
        with self._lock:
            return self._loading

    def finish_loading(self) -> None:
        with self._lock:
            self._loading = False

    def fail(self, stitch_id: str, exc: BaseException) -> LoadFailure:
        """Record that a configured stitch failed to load."""
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        failure = LoadFailure(stitch_id, type(exc).__name__, message)
        with self._lock:
            self._pending.discard(stitch_id)
            self._failures[stitch_id] = failure
        return failure

    def register(
        self,
        stitch_id: str,
        stitch: Stitch,
        *,
        origin: Origin = "job",
        revision: str | None = None,
        folder: Path | None = None,
        replace: bool = False,
    ) -> StitchEntry:
        """Serve ``stitch`` under ``stitch_id``, on the registry's device and in its dtype
        where the stitch allows it (:func:`~service.routing.serving_copy`; else float32).

        Safe to call from any thread, at start-up or at run time. ``folder`` is the artifact
        folder it was loaded from, whose files ``GET /v1/stitch-files`` serves.

        Raises
        ------
        ConflictError
            If the id is taken and ``replace`` is false.
        StitchFormatError
            If a model's dimension disagrees with a stitch already served.
        NonFiniteOutputError
            If the stitch fails its test vector.
        """
        stitch = serving_copy(stitch, self.device, self.dtype).freeze()  # served as it is
        probe_stitch(stitch, self.device)
        with self._lock:
            self._sequence += 1
            entry = StitchEntry(stitch_id, stitch, origin, revision, self._sequence, folder)
            if stitch_id in self._entries and not replace:
                raise ConflictError(f"a stitch with id {echo(stitch_id)} is already served")
            for model, dim in (
                (entry.source_model, stitch.d_src),
                (entry.target_model, stitch.d_tgt),
            ):
                known = self._model_dims.get(model)
                if known is not None and known != dim:
                    raise StitchFormatError(
                        f"stitch {echo(stitch_id)} gives model {echo(model)} dimension {dim}, but "
                        f"another stitch gives it {known}"
                    )
            self._model_dims.setdefault(entry.source_model, stitch.d_src)
            self._model_dims.setdefault(entry.target_model, stitch.d_tgt)
            self._entries[stitch_id] = entry
            self._pending.discard(stitch_id)
            self._awaited.pop(stitch_id, None)
            self._at_start.discard(stitch_id)
            self._failures.pop(stitch_id, None)
        return entry

    def remove(self, stitch_id: str) -> StitchEntry:
        """Stop serving a stitch; return its entry.

        Requests that already hold its route (a :class:`Route` keeps its entries) finish
        with it; later ones get 404. A model that no other stitch involves is forgotten, so
        its dimension no longer binds new stitches.

        Raises
        ------
        StitchNotFoundError, NotReadyError
            As :meth:`get`.
        """
        with self._lock:
            entry = self._entries.pop(stitch_id, None)
            if entry is None:
                raise self._not_served(stitch_id)
            self._model_dims = {}
            for other in self._entries.values():
                self._model_dims.setdefault(other.source_model, other.stitch.d_src)
                self._model_dims.setdefault(other.target_model, other.stitch.d_tgt)
        return entry

    # -- lookup ----------------------------------------------------------------------------
    def check_model_dims(self, dims: dict[str, tuple[str, int]]) -> None:
        """Refuse a model dimension that disagrees with a served stitch.

        ``dims`` maps a request field (``"source_model"``) to ``(model id, dimension)``.

        Raises
        ------
        ShapeMismatchError
            Naming the field, the model, both dimensions and a stitch that serves it.
        """
        with self._lock:
            for param, (model, dim) in dims.items():
                known = self._model_dims.get(model)
                if known is not None and known != dim:
                    raise ShapeMismatchError(
                        f"{param} {echo(model)} has dimension {known} in the served stitches, "
                        f"but the training vectors have dimension {dim}",
                        expected=known,
                        got=dim,
                        param=param,
                    )

    def __contains__(self, stitch_id: object) -> bool:
        with self._lock:
            return stitch_id in self._entries or stitch_id in self._pending

    def entries(self) -> list[StitchEntry]:
        """Served stitches, sorted by id."""
        with self._lock:
            return [self._entries[k] for k in sorted(self._entries)]

    def largest_dim(self) -> int:
        """The largest input dimension of any served stitch, either direction (0: none)."""
        with self._lock:
            stitches = [e.stitch for e in self._entries.values()]
        return max((max(s.d_src, s.d_tgt) for s in stitches), default=0)

    def check_confidence(self, route: Route) -> None:
        """Refuse ``route`` for ``"return_confidence"`` unless every stitch on it has a
        confidence head, naming a stitch that joins the same two models with one.

        Raises
        ------
        NoConfidenceError
            As :meth:`Route.confidence_problem`.
        """
        problem = route.confidence_problem()
        if problem is None:
            return
        ends = (route.models[0], route.models[-1])
        scored = [
            e.id
            for e in sorted(self.entries(), key=StitchEntry.preference)
            if (e.source_model, e.target_model) == ends and e.stitch.confidence_head is not None
        ]
        if scored and not route.inverse:
            problem += f'; stitch {scored[0]} joins the same models with one: name it in "stitch"'
        raise NoConfidenceError(problem, param="return_confidence")

    def readiness(self) -> Readiness:
        with self._lock:
            return Readiness(
                ready=sorted(self._entries),
                pending=sorted(self._pending | self._at_start),
                failed=[self._failures[k] for k in sorted(self._failures)],
                loading=self._loading,
                retrying=[f for _, f in sorted(self._awaited.items()) if f is not None],
            )

    def get(self, stitch_id: str) -> StitchEntry:
        """The stitch served as ``stitch_id``.

        Raises
        ------
        NotReadyError
            If it is configured but still loading.
        StitchNotFoundError
            If no such stitch is served (the message says why when it failed to load).
        """
        with self._lock:
            entry = self._entries.get(stitch_id)
            if entry is not None:
                return entry
            error = self._not_served(stitch_id)
        raise error

    def _not_served(self, stitch_id: str) -> NotReadyError | StitchNotFoundError:
        """Why ``stitch_id`` is not served (call with the lock held)."""
        if stitch_id in self._pending:
            return NotReadyError(f"stitch {echo(stitch_id)} is still loading")
        if stitch_id in self._awaited:
            failed = self._awaited[stitch_id]
            retry = (
                ""
                if failed is None
                else f"; its last try failed ({failed.error}: {failed.message}), tried again"
            )
            return NotReadyError(
                f"stitch {echo(stitch_id)} (trained by a job) is still loading{retry}"
            )
        failure = self._failures.get(stitch_id)
        if failure is not None:
            return StitchNotFoundError(
                f"stitch {echo(stitch_id)} failed to load at start-up ({failure.error}: "
                f"{failure.message}); see /readyz",
                param="stitch",
            )
        ids = sorted(self._entries)
        known = ", ".join(ids[:_LISTED]) or "none"
        if len(ids) > _LISTED:  # jobs add stitches: the message stays short
            known += f" and {len(ids) - _LISTED} more (GET /v1/stitches lists them)"
        return StitchNotFoundError(f"no stitch {echo(stitch_id)}; served: {known}", param="stitch")

    def route_for_id(self, stitch_id: str, *, inverse: bool = False) -> Route:
        """The route of one stitch, run backwards when ``inverse``.

        Raises
        ------
        StitchNotFoundError, NotReadyError
            As :meth:`get`.
        NotInvertibleError
            If ``inverse`` and the stitch is not invertible.
        """
        return Route((self.get(stitch_id),), self.device, inverse=inverse)

    def route(self, source_model: str, target_model: str, *, strict: bool = False) -> Route:
        """The direct stitch from ``source_model`` to ``target_model``, else the shortest chain.

        Breadth-first search over the model graph (an edge per stitch), so a chain has the
        fewest stitches possible. Configured stitches (bundled, local folders, Hub) are
        searched first, alone: a route made of them, direct or a chain, is kept even when a
        job's stitch joins the two models directly, so training a job never silently takes
        over requests that name models (a job's stitch is addressed by its id, or by models
        where no configured route exists, or with ``strict`` where only a configured chain
        does). Among stitches joining the same models (:meth:`StitchEntry.preference`):
        configured before job-trained, then the best held-out R², then the newest.

        Raises
        ------
        InvalidInputError
            If the two models are the same.
        StitchNotFoundError
            If a model is unknown, no chain exists, or only a chain exists and ``strict``.
        NotReadyError
            If nothing matched while configured stitches are still loading.
        """
        if source_model == target_model:
            raise InvalidInputError(
                f"source_model and target_model are both {echo(source_model)}", param="target_model"
            )
        with self._lock:
            entries = sorted(self._entries.values(), key=StitchEntry.preference)
            still_loading = bool(self._pending or self._awaited)
        configured = [e for e in entries if e.origin != "job"]
        path = shortest_chain(configured, source_model, target_model)
        if path is None or (strict and len(path) > 1):
            widest = shortest_chain(entries, source_model, target_model)
            if widest is not None and (path is None or len(widest) == 1):
                path = widest
        if path is None:
            if still_loading:
                raise NotReadyError("stitches are still loading; no route between those models yet")
            models = sorted({e.source_model for e in entries} | {e.target_model for e in entries})
            for name, model in (("source_model", source_model), ("target_model", target_model)):
                if model not in models:
                    raise StitchNotFoundError(
                        f"no served stitch involves model {echo(model)}; known models: "
                        f"{', '.join(models) or 'none'}",
                        param=name,
                    )
            raise StitchNotFoundError(
                f"no stitch or chain of stitches from {echo(source_model)} to {echo(target_model)}",
                param="target_model",
            )
        if strict and len(path) > 1:
            chain = " → ".join(e.id for e in path)
            raise StitchNotFoundError(
                f"no direct stitch from {echo(source_model)} to {echo(target_model)}; a chain "
                f"exists ({chain}) but strict=true refuses chains",
                param="strict",
            )
        return Route(tuple(path), self.device)
