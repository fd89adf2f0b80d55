"""``apply``: stream every vector of a source store through a stitch into a new target.

Three stages overlap, each with a bounded queue, so memory holds a few batches whatever the
store's size: a thread reads batch k+2 from the source while batch k+1 is translated
(several at once through a server) and batch k is written. Each write lands with the
checkpoint in one atomic step (:meth:`lead.migrate.stores.Target.write`), so a run killed
at any point (SIGKILL included) resumes after the last batch that landed and writes every
row exactly once; a finished migration run again writes nothing.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lead.errors import ConflictError, InvalidInputError, ShapeMismatchError, ZeroVectorError
from lead.migrate.stores import (
    SOURCE_FILES,
    Batch,
    MigrationSpec,
    Progress,
    Source,
    Target,
    source_identity,
)
from lead.migrate.translator import Translator

__all__ = [
    "ApplyResult",
    "check_confidence",
    "check_dims",
    "column_where",
    "migration_spec",
    "run_apply",
]

_DONE = object()


@dataclass(frozen=True)
class ApplyResult:
    """What :func:`run_apply` did.

    Attributes
    ----------
    rows_written : int
        Rows this run wrote.
    rows_total : int
        Rows in the target now.
    resumed_from : int
        Rows already in the target when this run started.
    seconds : float
    """

    target: str
    rows_written: int
    rows_total: int
    resumed_from: int
    seconds: float
    already_done: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "rows_written": self.rows_written,
            "rows_total": self.rows_total,
            "resumed_from": self.resumed_from,
            "seconds": round(self.seconds, 3),
            "already_done": self.already_done,
        }


def check_go(translator: Translator, *, allow_no_go: bool) -> None:
    """Refuse a stitch that ``calibrate`` judged no-go, unless the caller overrides it.

    Raises
    ------
    InvalidInputError
        The stitch's ``config.json`` records a no-go calibration (naming the failed gates).
    """
    calibration = getattr(translator, "calibration", None) or {}
    if allow_no_go or calibration.get("decision") != "no-go":
        return
    failed = [c.get("name", "?") for c in calibration.get("checks", []) if not c.get("passed")]
    raise InvalidInputError(
        f"stitch {translator.ref.name} was judged no-go by calibrate (failed: "
        f"{', '.join(failed) or 'a gate'}); recalibrate, or pass --allow-no-go to use it anyway",
        param="stitch",
    )


def column_name(source: Source) -> str:
    """How messages name ``source``'s vectors: its table or collection and column, its
    Parquet column, or (a ``.npy`` or ``.safetensors`` matrix) its file."""
    return str(getattr(source, "name", None) or getattr(source, "column", None) or source.info.uri)


def column_where(source: Source, column: str) -> str:
    """``column`` named with its source's URI (once, when it is the URI itself)."""
    uri = source.info.uri
    return uri if column == uri else f"{column} of {uri}"


def check_dims(source: Source, translator: Translator, column: str) -> None:
    """Refuse a source whose dimension is not the stitch's input dimension.

    Raises
    ------
    ShapeMismatchError
        Naming the source column and the stitch.
    """
    ref = translator.ref
    info = source.info
    if info.dim == 0 and info.rows == (info.null_rows or 0):
        return  # no vector to tell the dimension (an empty Parquet file): nothing to translate
    if info.dim != ref.d_in:
        raise ShapeMismatchError(
            f"{column_where(source, column)} has dimension {info.dim}, but stitch "
            f"{ref.name} ({ref.source_model} -> {ref.target_model}) expects {ref.d_in}",
            expected=ref.d_in,
            got=info.dim,
            param="stitch",
        )


def check_confidence(translator: Translator, target: Target, name: str | None) -> None:
    """Refuse ``--confidence-column`` where it cannot be written, before anything is.

    Raises
    ------
    InvalidInputError
        An empty name; a translator that cannot score; a stitch without a confidence head
        (or run backwards).
    """
    if name is None:
        return
    if not name.strip():
        raise InvalidInputError("--confidence-column needs a name", param="confidence_column")
    require = getattr(translator, "require_confidence", None)
    if require is None:  # a translator that cannot score (the Ray engine's workers)
        raise InvalidInputError(
            "--confidence-column is not available with this engine", param="confidence_column"
        )
    require()
    target.confidence_column = name


#: How a changed source is left behind (both checks below).
_START_AGAIN = (
    "to migrate the source as it is now, write to a new target (or remove this one and "
    "its checkpoint)"
)


