"""``plan``: what a source holds and what migrating it will cost, before anything is written.

The row count, dimension, NULL rows and id kind come from the store's metadata (a pgvector
``count(*)``, Parquet footers). Problems a migration would refuse (NULL vectors, NaN,
duplicate ids, a dimension the stitch does not take, and all-zero vectors for a stitch
fitted on unit-length vectors, those among the probe rows named by id) are listed rather
than raised, so a plan always comes back; ``apply``'s own check refuses a zero vector
anywhere in the source before it writes anything. Time is estimated from one batch read
and translated here (at most :data:`PROBE_ROWS` rows), scaled linearly to the
table; the write side is assumed to cost what the read side did per byte, scaled by the
output / input size. It is an estimate from a probe: ``apply``'s progress bar shows the
real rate.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lead.errors import InvalidInputError, LeadError, ZeroVectorError
from lead.migrate.apply import check_dims, check_go, column_where
from lead.migrate.stores import Source, zero_rows
from lead.migrate.translator import Translator, describe

__all__ = ["PROBE_ROWS", "PlanResult", "run_plan"]

#: rows read and translated to estimate the time
PROBE_ROWS = 4096
#: Rows translated once before the probe is timed.
WARM_UP_ROWS = 8
#: bytes per output value by target vector type
_VALUE_BYTES = {"vector": 4, "float32": 4, "halfvec": 2, "float16": 2}
#: zero-vector ids a problem names at most
_SHOWN_IDS = 10
#: pgvector stores a row with a 24-byte tuple header, an 8-byte id and a 4-byte vector header
_ROW_OVERHEAD = 24 + 8 + 8


@dataclass(frozen=True)
class PlanResult:
    """A migration plan (:func:`run_plan`).

    Attributes
    ----------
    source : dict
        ``uri``, ``rows``, ``dim`` (None for a source without a vector whose type gives no
        dimension, e.g. an empty Parquet list column), ``id_kind``, ``null_rows``,
        ``vector_type``.
    stitch : dict
        ``stitch``, ``stitch_sha256``, models and dimensions.
    rows_to_translate : int
    output_bytes : int
        Estimated size of the translated vectors (values and per-row overhead), bytes.
    estimated_seconds : float or None
        From a probe batch; None for an empty source, or when no row of the probe batch
        could be translated.
    probe : dict
        ``rows``, ``read_rows_per_second``, ``translate_rows_per_second`` (absent when no
        row could be translated).
    problems : list of str
        What ``apply`` would refuse; empty when it can run. Zero vectors (for a stitch
        fitted on unit-length vectors) are named by id among the probe rows only.
    notes : list of str
        What ``apply`` will do that a user may not expect (ids that are row numbers).
    """

    source: dict[str, Any]
    stitch: dict[str, Any]
    rows_to_translate: int
    output_bytes: int
    estimated_seconds: float | None
    probe: dict[str, Any]
    problems: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "source": self.source,
            "stitch": self.stitch,
            "rows_to_translate": self.rows_to_translate,
            "output_bytes": self.output_bytes,
            "estimated_seconds": self.estimated_seconds,
            "probe": self.probe,
            "problems": self.problems,
            "notes": self.notes,
        }


def run_plan(
    source: Source,
    translator: Translator,
    *,
    skip_null: bool = False,
    output_type: str = "vector",
    check: bool = True,
    column: str = "the source column",
) -> PlanResult:
    """Describe ``source``, probe the translation and estimate the migration.

    Parameters
    ----------
    source : Source
    translator : Translator
    skip_null : bool, default False
        Whether ``apply`` will be run with ``--skip-null`` (NULL rows are then not a problem).
    output_type : {"vector", "halfvec", "float32", "float16"}
        How the target stores values (4 or 2 bytes each).
    check : bool, default True
        Run the source's full check (NULL, NaN, duplicate ids); for files this reads every
        row once.
    column : str
        How problems name the source column.

    Returns
    -------
    PlanResult

    Raises
    ------
    InvalidInputError
        An unknown ``output_type``.
    """
    if output_type not in _VALUE_BYTES:
        raise InvalidInputError(f"unknown output type {output_type!r}", param="type")
    info = source.info
    problems: list[str] = []
    try:
        check_go(translator, allow_no_go=False)
    except LeadError as error:
        problems.append(error.message)
    try:
        check_dims(source, translator, column)
    except LeadError as error:
        problems.append(error.message)
    if check and not problems:
        try:
            source.check(skip_null=skip_null)
        except LeadError as error:
            problems.append(error.message)
    rows = info.rows - ((info.null_rows or 0) if skip_null else 0)
    d_out = translator.ref.d_out
    output_bytes = rows * (d_out * _VALUE_BYTES[output_type] + _ROW_OVERHEAD)
    probe: dict[str, Any] = {"rows": 0}
    estimate = None
    if rows and not problems:
        probe, estimate, failed = _probe(source, translator, rows, column)
        problems += failed
    # a list column without a fixed size and no vector in it tells no dimension
    unknown_dim = info.dim == 0 and info.rows == (info.null_rows or 0)
    source_info = {
        "uri": info.uri,
        "rows": info.rows,
        "dim": None if unknown_dim else info.dim,
        "id_kind": info.id_kind,
        "null_rows": info.null_rows,
        "vector_type": info.vector_type,
    }
    notes = list(getattr(source, "notes", []))
    if unknown_dim:
        notes.append(
            f"{column_where(source, column)} holds no vector, so its dimension is unknown "
            "(dim: null): "
            "there is nothing to translate"
        )
    return PlanResult(
        source_info, describe(translator), rows, output_bytes, estimate, probe, problems, notes
    )


def _timed(translator: Translator, vectors: np.ndarray) -> float:
    """Seconds to translate ``vectors``, after a first call on a few of them: the first call
    of a process pays one-time costs, which the estimate must not scale to every batch (a
    new user's first plan estimated ~4x the time its apply took). The rows are translated
    in two halves and the faster half's rate counts: the first large batch still pays for
    buffers and threads that later ones reuse (estimates of one file varied 2-8 s against
    an apply of ~1 s)."""
    with contextlib.suppress(LeadError):  # the timed calls raise it again
        translator(vectors[:WARM_UP_ROWS])
    half = max(1, len(vectors) // 2)
    rates = []
    for part in (vectors[:half], vectors[half:]):
        if len(part):
            started = time.perf_counter()
            translator(part)
            rates.append((time.perf_counter() - started) / len(part))
    return min(rates) * len(vectors)


def _zero_problem(ids: np.ndarray, probed: int, rows: int, column: str) -> str:
    shown = ", ".join(str(i) for i in ids[:_SHOWN_IDS].tolist())
    more = f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else ""
    where = (
        f"{len(ids)} of the {probed} rows"
        if probed >= rows
        else f"{len(ids)} of the first {probed} rows read; the other {rows - probed} were not "
        "searched for them"
    )
    return (
        f"the vectors of ids {shown}{more} in {column} are all zeros ({where}): the stitch was "
        "fitted on unit-length vectors and cannot scale them, so apply would stop at the "
        "first; remove them, or fill them with real vectors"
    )


def _probe(
    source: Source, translator: Translator, rows: int, column: str
) -> tuple[dict[str, Any], float | None, list[str]]:
    """Read and translate one batch: the probe figures, the estimate (None when the batch
    cannot be translated) and the problems met (zero vectors, named by id)."""
    started = time.perf_counter()
    batches = source.batches(PROBE_ROWS)
    try:
        batch = next(batches, None)
    finally:
        stop = getattr(batches, "close", None)  # a generator: stop reading the store
        if stop is not None:
            stop()
    read = time.perf_counter() - started
    if batch is None or not len(batch.ids):
        return {"rows": 0}, 0.0, []
    n = len(batch.ids)
    problems: list[str] = []
    translate: float | None = None
    try:
        try:
            translate = _timed(translator, batch.vectors)
        except ZeroVectorError:
            # the translator's row counts from a half of the batch (_timed): found again
            zero = zero_rows(batch.vectors)
            if not zero.any():  # not the rows the translator refuses: say what it said
                raise
            problems.append(_zero_problem(batch.ids[zero], n, rows, column))
            if not zero.all():  # time the others, scaled to the whole batch
                translate = _timed(translator, batch.vectors[~zero]) * n / int((~zero).sum())
    except InvalidInputError as error:
        problems.append(f"the first {n} rows of {column} cannot be translated: {error.message}")
        translate = None
    probe: dict[str, Any] = {
        "rows": n,
        "read_rows_per_second": round(n / max(read, 1e-9), 1),
    }
    if translate is None:
        return probe, None, problems
    scale = translator.ref.d_out / max(translator.ref.d_in, 1)
    per_row = (read + read * scale + translate) / n
    probe["translate_rows_per_second"] = round(n / max(translate, 1e-9), 1)
    return probe, round(per_row * rows, 3), problems
