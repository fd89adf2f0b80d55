"""Routes: one stitch or a chain of stitches, how to find the shortest, and how to run one.

A :class:`Route` runs its stitches in one ``torch.inference_mode()`` forward and checks the
output for NaN and infinity. Before each stitch fitted on unit-length vectors the batch is
scaled to unit length (:func:`lead.unit_input.normalize_input`): the user's input before
the first, the previous stitch's output before the next ones of a chain.
:func:`shortest_chain` is a breadth-first search over the model graph (an edge per
stitch), so a chain has the fewest stitches possible.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from lead.batch_invariance import forward_batch_invariant
from lead.confidence import missing_head_message
from lead.errors import (
    NoConfidenceError,
    NonFiniteOutputError,
    StitchFormatError,
    ZeroVectorError,
)
from lead.stitches import InvertibleStitch, Stitch, oriented, unit_rows
from lead.unit_input import (
    expects_unit_input,
    normalize_input_rows,
    rescaled_rows,
    scale_to_unit,
    zero_vector_error,
)

__all__ = [
    "REDUCED_PRECISION_MIN_COSINE",
    "Origin",
    "Route",
    "StitchEntry",
    "Translation",
    "probe_stitch",
    "serving_copy",
    "shortest_chain",
]

Origin = Literal["local", "hub", "job"]

logger = logging.getLogger("lead.service")


@dataclass(frozen=True)
class StitchEntry:
    """A served stitch and where it came from."""

    id: str
    stitch: Stitch
    origin: Origin = "local"
    revision: str | None = None
    #: Registration order (larger = newer), set by the registry.
    sequence: int = 0
    #: The artifact folder it was loaded from (config.json, model.safetensors, README.md),
    #: served by ``GET /v1/stitch-files``; None when it has no files on this server.
    folder: Path | None = None

    @property
    def commit(self) -> str | None:
        """The Hub commit a Hub stitch's files came from, pinned or not: the name of the
        Hugging Face cache snapshot it was loaded from (``.../snapshots/<commit>``, the
        layout ``huggingface_hub.snapshot_download`` returns); None for any other stitch."""
        folder = self.folder
        if self.origin != "hub" or folder is None or folder.parent.name != "snapshots":
            return None
        return folder.name

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the stitch runs in (see :func:`serving_copy`)."""
        return next(self.stitch.parameters()).dtype

    @property
    def held_out_r2(self) -> float | None:
        """The held-out R² of the stitch's scorecard, when it has a finite one."""
        card = self.stitch.info.scorecard or {}
        value = card.get("r2_score")
        if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
            return float(value)
        return None

    def preference(self) -> tuple[bool, float, int, str]:
        """Sort key among stitches joining the same models (smallest first): configured
        stitches before job-trained ones, then the best held-out R² (none counts as
        worst), then (job-trained) the newest, then the id."""
        r2 = self.held_out_r2
        job = self.origin == "job"
        return (job, -r2 if r2 is not None else float("inf"), -self.sequence if job else 0, self.id)

    @property
    def source_model(self) -> str:
        return self.stitch.info.source_model

    @property
    def target_model(self) -> str:
        return self.stitch.info.target_model


#: Rows translated at once on the CPU: a larger request runs in blocks of this many, the
#: same bytes (every forward is batch-invariant), so that its intermediates stay bounded. A
#: gated stitch holds ~2,000 floats a row in its MLP alone: 65,536 rows at once (an Arrow
#: request's limit) raised the server's peak memory by ~3.4 GB, 34 times the request's
#: bytes (found by an adversarial pass).
CPU_BLOCK_ROWS = 8192