def check_finished_rows(uri: str, rows: int, total: int) -> None:
    """Refuse "already done" for a finished migration of ``rows`` rows when the source now
    has ``total`` rows with a vector (rows were added or deleted since).

    Raises
    ------
    ConflictError
        ``rows != total``.
    """
    if rows != total:
        raise ConflictError(
            f"{uri} holds a finished migration of {rows} rows, but the source now has "
            f"{total}: it changed since (`lead migrate verify` lists the ids that differ); "
            + _START_AGAIN,
            param="target",
        )


def check_written_rows(uri: str, written: int, total: int, resumed: int) -> None:
    """Refuse to mark a migration finished that wrote ``written`` rows (``resumed`` of them
    before it resumed) of a source that had ``total`` rows with a vector when it started:
    rows were added or removed where the run had already read (or behind a resumed run's
    checkpoint), which the target would lack or keep.

    Raises
    ------
    ConflictError
        ``written != total``.
    """
    if written != total:
        before = f" ({resumed} of them before it resumed)" if resumed else ""
        raise ConflictError(
            f"{uri}: the migration wrote {written} rows{before}, but the source had {total} "
            "when the run started: rows were added or removed where it had already read. "
            "The target is not marked finished; " + _START_AGAIN,
            param="source",
        )


def migration_spec(
    source: Source,
    translator: Translator,
    *,
    inverse: bool,
    normalize: bool,
    confidence_column: str | None = None,
) -> MigrationSpec:
    """What the target records about this migration (a resumed run must match it)."""
    ref = translator.ref
    extra = {"source_model": ref.source_model, "target_model": ref.target_model}
    if confidence_column is not None:  # absent otherwise: older targets resume as before
        extra["confidence_column"] = confidence_column
    fingerprint = getattr(source, "fingerprint", None)
    if fingerprint is not None:  # a source read by row position (files)
        extra[SOURCE_FILES] = fingerprint
    return MigrationSpec(
        source=source_identity(source.info.uri),
        stitch=ref.name,
        stitch_sha256=ref.sha256,
        inverse=inverse,
        dim=ref.d_out,
        id_kind=source.info.id_kind,
        normalize=normalize,
        extra=extra,
    )


