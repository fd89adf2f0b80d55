"""Migrate a vector store to a new embedding model by translating its vectors.

Four steps, run in order (``lead migrate {plan,calibrate,apply,verify}`` on the command line):

1. :func:`plan` — what the source holds and what the migration will cost;
2. :func:`calibrate` — fit a stitch on a paired sample and score it (go / no-go);
3. :func:`apply` — stream every vector through the stitch into a new target, resumably;
4. :func:`verify` — compare translated with native vectors and write a report.

Stores are addressed by URI (:mod:`lead.migrate.stores`): PostgreSQL + pgvector, Qdrant,
Parquet, ``.npy`` and ``.safetensors``. The source is never modified.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lead.migrate.apply import ApplyResult, column_name, run_apply
from lead.migrate.calibrate import CalibrateResult
from lead.migrate.calibrate import run_calibrate as calibrate
from lead.migrate.plan import PlanResult, run_plan
from lead.migrate.quality import RetrievalQueries
from lead.migrate.registry import open_source, open_target
from lead.migrate.translator import LocalTranslator, RemoteTranslator, Translator, make_translator
from lead.migrate.verify import VerifyResult, run_verify

__all__ = [
    "ApplyResult",
    "CalibrateResult",
    "LocalTranslator",
    "PlanResult",
    "RemoteTranslator",
    "RetrievalQueries",
    "Translator",
    "VerifyResult",
    "apply",
    "calibrate",
    "make_translator",
    "open_source",
    "open_target",
    "plan",
    "verify",
]


def apply(
    source: str,
    target: str,
    stitch: str | Path | Translator,
    *,
    server: str | None = None,
    batch_size: int = 8192,
    inverse: bool = False,
    normalize: bool = False,
    skip_null: bool = False,
    allow_no_go: bool = False,
    device: str | None = None,
    progress: Any = True,
    confidence_column: str | None = None,
    api_key: str | None = None,
) -> ApplyResult:
    """Translate every vector of ``source`` into the new ``target``; resume where a run stopped.

    Parameters
    ----------
    source, target : str
        Store URIs (:mod:`lead.migrate.stores`). The target must not exist, or hold the
        checkpoint of this same migration (then the run resumes; a finished one is a no-op).
    stitch : str, Path or Translator
        A stitch folder, a bundled stitch id, a Hub repo id, or (with ``server``) a stitch
        id the server serves; or a ready :class:`Translator`.
    server : str, optional
        Translate through this LEAD server instead of in-process.
    batch_size : int, default 8192
        Rows per read, translation and atomic write.
    inverse, normalize : bool
        Run an invertible stitch backwards; L2-normalise the output rows.
    skip_null : bool, default False
        Leave NULL vectors out instead of refusing them.
    allow_no_go : bool, default False
        Use a stitch that ``calibrate`` judged no-go (refused by default).
    device : str, optional
        ``cpu`` or ``cuda`` for the in-process stitch.
    progress : bool or callable
        A progress bar on stderr, or ``f(rows_done, rows_total)``.
    confidence_column : str, optional
        Also write each row's confidence there (see :func:`lead.migrate.apply.run_apply`);
        the stitch needs a confidence head.
    api_key : str, optional
        With ``server``: its API key (default ``LEAD_API_KEY``).

    Returns
    -------
    ApplyResult

    Raises
    ------
    InvalidInputError, ShapeMismatchError, NonFiniteError, ZeroVectorError
        Bad vectors, ids or settings, found before anything is written (a zero vector
        for a unit-input stitch, when reached).
    StoreNotFoundError, StoreError
        A missing table / collection / file; a store that cannot be reached.
    ConflictError
        A target with other content, or another migration's.
    """
    translator = (
        stitch
        if not isinstance(stitch, str | Path)
        else make_translator(
            stitch,
            server=server,
            inverse=inverse,
            normalize=normalize,
            device=device,
            api_key=api_key,
        )
    )
    try:
        with open_source(source) as src, open_target(target) as tgt:
            return run_apply(
                src,
                tgt,
                translator,
                batch_size=batch_size,
                inverse=inverse,
                normalize=normalize,
                skip_null=skip_null,
                allow_no_go=allow_no_go,
                column=column_name(src),
                progress=progress,
                confidence_column=confidence_column,
            )
    finally:
        if isinstance(stitch, str | Path):
            translator.close()


def plan(
    source: str,
    stitch: str | Path | Translator,
    *,
    server: str | None = None,
    inverse: bool = False,
    skip_null: bool = False,
    output_type: str = "vector",
    check: bool = True,
    api_key: str | None = None,
) -> PlanResult:
    """What ``source`` holds and what migrating it with ``stitch`` costs
    (:func:`lead.migrate.plan.run_plan`); problems are listed, not raised.

    Raises
    ------
    StoreNotFoundError, StoreError
        A missing or unreachable source.
    StitchNotFoundError
        No such stitch.
    """
    translator = (
        stitch
        if not isinstance(stitch, str | Path)
        else make_translator(stitch, server=server, inverse=inverse, api_key=api_key)
    )
    try:
        with open_source(source) as src:
            return run_plan(
                src,
                translator,
                skip_null=skip_null,
                output_type=output_type,
                check=check,
                column=column_name(src),
            )
    finally:
        if isinstance(stitch, str | Path):
            translator.close()


def verify(
    source: str | None,
    target: str,
    native: str,
    *,
    stitch: str | Path | None = None,
    report_dir: str | Path = "lead-verify",
    sample: int = 1000,
    seed: int = 0,
    queries: RetrievalQueries | None = None,
    thresholds: dict[str, Any] | None = None,
    junit: str | Path | None = None,
) -> VerifyResult:
    """``lead migrate verify SOURCE TARGET --native NATIVE``: translated against native
    vectors, with a report in ``report_dir`` (:func:`lead.migrate.verify.run_verify`).

    Parameters
    ----------
    source : str or None
        The migrated store (the source-native half of the bound, with ``queries``).
    target, native : str
        The translated store; the new model's vectors for some of the ids.
    stitch : str or Path, optional
        The stitch the migration applied (a folder, a bundled id or a Hub repo id): a
        sample of source rows is translated again and compared with the target
        (``matches_source``); R² is measured against the mean it was fitted towards; for
        one ``calibrate`` made, the ids it was fitted on are left out of the sample.
    report_dir, sample, seed, queries, thresholds, junit
        As :func:`~lead.migrate.verify.run_verify`; ``queries`` is a
        :class:`~lead.migrate.quality.RetrievalQueries` (query vectors by both models and
        relevance judgments).

    Returns
    -------
    VerifyResult
        ``passed``, ``exit_code``, ``report``.

    Raises
    ------
    TooFewPairsError, ShapeMismatchError, StoreNotFoundError, StoreError, InvalidInputError
    StitchNotFoundError, StitchFormatError
    """
    from lead.artifacts import stitch_folder
    from lead.migrate.calibrate import fitted_ids
    from lead.migrate.verify import stitch_target_mean

    folder = stitch_folder(stitch) if stitch is not None else None
    return run_verify(
        target,
        native,
        sample=sample,
        seed=seed,
        source=source,
        queries=queries,
        thresholds=thresholds,
        report_dir=report_dir,
        junit=junit,
        exclude_ids=fitted_ids(folder) if folder is not None else None,
        # R² against the mean the stitch was fitted towards, as calibrate scored it
        target_train_mean=stitch_target_mean(folder) if folder is not None else None,
        stitch=folder if source is not None else None,
    )