class Translation(NamedTuple):
    """What :meth:`Route.run` answers for ``n`` input rows."""

    #: (n, d_tgt) float32, finite.
    vectors: np.ndarray
    #: (n,) float32 in [0, 1], with ``scored`` (else None).
    confidence: np.ndarray | None = None
    #: (n,) bool, with ``scored`` (else None).
    out_of_distribution: np.ndarray | None = None
    #: (n,) bool: the rows scaled to unit length before the first stitch (None: no row).
    rescaled: np.ndarray | None = None

    @property
    def rescaled_inputs(self) -> int:
        """How many rows were scaled to unit length before the first stitch."""
        return 0 if self.rescaled is None else int(self.rescaled.sum())

    @staticmethod
    def joined(parts: list[Translation]) -> Translation:
        """The answers of consecutive blocks of rows, as one (:meth:`rows` undone): every
        block is scored or none is; a block without rescaled rows has ``rescaled`` None."""

        def cat(arrays: list[np.ndarray | None]) -> np.ndarray | None:
            if all(a is None for a in arrays):
                return None
            return np.concatenate(
                [
                    np.zeros(len(p.vectors), bool) if a is None else a
                    for p, a in zip(parts, arrays, strict=True)
                ]
            )

        return Translation(
            np.concatenate([p.vectors for p in parts]),
            cat([p.confidence for p in parts]),
            cat([p.out_of_distribution for p in parts]),
            cat([p.rescaled for p in parts]),
        )

    def rows(self, start: int, stop: int) -> Translation:
        """The answer for input rows ``start:stop``."""
        rows = slice(start, stop)
        confidence, ood, rescaled = self.confidence, self.out_of_distribution, self.rescaled
        return Translation(
            self.vectors[rows],
            None if confidence is None else confidence[rows],
            None if ood is None else ood[rows],
            None if rescaled is None else rescaled[rows],
        )


