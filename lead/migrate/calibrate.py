"""``calibrate``: fit a stitch on a paired sample of a store and say go or no-go.

The user holds the new model's vectors for some of the store's ids (a file, a second
column or collection: any store URI, :mod:`lead.migrate.stores`). Those ids are paired with
the source store's (:func:`~lead.migrate._pairs.paired_sample`), part of them is held out
(:func:`lead.splits.holdout_split`), a stitch is fitted on the rest with any method of
``lead fit`` (:func:`lead.fitting.fit_stitch`) and scored on the held-out pairs
(:func:`lead.scorecard.score_stitch`: R², cosine, top-1, the baselines; with queries,
retrieval of the held-out documents against the bound,
:func:`~lead.migrate.quality.retrieval_against_bound`), and a confidence head is calibrated
on them for ``apply --confidence-column`` (:func:`lead.confidence.attach_confidence`; with
fewer than 50 held-out pairs none, the reason in ``fit.no_confidence``). The thresholds of
:mod:`lead.migrate.quality` decide go / no-go. The stitch is saved either way
(:func:`lead.artifacts.save_stitch`), with the scorecard, the held-out ids, the ids it was
fitted on and the decision in its ``config.json``, so a no-go can be inspected, refitted or
overridden, and ``verify`` can leave the fitted ids out (:func:`fitted_ids`).

Without such vectors, LEAD can embed a random sample of the store's texts with the new
model itself (``embed_model``, :mod:`lead.migrate.embed`); the fit record then says so.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lead._apply import apply_stitch
from lead._options import MAX_SEED, check_float_option, check_int_option
from lead.artifacts import CONFIG_FILE, read_stitch_config, save_stitch
from lead.confidence import attach_confidence
from lead.errors import ConflictError, InvalidInputError, StitchFormatError
from lead.fitting import check_method_options, fit_stitch
from lead.migrate._pairs import paired_sample
from lead.migrate.embed import check_embed_args, embedded_pairs
from lead.migrate.quality import (
    Check,
    RetrievalQueries,
    check_thresholds,
    evaluate,
    retrieval_against_bound,
)
from lead.migrate.registry import open_source
from lead.migrate.stores import source_identity
from lead.scorecard import CORE_METRICS, RetrievalData, score_stitch
from lead.splits import MIN_SPLIT_SIDE, holdout_split
from lead.stitches import StitchInfo

__all__ = ["CalibrateResult", "fitted_ids", "min_pairs", "run_calibrate"]


@dataclass(frozen=True)
class CalibrateResult:
    """What :func:`run_calibrate` fitted, measured and decided.

    Attributes
    ----------
    passed : bool
        Go: every check met.
    out : Path
        The saved stitch folder.
    checks : list of Check
    scorecard : dict
        :meth:`lead.scorecard.Scorecard.to_dict` of the held-out pairs.
    retrieval : dict or None
        :func:`~lead.migrate.quality.retrieval_against_bound` of the held-out documents.
    fit : dict
        The fit record saved with the stitch (``config.json``'s ``fit``).
    """

    passed: bool
    out: Path
    checks: list[Check]
    scorecard: dict[str, Any]
    retrieval: dict[str, Any] | None
    fit: dict[str, Any]

    @property
    def decision(self) -> str:
        return "go" if self.passed else "no-go"

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "passed": self.passed,
            "stitch": str(self.out),
            "checks": [c.as_dict() for c in self.checks],
            "scorecard": self.scorecard,
            "retrieval": self.retrieval,
            "fit": self.fit,
        }


def min_pairs(holdout: float) -> int:
    """Fewest pairs a ``holdout`` split accepts (:data:`lead.splits.MIN_SPLIT_SIDE` a side)."""
    n = 2 * MIN_SPLIT_SIDE
    while min(round(n * holdout), n - round(n * holdout)) < MIN_SPLIT_SIDE:
        n += 1
    return n


def _check_out(out: Path, force: bool) -> None:
    """Refuse ``out`` before any work as :func:`lead.artifacts.save_stitch` would after it."""
    if not out.exists() or (out.is_dir() and not out.is_symlink() and not any(out.iterdir())):
        return
    if not out.is_dir():
        raise ConflictError(f"{out} is a file, not a folder: choose a folder", param="out")
    if not force:
        raise ConflictError(
            f"{out} exists already and is not empty; pass --force (force=True from Python) "
            "to replace a stitch there, or choose another folder",
            param="out",
        )
    if not (out.is_dir() and (out / CONFIG_FILE).is_file()):
        raise InvalidInputError(
            f"refusing to replace {out}: it is not a stitch folder", param="out"
        )


def run_calibrate(
    source: str,
    native: str | None,
    out: str | Path,
    *,
    method: str = "ridge",
    options: dict[str, Any] | None = None,
    sample: int = 2000,
    holdout: float = 0.2,
    seed: int = 0,
    source_model: str | None = None,
    target_model: str | None = None,
    queries: RetrievalQueries | None = None,
    thresholds: dict[str, Any] | None = None,
    force: bool = False,
    embed_model: str | None = None,
    text_column: str = "text",
    save_native: str | Path | None = None,
    embed_device: str | None = None,
    progress: bool = True,
) -> CalibrateResult:
    """Pair a sample of ids, fit a stitch on part of it, score the rest, decide, save.

    Parameters
    ----------
    source : str
        The store to migrate (its vectors are the stitch's inputs).
    native : str or None
        A store of the new model's vectors for some of the same ids; None with
        ``embed_model``.
    out : str or Path
        The stitch folder to write.
    method : str, default "ridge"
        Any method of :func:`lead.fitting.fit_stitch`; ``options`` are its options.
    sample : int, default 2000
        Random ids drawn from those in both stores (plus the judged documents of
        ``queries`` found in both).
    holdout : float, default 0.2
        Share of the pairs held out for scoring, in (0, 1).
    seed : int, default 0
        Seed of the sample, the split and the fit.
    source_model, target_model : str, optional
        Model ids recorded in the stitch (``target_model`` defaults to ``embed_model``).
    queries : RetrievalQueries, optional
        Queries and judgments: retrieval of the held-out documents against the bound.
    thresholds : dict, optional
        Over the defaults of :mod:`lead.migrate.quality` (None: not checked).
    force : bool, default False
        Replace a stitch already in ``out`` (and a ``save_native`` file).
    embed_model : str, optional
        Instead of ``native``: a sentence-transformers model (a folder, or a Hub id in the
        local cache; never downloaded) that embeds the texts of ``sample`` random ids of
        the source (:func:`lead.migrate.embed.embedded_pairs`); the fit record's
        ``data.embedded`` names the model, the text column and the count.
    text_column : str, default "text"
        Where the source holds the texts (:meth:`lead.migrate.stores.Source.texts`).
    save_native : str or Path, optional
        Keep the embedded sample as a Parquet file (``id``, ``embedding``): a native store
        for ``verify``.
    embed_device : str, optional
        Where the model runs (None: a GPU when there is one).
    progress : bool, default True
        The embedding's progress bar on stderr.

    Returns
    -------
    CalibrateResult
        ``passed`` is the go / no-go; the stitch is saved either way.

    Raises
    ------
    InvalidInputError
        A bad method, option, threshold, ``sample``, ``holdout`` or ``seed``; ``out`` not a
        stitch folder; no query with a judged held-out document; both or neither of
        ``native`` and ``embed_model``; sentence-transformers not installed (``pip install
        'lead-stitch[embed]'``), a model it cannot load, a text that is NULL or a source
        without text; ``native`` the source store itself.
    ConflictError
        ``out`` (or ``save_native``) is not empty and ``force`` is false (checked before any
        work).
    TooFewPairsError
        Fewer ids in both stores than the split needs, naming the rows of each store and
        the count in common.
    ShapeMismatchError, FitError, StoreNotFoundError, StoreError
        As the stores and :func:`lead.fitting.fit_stitch` raise them.
    """
    limits, given = check_thresholds(thresholds)
    options = dict(options or {})
    canonical = check_method_options(method, options)
    holdout = check_float_option(holdout, "holdout", minimum=0.0, inclusive=False, maximum=1.0)
    if holdout >= 1.0:
        raise InvalidInputError("holdout must be below 1", param="holdout")
    fewest = min_pairs(holdout)
    sample = check_int_option(sample, "sample", minimum=1)
    if sample < fewest:  # "sample must be >= 3500" named a setting the user never gave
        raise InvalidInputError(
            f"a holdout of {holdout:g} needs a sample of at least {fewest} pairs (enough to "
            f"fit on what is not held out), got sample {sample}: lower --holdout or raise "
            "--sample",
            param="sample",
        )
    seed = check_int_option(seed, "seed", minimum=0, maximum=MAX_SEED)
    out = Path(out)
    _check_out(out, force)
    saved = check_embed_args(native, embed_model, text_column, save_native, force)
    include = queries.judged_ids() if queries is not None else []
    names = ["source", "native"]
    with ExitStack() as stack:
        src = stack.enter_context(open_source(source))
        if native is not None:
            nat = stack.enter_context(open_source(native))
            if source_identity(nat.info.uri) == source_identity(src.info.uri):
                # it fitted a map of the old model into itself, and passed every gate
                raise InvalidInputError(
                    f"the native store {nat.info.uri} is the source store: give the new "
                    "model's vectors of the same ids (another column, table or file)",
                    param="native",
                )
            paired = paired_sample([src, nat], names, sample, seed, minimum=fewest, include=include)
            uris: dict[str, Any] = {"source": src.info.uri, "native": nat.info.uri}
        else:
            assert embed_model is not None
            paired, record = embedded_pairs(
                src,
                embed_model,
                text_column,
                sample,
                seed,
                minimum=fewest,
                include=include,
                device=embed_device,
                progress=progress,
                save=saved,
            )
            uris = {"source": src.info.uri, "native": record["saved"], "embedded": record}
            target_model = target_model or embed_model
    X, Y = paired.vectors
    train, test = holdout_split(len(paired.ids), holdout, seed)
    train_ids = [paired.ids[i] for i in train]
    test_ids = [paired.ids[i] for i in test]
    info = StitchInfo(
        source_model=source_model or StitchInfo.source_model,
        target_model=target_model or StitchInfo.target_model,
        fit={
            "data": {
                **uris,
                "pairs": len(paired.ids),
                "rows": dict(zip(names, paired.rows, strict=True)),
                "sample": sample,
            },
            "holdout": {
                "fraction": holdout,
                "seed": seed,
                "train_pairs": len(train),
                "test_pairs": len(test),
                "ids": test_ids,
            },
        },
    )
    stitch = fit_stitch(X[train], Y[train], canonical, info=info, seed=seed, **options)
    train_mean = Y[train].astype(np.float64).mean(axis=0)
    data = None
    if queries is not None:
        data = RetrievalData(
            target_queries=queries.target_queries,
            query_ids=list(queries.query_ids),
            corpus_ids=test_ids,
            qrels=queries.qrels,
            source_queries=queries.source_queries,
        )
    card = score_stitch(stitch, X[test], Y[test], target_train_mean=train_mean, retrieval=data)
    # a confidence per vector (``lead migrate apply --confidence-column``), calibrated on the
    # held-out pairs as ``lead fit`` and jobs do; with too few of them, the reason instead
    confidence = attach_confidence(stitch, X[train], Y[train], X[test], Y[test], seed=seed)
    retrieval = None
    if queries is not None:
        translated = apply_stitch(stitch, X[test]).cpu().numpy()
        retrieval = retrieval_against_bound(queries, test_ids, translated, Y[test], X[test])
    scorecard = card.to_dict()
    checks = evaluate(
        limits,
        given,
        {name: scorecard[name] for name in CORE_METRICS},
        baseline_cosine=scorecard["baselines"]["mean_estimator"]["mean_cosine_similarity"],
        retention=None if retrieval is None else retrieval["ndcg_at_10_retention"],
    )
    passed = all(c.passed for c in checks)
    stitch.info.scorecard = scorecard
    stitch.info.fit["calibration"] = {
        "decision": "go" if passed else "no-go",
        "checks": [c.as_dict() for c in checks],
        "retrieval": retrieval,
        "confidence": confidence,
        "fitted_ids": train_ids,
        # the mean estimator's prediction: verify --stitch measures R² against it too
        "target_train_mean": train_mean.tolist(),
    }
    save_stitch(stitch, out, overwrite=force)
    return CalibrateResult(passed, out, checks, scorecard, retrieval, dict(stitch.info.fit))


def fitted_ids(stitch_folder: str | Path) -> list[str]:
    """The ids a stitch made by :func:`run_calibrate` was fitted on, to leave out of verify.

    Parameters
    ----------
    stitch_folder : str or Path
        A local stitch folder.

    Returns
    -------
    list of str
        The ids, as text, recorded in ``config.json`` (``fit.calibration.fitted_ids``);
        empty for a stitch that ``calibrate`` did not make (``lead fit``, the bundled ones),
        whose training pairs are not ids of a store.

    Raises
    ------
    StitchNotFoundError
        No folder at ``stitch_folder``.
    StitchFormatError
        A ``config.json`` that is missing or malformed, or a calibration record without a
        list of fitted ids.
    """
    config = read_stitch_config(stitch_folder)
    fit = config.get("fit")
    calibration = fit.get("calibration") if isinstance(fit, dict) else None
    if calibration is None:
        return []
    ids = calibration.get("fitted_ids") if isinstance(calibration, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise StitchFormatError(
            f"{Path(stitch_folder) / CONFIG_FILE} has a calibration record without a list of "
            "fitted_ids (text): calibrate the stitch again to record them",
            param="stitch",
        )
    return list(ids)