def _read_ahead(batches: Iterator[Batch], depth: int) -> Iterator[Batch]:
    """Iterate ``batches`` in a thread, up to ``depth`` batches ahead."""
    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def pump() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        box.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(_DONE)
        except BaseException as error:  # handed to the consumer, raised there
            box.put(error)

    thread = threading.Thread(target=pump, name="lead-migrate-read", daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _translate(
    translator: Translator, batch: Batch, column: str, scored: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        if scored:
            out, _, confidence, _ = translator.translate_scored(batch.vectors)  # type: ignore[attr-defined]
            return out, confidence
        return translator(batch.vectors), None
    except ZeroVectorError as error:
        bad = batch.ids[error.row] if 0 <= error.row < len(batch.ids) else "?"
        raise ZeroVectorError(
            f"the vector of id {bad} in {column} is all zeros; the stitch was fitted on "
            "unit-length vectors and cannot scale it",
            row=error.row,
            param=f"{column}[{bad}]",
        ) from None


def _after_zero_vector(source: Source) -> str:
    """What to do once a zero vector stopped a run midway (the rows before it written).
    The source's check refuses zero vectors before anything is written, so only a source
    changed during the run gets here."""
    done = "The rows before it are in the target, which is not marked finished: "
    if getattr(source, "fingerprint", None) is not None:  # files: resumed by row position
        return done + "fix or remove that row in the source file, then " + _START_AGAIN
    return (
        done + "fix or delete that row in the source (or set its vector to NULL and pass "
        "--skip-null), then run the same command again to resume"
    )


def _translated(
    batches: Iterator[Batch], translator: Translator, column: str, scored: bool
) -> Iterator[tuple[Batch, tuple[np.ndarray, np.ndarray | None]]]:
    """Translate batches in order, up to ``translator.concurrency`` at once, in threads:
    batch k+1 is translated while the caller writes batch k."""
    width = max(1, int(translator.concurrency))
    Result = tuple[np.ndarray, np.ndarray | None]
    with ThreadPoolExecutor(width, thread_name_prefix="lead-migrate-translate") as pool:
        pending: deque[tuple[Batch, Future[Result]]] = deque()
        for batch in batches:
            pending.append((batch, pool.submit(_translate, translator, batch, column, scored)))
            if len(pending) > width:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def run_apply(
    source: Source,
    target: Target,
    translator: Translator,
    *,
    batch_size: int = 8192,
    inverse: bool = False,
    normalize: bool = False,
    skip_null: bool = False,
    allow_no_go: bool = False,
    column: str = "the source column",
    progress: Callable[[int, int], None] | bool = True,
    confidence_column: str | None = None,
) -> ApplyResult:
    """Translate every vector of ``source`` into ``target``; resume where a run stopped.

    Parameters
    ----------
    source : Source
        Read only; never modified.
    target : Target
        Created, or resumed when it holds this migration's checkpoint.
    translator : Translator
        In-process or through a server (:mod:`lead.migrate.translator`).
    batch_size : int, default 8192
        Rows per read, translation and atomic write.
    skip_null : bool, default False
        Leave rows whose vector is NULL out of the target; by default they are refused.
    allow_no_go : bool, default False
        Use a stitch that ``calibrate`` judged no-go (refused by default).
    column : str
        How errors name the source column.
    progress : bool or callable, default True
        A progress bar on stderr with rate and ETA; or ``f(rows_done, rows_total)``.
    confidence_column : str, optional
        Also write each row's confidence (float32 in [0, 1], from the stitch's
        :class:`~lead.confidence.ConfidenceHead`) there: a ``real`` column of the pgvector
        table, a payload field of the Qdrant points, a column of the Parquet parts; in
        the same atomic step as the vectors.

    Returns
    -------
    ApplyResult

    Raises
    ------
    InvalidInputError
        ``batch_size`` below 1; ``confidence_column`` with a stitch that has no confidence
        head, or through a server; NULL vectors (without ``skip_null``), non-finite values or
        duplicate ids in the source, found before anything is written.
    ShapeMismatchError
        The source's dimension is not the stitch's.
    ConflictError
        The target exists with other content, or holds another migration, or a finished
        migration of another number of rows than the source holds now; or the run wrote
        another number of rows than the source held when it started (rows added or removed
        behind it: the target is not marked finished).
    ZeroVectorError
        A zero vector for a stitch fitted on unit-length vectors (naming its id).
    """
    if batch_size < 1:
        raise InvalidInputError(
            f"batch size must be at least 1, got {batch_size}", param="batch_size"
        )
    started = time.perf_counter()
    check_go(translator, allow_no_go=allow_no_go)
    check_confidence(translator, target, confidence_column)
    check_dims(source, translator, column)
    source.check(skip_null=skip_null, zero_rows=translator.ref.unit_input)
    spec = migration_spec(
        source,
        translator,
        inverse=inverse,
        normalize=normalize,
        confidence_column=confidence_column,
    )
    state = target.open(spec, source.info)  # writes nothing yet: the first batch creates
    resumed = state.rows_written
    nulls = source.info.null_rows or 0
    total = source.info.rows - (nulls if skip_null else 0)
    if state.done:
        check_finished_rows(target.uri, resumed, total)
        return ApplyResult(target.uri, 0, resumed, resumed, time.perf_counter() - started, True)
    # a target that fills rows of an existing table / collection checks that every source
    # id is one of them, before anything is written
    check_source = getattr(target, "check_source", None)
    if check_source is not None:
        check_source(source)
    create_column = getattr(target, "create_column", None)
    if create_column is not None:
        # before the source streams: a new column of the table being read needs a lock
        # that the read holds until it is drained (the run waited on itself for good)
        create_column()
    report, close = _progress(progress, total, resumed)
    written = resumed
    try:
        reader = _read_ahead(source.batches(batch_size, after=state.position), depth=2)
        scored = confidence_column is not None
        for batch, (out, confidence) in _translated(reader, translator, column, scored):
            written += len(batch.ids)
            state = Progress(position=batch.position, rows_written=written)
            if scored:
                target.write(batch.ids, out, state, confidence)
            else:
                target.write(batch.ids, out, state)
            report(written)
    except ZeroVectorError as error:  # the rows before it are written: say what next
        raise ZeroVectorError(
            f"{error.message}. {_after_zero_vector(source)}", row=error.row, param=error.param
        ) from None
    else:
        check_written_rows(target.uri, written, total, resumed)
        target.finish(Progress(position=state.position, rows_written=written, done=True))
    finally:
        close()
    seconds = time.perf_counter() - started
    return ApplyResult(target.uri, written - resumed, written, resumed, seconds, False)


def _progress(
    progress: Callable[[int, int], None] | bool, total: int, initial: int
) -> tuple[Callable[[int], None], Callable[[], None]]:
    if callable(progress):
        callback = progress
        return (lambda done: callback(done, total)), (lambda: None)
    if not progress:
        return (lambda done: None), (lambda: None)
    from tqdm import tqdm

    bar = tqdm(
        total=total, initial=initial, unit="vec", unit_scale=True, desc="apply", file=sys.stderr
    )

    def update(done: int) -> None:
        bar.update(done - bar.n)

    return update, bar.close