@dataclass(frozen=True)
class Route:
    """One stitch, or a chain of stitches whose models join up, to apply in order.

    With ``inverse`` the route is one invertible stitch run backwards (target → source).
    """

    entries: tuple[StitchEntry, ...]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    inverse: bool = False
    #: Read nothing back before the result (the GPU path); None: on CUDA devices only.
    sync_free_override: bool | None = None

    def __post_init__(self) -> None:
        if self.inverse:  # one stitch, which must be invertible
            assert len(self.entries) == 1, "only a single stitch runs backwards"
            entry = self.entries[0]
            oriented(entry.stitch, inverse=True, name=entry.id, param="direction")

    @property
    def sync_free(self) -> bool:
        if self.sync_free_override is not None:
            return self.sync_free_override
        return self.device.type == "cuda"

    @property
    def stitches(self) -> tuple[Stitch, ...]:
        return tuple(entry.stitch for entry in self.entries)

    @property
    def is_chain(self) -> bool:
        return len(self.entries) > 1

    @property
    def d_src(self) -> int:
        return oriented(self.entries[0].stitch, inverse=self.inverse)[1]

    @property
    def d_tgt(self) -> int:
        return oriented(self.entries[-1].stitch, inverse=self.inverse)[2]

    @property
    def source_model(self) -> str:
        return self.models[0]

    @property
    def target_model(self) -> str:
        return self.models[-1]

    @property
    def models(self) -> list[str]:
        models = [self.entries[0].source_model] + [e.target_model for e in self.entries]
        return models[::-1] if self.inverse else models

    @property
    def input_normalized(self) -> bool:
        """Whether the input is scaled to unit length (the first stitch was fitted on
        unit-length vectors of the route's source model)."""
        return expects_unit_input(self.entries[0].stitch, inverse=self.inverse)

    def translate(self, x: np.ndarray, *, normalize: bool = False) -> np.ndarray:
        """Apply the stitch (or chain) to ``x``, batch-invariantly: each output row is
        bit-identical whatever the other rows of ``x`` and the thread count
        (:func:`lead.batch_invariance.forward_batch_invariant`).

        On a GPU (:attr:`sync_free`) the input goes through a pinned host buffer, the unit
        scaling reads nothing back (:func:`lead.unit_input.scale_to_unit`) and the only
        synchronisation is the copy of the result (and of the zero-row masks) back to a
        pinned buffer; the answers are the same bytes as the synchronising CPU path.

        Parameters
        ----------
        x : ndarray of shape (n, d_src), float32
            (``d_src`` of the route: the stitch's ``d_tgt`` when ``inverse``); finite.
        normalize : bool
            L2-normalise the output rows.

        Returns
        -------
        ndarray of shape (n, d_tgt), float32, finite

        Raises
        ------
        ZeroVectorError
            If a stitch fitted on unit-length vectors meets an all-zero row (``input[i]``).
        NonFiniteOutputError
            If any output row has NaN or infinity (the row is named).
        """
        return self.run(x, normalize=normalize).vectors

    def confidence_problem(self) -> str | None:
        """Why the route cannot give a confidence per vector, or None when it can: every
        stitch on it needs a confidence head (fitted with held-out pairs), and only the
        forward direction has one."""
        if self.inverse:
            return "a confidence is given for the forward direction only"
        missing = [e for e in self.entries if e.stitch.confidence_head is None]
        if missing:
            return missing_head_message(missing[0].stitch, missing[0].id)
        return None

    def translate_scored(
        self, x: np.ndarray, *, normalize: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`translate`, with a confidence and an out-of-distribution flag per row.

        The vectors are the same bytes as :meth:`translate`'s. Each stitch's confidence
        head scores the rows it receives and produces
        (:meth:`lead.confidence.ConfidenceHead.score`); along a chain the confidences
        multiply (each estimates a cosine to the native vector, and the errors compound)
        and a row is out of distribution when any stitch finds it so.

        Returns
        -------
        y : ndarray of shape (n, d_tgt), float32
        confidence : ndarray of shape (n,), float32 in [0, 1]
        out_of_distribution : ndarray of shape (n,), bool

        Raises
        ------
        NoConfidenceError
            If a stitch of the route has no confidence head, or for ``inverse``.
        ZeroVectorError, NonFiniteOutputError
            As :meth:`translate`.
        """
        y, confidence, ood, _ = self.run(x, normalize=normalize, scored=True)
        assert confidence is not None and ood is not None
        return y, confidence, ood

    def run(self, x: np.ndarray, *, normalize: bool = False, scored: bool = False) -> Translation:
        """:meth:`translate` (:meth:`translate_scored` when ``scored``), with the rows the
        route scaled to unit length before its first stitch: what an answer's
        ``rescaled_inputs`` counts, known from the forward's own check (no second pass).

        Raises
        ------
        NoConfidenceError
            With ``scored``, as :meth:`translate_scored`.
        ZeroVectorError, NonFiniteOutputError
            As :meth:`translate`.
        """
        if scored:
            problem = self.confidence_problem()
            if problem is not None:
                raise NoConfidenceError(problem, param="return_confidence")
        if self.sync_free or len(x) <= CPU_BLOCK_ROWS:
            return self._run(x, normalize, scored)
        blocks = range(0, len(x), CPU_BLOCK_ROWS)
        return Translation.joined(
            [self._run(x[i : i + CPU_BLOCK_ROWS], normalize, scored, offset=i) for i in blocks]
        )

    def _run(self, x: np.ndarray, normalize: bool, scored: bool, offset: int = 0) -> Translation:
        """:meth:`run` of rows ``offset`` on of the request, all at once (the errors name
        their rows in the request)."""
        zeros: list[tuple[int, Tensor]] = []
        confidence: Tensor | None = None
        ood: Tensor | None = None
        rescaled: Tensor | None = None
        with torch.inference_mode():
            y = _to_device(x, self.device)
            for hop, entry in enumerate(self.entries):
                if self.sync_free:
                    if hop == 0:  # from the host copy: nothing read back from the device
                        host = torch.from_numpy(x)
                        rescaled = rescaled_rows(entry.stitch, host, inverse=self.inverse)
                    y, zero = scale_to_unit(entry.stitch, y, inverse=self.inverse)
                    if zero is not None:
                        zeros.append((hop, zero))
                else:
                    try:
                        y, rows = normalize_input_rows(entry.stitch, y, inverse=self.inverse)
                    except ZeroVectorError as error:
                        raise self._zero_row(hop, offset + error.row) from None
                    if hop == 0:
                        rescaled = rows
                source = y.to(entry.dtype)
                # confidence_problem() checked every head (and the direction)
                if scored and entry.stitch.confidence_head is not None:
                    y, score, far = entry.stitch.forward_scored(source)
                    confidence = score if confidence is None else confidence * score
                    ood = far if ood is None else ood | far
                else:
                    run = oriented(entry.stitch, inverse=self.inverse)[0]
                    y = forward_batch_invariant(run, source)
            if normalize:
                y = unit_rows(y)
            extra = [] if confidence is None or ood is None else [confidence.float(), ood]
            out, masks = _to_host(y, [zero for _, zero in zeros] + extra)
        scores = masks[len(zeros) :]
        for (hop, _), mask in zip(zeros, masks, strict=False):
            if mask.any():
                raise self._zero_row(hop, offset + int(np.flatnonzero(mask)[0]))
        if not np.isfinite(out).all():  # NumPy: ~10x faster than torch.isfinite on CPU
            row = offset + int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
            raise NonFiniteOutputError(
                f"the stitch produced NaN or infinity for input[{row}] "
                "(are its values far outside the source model's range?)",
                param=f"input[{row}]",
            )
        first = None if rescaled is None else rescaled.numpy()
        if not scores:
            return Translation(out, rescaled=first)
        return Translation(out, scores[0], scores[1], first)

    def _zero_row(self, hop: int, row: int) -> ZeroVectorError:
        """The error for ``input[row]`` reaching stitch number ``hop`` as a zero vector."""
        if hop == 0:
            return zero_vector_error(row)
        return ZeroVectorError(
            f"stitch {self.entries[hop - 1].id} mapped input[{row}] to a zero vector, which "
            f"stitch {self.entries[hop].id} (fitted on unit-length vectors) cannot take",
            row=row,
            param=f"input[{row}]",
        )


def _to_device(x: np.ndarray, device: torch.device) -> Tensor:
    """``x`` on ``device``: on a GPU through pinned memory, the copy queued (not awaited)."""
    host = torch.from_numpy(x)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _to_host(y: Tensor, masks: list[Tensor]) -> tuple[np.ndarray, list[np.ndarray]]:
    """``y`` as float32 and ``masks`` on the host; from a GPU through pinned buffers with one
    synchronisation for all of them."""
    y = y.to(torch.float32)
    if y.device.type != "cuda":
        return y.numpy(), [mask.numpy() for mask in masks]
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (y, *masks)]
    for buffer, tensor in zip(pinned, (y, *masks), strict=True):
        buffer.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(y.device).synchronize()
    return pinned[0].numpy(), [buffer.numpy() for buffer in pinned[1:]]


#: A stitch is served in a reduced precision (``LEAD_DTYPE=float16`` / ``bfloat16``) only
#: when its answers on the probe batch keep at least this cosine to its float32 answers.
REDUCED_PRECISION_MIN_COSINE = 0.999
#: ... and, for a stitch with a confidence head, its confidences move by at most this much.
REDUCED_PRECISION_MAX_CONFIDENCE_DRIFT = 0.05


def serving_copy(stitch: Stitch, device: torch.device, dtype: torch.dtype) -> Stitch:
    """``stitch`` on ``device`` in ``dtype`` where the stitch allows it, else in float32.

    A reduced precision halves the memory traffic of a GPU forward, but a stitch whose
    weights or activations leave its range (float16 overflows at 65,504), whose inputs sit
    close to their mean (centring cancels digits) or whose map is ill-conditioned loses its
    answers: the reduced copy is compared with float32 on a seeded probe batch
    (:func:`_probe_batch`; both directions of an invertible stitch) and kept only when
    every row's cosine to the float32 answer is at least
    :data:`REDUCED_PRECISION_MIN_COSINE` and, for a stitch with a confidence head, no
    row's confidence moves by more than :data:`REDUCED_PRECISION_MAX_CONFIDENCE_DRIFT`.

    Parameters
    ----------
    stitch : Stitch
        In float32 (as loaded); moved to ``device`` in place.
    device : torch.device
    dtype : torch.dtype
        The precision asked for (``LEAD_DTYPE``).

    Returns
    -------
    Stitch
        In eval mode: ``stitch`` itself (float32), or a copy in ``dtype``.
    """
    stitch = stitch.to(device=device, dtype=torch.float32).eval()
    if dtype == torch.float32:
        return stitch
    reduced = copy.deepcopy(stitch).to(dtype=dtype)
    head = stitch.confidence_head
    if head is not None:  # quadratic forms: kept in float32, whatever the stitch runs in
        reduced.confidence_head = head
    directions = [False, True] if isinstance(stitch, InvertibleStitch) else [False]
    worst, drift = 1.0, 0.0
    with torch.inference_mode():
        for inverse in directions:
            exact_run, d_in, _ = oriented(stitch, inverse=inverse)
            approx_run = oriented(reduced, inverse=inverse)[0]
            mean = getattr(stitch, "target_mean" if inverse else "source_mean", None)
            typical = None if inverse else stitch.typical_inputs()
            x = _probe_batch(d_in, mean, typical).to(device)
            exact, approx = exact_run(x), approx_run(x.to(dtype))
            cosine = nn.functional.cosine_similarity(exact, approx.float(), dim=1)
            finite = bool(torch.isfinite(approx).all() and torch.isfinite(cosine).all())
            worst = min(worst, float(cosine.min())) if finite else float("nan")
            if not finite:
                break
            if head is not None and not inverse:  # the confidences must hold too
                # as served: the reduced stitch's forward and confidence of the rounded input
                moved = stitch.forward_scored(x)[1] - reduced.forward_scored(x.to(dtype))[1]
                drift = max(drift, float(moved.abs().max()))
    if worst >= REDUCED_PRECISION_MIN_COSINE and drift <= REDUCED_PRECISION_MAX_CONFIDENCE_DRIFT:
        return reduced  # False for NaN
    logger.warning(
        "stitch %s → %s runs in float32, not %s: on the probe batch its answers reach a "
        "cosine of only %.4f to the float32 ones (need %s) or its confidences move by %.3f "
        "(at most %s)",
        stitch.info.source_model,
        stitch.info.target_model,
        str(dtype).removeprefix("torch."),
        worst,
        REDUCED_PRECISION_MIN_COSINE,
        drift,
        REDUCED_PRECISION_MAX_CONFIDENCE_DRIFT,
    )
    return stitch


#: Most of a stitch's own typical inputs (:meth:`Stitch.typical_inputs`) in the probe.
PROBE_TYPICAL_ROWS = 32


def _probe_batch(d: int, mean: Tensor | None, typical: Tensor | None = None) -> Tensor:
    """64 seeded unit rows of dimension ``d``: 32 in every direction, and 32 around the
    direction of ``mean`` (the training inputs' mean), where real embeddings sit (those of
    multilingual-e5-small have a mean of norm 0.89): centring them cancels most of their
    digits, which a reduced precision may not survive while isotropic rows do. Then up to
    :data:`PROBE_TYPICAL_ROWS` of ``typical`` (real training inputs, evenly spaced):
    synthetic rows are all out of distribution for some confidence heads, and a flagged
    row's confidence is 0 in any precision, so only real ones test the confidences."""
    generator = torch.Generator().manual_seed(0)
    noise = nn.functional.normalize(torch.randn(64, d, generator=generator), dim=1)
    rows = [noise]
    if mean is not None and bool(mean.detach().abs().sum() > 0):
        centre = nn.functional.normalize(mean.detach().float().cpu().reshape(1, d), dim=1)
        rows = [noise[:32], nn.functional.normalize(centre + 0.5 * noise[32:], dim=1)]
    if typical is not None and len(typical):
        step = max(1, len(typical) // PROBE_TYPICAL_ROWS)
        rows.append(typical.detach().float().cpu()[::step][:PROBE_TYPICAL_ROWS])
    return torch.cat(rows)


def probe_stitch(stitch: Stitch, device: torch.device) -> None:
    """Run the test vector through ``stitch``: a fixed, seeded batch of two unit vectors.

    Raises
    ------
    StitchFormatError
        If the output has the wrong shape.
    NonFiniteOutputError
        If the output has NaN or infinity.
    """
    generator = torch.Generator().manual_seed(0)
    x = nn.functional.normalize(torch.randn(2, stitch.d_src, generator=generator), dim=1)
    with torch.inference_mode():
        y = stitch(x.to(device=device, dtype=next(stitch.parameters()).dtype))
    if tuple(y.shape) != (2, stitch.d_tgt):
        raise StitchFormatError(
            f"test vector gave output of shape {tuple(y.shape)}, expected (2, {stitch.d_tgt})"
        )
    if not bool(torch.isfinite(y).all()):
        raise NonFiniteOutputError("test vector gave NaN or infinity")


def shortest_chain(
    entries: list[StitchEntry], source: str, target: str
) -> list[StitchEntry] | None:
    """The fewest stitches leading from model ``source`` to ``target`` (None if none).

    ``entries`` must be sorted by preference: ties go to the first stitch found.
    """
    outgoing: dict[str, list[StitchEntry]] = {}
    for entry in entries:  # sorted by preference: deterministic tie-breaking
        outgoing.setdefault(entry.source_model, []).append(entry)
    previous: dict[str, StitchEntry | None] = {source: None}
    queue = deque([source])
    while queue:
        model = queue.popleft()
        if model == target:
            path: list[StitchEntry] = []
            step = previous[model]
            while step is not None:
                path.append(step)
                step = previous[step.source_model]
            return path[::-1]
        for entry in outgoing.get(model, []):
            if entry.target_model not in previous:
                previous[entry.target_model] = entry
                queue.append(entry.target_model)
    return None
