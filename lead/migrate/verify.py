"""``verify``: compare the translated vectors of a migrated store with native ones.

A sample of ids present in both the translated target and a store of *native* vectors (the
same documents embedded by the new model, for some ids at least) is fetched from both and
graded with the scorecard's figures (:func:`lead.scorecard.core_scores`): per-vector cosine
and its distribution, R² against the mean estimator, top-1 and mean rank of each translated
vector finding its own native vector among all sampled ones. With queries and judgments
(:class:`~lead.migrate.quality.RetrievalQueries`), retrieval over the sampled documents is
graded against the bound, the weaker of source-native and target-native retrieval
(:func:`~lead.migrate.quality.retrieval_against_bound`); the judged documents found in
every store join the sample so that each query has its relevant documents to find.

Native vectors of the ids the stitch was fitted on flatter every figure, so ``exclude_ids``
(for a stitch made by ``calibrate``, :func:`~lead.migrate.calibrate.fitted_ids`) are never
sampled, neither drawn nor joined as judged documents: every figure, retrieval included,
is then measured on documents the stitch has not seen.

Given the ``source`` store, verify also checks that the target is complete
(:func:`~lead.migrate.quality.completeness_check`): as many vectors as the source has rows
with a vector (its rows less its NULL ones), and the same ids (``same_ids``: every id of
both stores is listed, one pass each; the report names the first ids missing from the
target and the first it holds that the source does not), so a migration that stopped
part-way, or a target of other rows, fails even when every sampled vector is right. Given
the stitch too, a random sample of the ids in both is translated again from the source and
compared with the target (``matches_source``): a target row whose cosine to the stitch's
translation of its source row is below :data:`MATCH_COSINE` (a row replaced or edited in
place, in either store, since the migration) fails it.

The thresholds and their defaults are those of :mod:`lead.migrate.quality`. The report
goes to ``report.json``, ``report.md`` and ``cosine.png`` in ``report_dir`` (and JUnit XML
when asked), each written atomically; a failed check makes ``passed`` false and
``exit_code`` 1, so a CI step can gate a migration on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lead._metric_inputs import MIN_PAIRS, _pair, _unit_rows
from lead._options import MAX_SEED, check_int_option
from lead._version import __version__
from lead.errors import (
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    TooFewPairsError,
)
from lead.migrate._pairs import _every_key, paired_sample
from lead.migrate.quality import (
    Check,
    RetrievalQueries,
    check_thresholds,
    completeness_check,
    evaluate,
    retrieval_against_bound,
)
from lead.migrate.registry import open_source
from lead.migrate.report import (
    NO_PLOT,
    junit_xml,
    markdown_report,
    plot_cosines,
    write_json,
    write_text,
)
from lead.migrate.stores import Source
from lead.scorecard import core_scores

__all__ = ["MATCH_COSINE", "WORST_ROWS", "VerifyResult", "run_verify", "stitch_target_mean"]

#: How many of the lowest-cosine ids the report names (and of the ids that differ).
WORST_ROWS = 10
#: A target row matches its source row when its cosine to the stitch's translation of that
#: row is at least this: the stored vector may be L2-normalised (``--normalize``) or rounded
#: (a ``halfvec`` column, float16 Parquet: cosine > 0.99999), while a row replaced by
#: another document's vector or edited in place falls far below.
MATCH_COSINE = 0.9999
JSON_FILE, MARKDOWN_FILE, PLOT_FILE = "report.json", "report.md", "cosine.png"


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`run_verify` found and wrote.

    Attributes
    ----------
    passed : bool
        Every check met.
    checks : list of Check
    report : dict
        The content of ``report.json``.
    files : dict of str to Path
        ``json``, ``markdown``, and ``plot`` and ``junit`` when written.
    """

    passed: bool
    checks: list[Check]
    report: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when every check passed, else 1 (a LEAD error exits 2)."""
        return 0 if self.passed else 1

    def as_dict(self) -> dict[str, Any]:
        return {**self.report, "report_files": {k: str(v) for k, v in self.files.items()}}


def _cosines(native: np.ndarray, translated: np.ndarray) -> np.ndarray:
    """Per-row cosine, as :func:`lead.metrics.mean_cosine_similarity` averages it."""
    T, P = _pair(native, translated, ("native", "translated"), same_dim=True)
    cos = (_unit_rows(T) * _unit_rows(P)).sum(dim=1).clamp(-1.0, 1.0)
    return np.asarray(cos.cpu().numpy(), dtype=np.float64)


def _figures(
    ids: list[str], native: np.ndarray, translated: np.ndarray, mean: np.ndarray | None
) -> tuple[dict[str, float], dict[str, float], dict[str, Any], np.ndarray]:
    """Core scores, the mean-estimator's (``mean``, else the sample's own), the cosine
    distribution and the cosines."""
    if mean is None:
        mean = native.astype(np.float64).mean(axis=0)
    scores = core_scores(native, translated, target_train_mean=mean)
    baseline = core_scores(native, np.tile(mean, (len(native), 1)), target_train_mean=mean)
    cosines = _cosines(native, translated)
    worst = np.argsort(cosines, kind="stable")[:WORST_ROWS]
    distribution = {
        "mean": float(cosines.mean()),
        "p5": float(np.percentile(cosines, 5)),
        "p50": float(np.percentile(cosines, 50)),
        "min": float(cosines.min()),
        "worst": [{"id": ids[i], "cosine": float(cosines[i])} for i in worst],
    }
    return scores, baseline, distribution, cosines


def _train_mean(mean: Any, native: np.ndarray) -> np.ndarray:
    """``target_train_mean`` as float64 of shape ``(d,)``, finite, ``d`` the native one's."""
    out = np.asarray(mean, dtype=np.float64)
    if out.shape != (native.shape[1],):
        raise ShapeMismatchError(
            f"target_train_mean must have shape ({native.shape[1]},), got {out.shape}",
            expected=native.shape[1],
            got=out.shape,
            param="target_train_mean",
        )
    if not np.isfinite(out).all():
        raise NonFiniteError("target_train_mean holds NaN or infinity", param="target_train_mean")
    return out


def _vectors(store: Source) -> int:
    """Rows of ``store`` with a vector: from its metadata, else by listing them (one pass)."""
    if store.info.null_rows is not None:
        return store.info.rows - store.info.null_rows
    return len(store.sample_ids(store.info.rows, 0))


def _id_differences(target: Source, source: Source, complete: bool) -> tuple[Check, dict[str, Any]]:
    """``same_ids``: the ids with a vector in ``source`` and not in ``target`` (``missing``,
    counted when ``complete``) and those of ``target`` not in ``source`` (``extra``)."""
    target_ids = set(_every_key(target, "target", 0))
    source_ids = set(_every_key(source, "source", 0))
    missing, extra = source_ids - target_ids, target_ids - source_ids
    counted = len(extra) + (len(missing) if complete else 0)
    check = Check(
        "same_ids",
        "ids_differing",
        float(counted),
        0.0,
        exclusive=False,
        origin="source",
        equal=True,
        count=True,
    )
    details = {
        "missing": len(missing),
        "extra": len(extra),
        "missing_ids": sorted(missing)[:WORST_ROWS],
        "extra_ids": sorted(extra)[:WORST_ROWS],
    }
    return check, details


def _translator_for(stitch: str | Path, source: Source, target: Source) -> Any:
    """The stitch in the direction that maps ``source``'s dimension to ``target``'s."""
    from lead.migrate.translator import LocalTranslator
    from lead.stitches import InvertibleStitch

    forward = LocalTranslator(stitch)
    d_src, d_tgt = source.info.dim, target.info.dim
    if (forward.ref.d_in, forward.ref.d_out) == (d_src, d_tgt):
        return forward
    if isinstance(forward.stitch, InvertibleStitch) and (
        forward.ref.d_out,
        forward.ref.d_in,
    ) == (d_src, d_tgt):
        return LocalTranslator(stitch, inverse=True)
    raise ShapeMismatchError(
        f"stitch {stitch} maps {forward.ref.d_in} to {forward.ref.d_out} dimensions, but the "
        f"source has {d_src} and the target {d_tgt}: is it the stitch the migration applied?",
        expected=forward.ref.d_in,
        got=d_src,
        param="stitch",
    )


def _source_match(
    target: Source, source: Source, stitch: str | Path, sample: int, seed: int
) -> tuple[Check, dict[str, Any]]:
    """``matches_source``: up to ``sample`` random ids in both stores, their source rows
    translated again and compared with the target's (cosine at least :data:`MATCH_COSINE`;
    a source row that is now a zero vector does not match)."""
    translator = _translator_for(stitch, source, target)
    try:
        paired = paired_sample([target, source], ["target", "source"], sample, seed, minimum=1)
        keys, stored, rows = paired.ids, paired.vectors[0], paired.vectors[1]
    except TooFewPairsError:  # no id in both: same_ids fails, nothing to compare
        keys, stored, rows = [], np.zeros((0, 1)), np.zeros((0, 1))
    cosine = np.full(len(keys), np.nan)
    usable = np.abs(rows).max(axis=1, initial=0.0) > np.finfo(np.float32).tiny
    if usable.any():
        again = np.asarray(translator(np.ascontiguousarray(rows[usable], dtype=np.float32)))
        kept = stored[usable].astype(np.float64)
        norms = np.linalg.norm(again, axis=1) * np.linalg.norm(kept, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            cosine[usable] = (again.astype(np.float64) * kept).sum(axis=1) / norms
    bad = ~(cosine >= MATCH_COSINE)  # NaN (a zero vector in either store) does not match
    check = Check(
        "matches_source",
        "rows_not_matching_source",
        float(bad.sum()),
        0.0,
        exclusive=False,
        origin="source",
        equal=True,
        count=True,
    )
    worst = np.argsort(np.nan_to_num(cosine, nan=-2.0))[: min(WORST_ROWS, int(bad.sum()))]
    details = {
        "stitch": str(stitch),
        "inverse": bool(translator.inverse),
        "sampled": len(keys),
        "not_matching": int(bad.sum()),
        "min_cosine": None if not usable.any() else float(np.nanmin(cosine)),
        "not_matching_ids": [
            {"id": keys[i], "cosine": None if np.isnan(cosine[i]) else float(cosine[i])}
            for i in worst
        ],
    }
    return check, details


def stitch_target_mean(folder: str | Path) -> Any:
    """The mean of the target vectors the stitch in ``folder`` was fitted on: the one
    calibrate recorded (``fit.calibration.target_train_mean``), else the stitch's
    ``target_mean`` (a gated or invertible stitch's differs from the plain mean by up to
    ~3e-3 a value)."""
    from lead.artifacts import load_stitch, read_stitch_config

    fit = read_stitch_config(folder).get("fit")
    calibration = fit.get("calibration") if isinstance(fit, dict) else None
    if isinstance(calibration, dict) and calibration.get("target_train_mean") is not None:
        return calibration["target_train_mean"]
    return load_stitch(folder).target_mean.detach().double().cpu().numpy()


def _writable_folder(path: Path, param: str, what: str, flag: str) -> None:
    """Refuse a path that is a file, or under one, where a folder is wanted."""
    for place in (path, *path.parents):
        if place.is_dir():
            return
        if place.exists() or place.is_symlink():
            raise InvalidInputError(
                f"{place} is a file, not a folder: give a folder for {what} ({param}, {flag})",
                param=param,
            )


def _check_outputs(folder: Path, junit: Path | None) -> None:
    """Refuse report paths that cannot be written, before any store is read.

    Raises
    ------
    InvalidInputError
        ``report_dir`` (or a folder above it) is a file; a report file's name is a folder;
        ``junit`` is a folder, or is under a file.
    """
    _writable_folder(folder, "report_dir", "report.json, report.md and cosine.png", "--report")
    for name in (JSON_FILE, MARKDOWN_FILE, PLOT_FILE):
        if (folder / name).is_dir():
            raise InvalidInputError(
                f"{folder / name} is a folder; the report writes a file there", param="report_dir"
            )
    if junit is not None:
        if junit.is_dir():
            raise InvalidInputError(
                f"{junit} is a folder: give the JUnit XML file's path (junit, --junit)",
                param="junit",
            )
        _writable_folder(junit.parent, "junit", "the JUnit XML file", "--junit")


def run_verify(
    target: str,
    native: str,
    *,
    sample: int = 1000,
    seed: int = 0,
    source: str | None = None,
    queries: RetrievalQueries | None = None,
    thresholds: dict[str, Any] | None = None,
    report_dir: str | Path,
    junit: str | Path | None = None,
    exclude_ids: Sequence[str] | None = None,
    complete: bool = True,
    target_train_mean: Any = None,
    stitch: str | Path | None = None,
) -> VerifyResult:
    """Sample ids, compare translated with native vectors, check thresholds, write a report.

    Parameters
    ----------
    target : str
        The migrated store (a store URI, :mod:`lead.migrate.stores`): translated vectors.
    native : str
        A store of the same documents embedded by the new model (some ids suffice).
    sample : int, default 1000
        Random ids drawn from those in both stores (at least 4).
    seed : int, default 0
    source : str, optional
        The store the migration read: the target must hold as many vectors as it has rows
        with a vector (``complete``); with ``queries.source_queries``, it gives
        source-native retrieval, the other half of the bound.
    queries : RetrievalQueries, optional
        Queries and judgments: retrieval over the sampled documents (their judged documents
        join the sample).
    thresholds : dict, optional
        ``min_r2``, ``min_mean_cosine``, ``min_top1``, ``min_retention`` over the defaults
        of :mod:`lead.migrate.quality` (None: not checked).
    report_dir : str or Path
        Created if needed; receives ``report.json``, ``report.md`` and ``cosine.png``.
    junit : str or Path, optional
        Also write JUnit XML here: one testcase per check.
    exclude_ids : sequence of str, optional
        Ids never sampled, matched by their text: those the stitch was fitted on
        (:func:`~lead.migrate.calibrate.fitted_ids`). Judged documents among them do not
        join the sample either, so retrieval is over unseen documents only.
    complete : bool, default True
        With ``source``: check that the target holds one vector per source row with a
        vector (:func:`~lead.migrate.quality.completeness_check`) and no id the source
        lacks, nor lacks one it holds (``same_ids``); False checks only that it holds no id
        the source lacks (a target migrated from part of the source).
    stitch : str or Path, optional
        With ``source``: the stitch the migration applied (a folder, a bundled id or a Hub
        repo id; run backwards when its inverse is what maps the source's dimension to the
        target's). Up to ``sample`` random ids are translated again from the source and
        compared with the target (``matches_source``).
    target_train_mean : array of shape (d,), optional
        The mean of the native vectors the stitch was fitted towards (its ``target_mean``):
        the mean estimator predicts it and R² is measured against it, as ``calibrate`` and
        ``lead score`` measure them, so a calibrated stitch's held-out ids give the same
        figures here. None: the sample's own mean (the mean estimator then scores R² 0).

    Returns
    -------
    VerifyResult
        ``passed`` and ``exit_code``; ``as_dict()`` is the JSON report.

    Raises
    ------
    InvalidInputError
        Bad thresholds, ``sample``, ``seed`` or ``exclude_ids`` (a single string); no judged
        query among the sampled documents; ``report_dir`` a file or ``junit`` a folder
        (checked before any store is read); an id held twice in a store (naming it).
    NonFiniteError
        A sampled vector holding NaN or infinity, naming its id and store.
    TooFewPairsError
        Fewer than 4 ids with a vector in every store and not excluded (naming their row
        counts).
    ShapeMismatchError
        Translated and native vectors (or queries and documents) of different dimensions;
        a ``stitch`` that maps neither way between the source's and the target's.
    StoreNotFoundError, StoreError
        A store that is missing or cannot be reached.
    StitchNotFoundError, StitchFormatError
        ``stitch`` cannot be loaded.

    Notes
    -----
    R² (:func:`lead.metrics.r2_score`) takes ``target_train_mean``, else the mean of the
    sampled native vectors, as its reference (the mean estimator then scores 0); top-1 and
    mean rank are among the sampled native vectors (chance: ``1 / n`` and
    ``(n + 1) / 2``). Retrieval follows BEIR [1]_ (:func:`lead.retrieval.retrieval_scores`)
    over the sampled documents only.

    Native vectors of the ids the stitch was fitted on flatter every figure (a calibrated
    ridge on 240 SciFact pairs: cosine 0.90 on its training ids, 0.70 on held-out ones):
    pass them as ``exclude_ids``. ``calibrate`` records them in the stitch's
    ``config.json`` (``fit.calibration.fitted_ids``, read by
    :func:`~lead.migrate.calibrate.fitted_ids`), next to its held-out ids
    (``fit.holdout.ids``).

    References
    ----------
    .. [1] N. Thakur et al., "BEIR", NeurIPS Datasets and Benchmarks 2021, arXiv:2104.08663.
    """
    limits, given = check_thresholds(thresholds)
    sample = check_int_option(sample, "sample", minimum=MIN_PAIRS)
    seed = check_int_option(seed, "seed", minimum=0, maximum=MAX_SEED)
    if isinstance(exclude_ids, str | bytes):
        raise InvalidInputError(
            "exclude_ids must be a list of ids, not a single string", param="exclude_ids"
        )
    excluded = list(dict.fromkeys(str(i) for i in exclude_ids or ()))
    folder, junit = Path(report_dir), None if junit is None else Path(junit)
    _check_outputs(folder, junit)
    use_source = source is not None and queries is not None and queries.source_queries is not None
    with ExitStack() as stack:
        stores = [
            stack.enter_context(open_source(target)),
            stack.enter_context(open_source(native)),
        ]
        names = ["target", "native"]
        if stores[0].info.dim != stores[1].info.dim:
            raise ShapeMismatchError(
                f"translated vectors in {target} have {stores[0].info.dim} dimensions, native "
                f"ones in {native} {stores[1].info.dim}: is the native store of the new model?",
                expected=stores[0].info.dim,
                got=stores[1].info.dim,
                param="native",
            )
        src = None if source is None else stack.enter_context(open_source(source))
        if use_source:
            assert src is not None
            stores.append(src)
            names.append("source")
        include = queries.judged_ids() if queries is not None else []
        paired = paired_sample(
            stores, names, sample, seed, minimum=MIN_PAIRS, include=include, exclude=excluded
        )
        uris = [s.info.uri for s in stores]
        rows = dict(zip(names, paired.rows, strict=True))
        first = []
        consistency: dict[str, Any] = {}
        if src is not None:
            rows["source"] = src.info.rows
            if complete:
                first.append(completeness_check(_vectors(stores[0]), _vectors(src)))
            check, consistency["ids"] = _id_differences(stores[0], src, complete)
            first.append(check)
            if stitch is not None:
                check, consistency["source_match"] = _source_match(
                    stores[0], src, stitch, sample, seed
                )
                first.append(check)
    translated, native_vectors = paired.vectors[0], paired.vectors[1]
    mean = None if target_train_mean is None else _train_mean(target_train_mean, native_vectors)
    scores, baseline, cosine, cosines = _figures(paired.ids, native_vectors, translated, mean)
    retrieval = None
    if queries is not None:
        retrieval = retrieval_against_bound(
            queries,
            paired.ids,
            translated,
            native_vectors,
            paired.vectors[2] if use_source else None,
        )
    checks = first + evaluate(
        limits,
        given,
        scores,
        baseline_cosine=baseline["mean_cosine_similarity"],
        retention=None if retrieval is None else retrieval["ndcg_at_10_retention"],
    )
    passed = all(c.passed for c in checks)
    judged = set(include)
    report: dict[str, Any] = {
        "kind": "lead-migrate-verify",
        "lead_version": __version__,
        "passed": passed,
        "target": uris[0],
        "native": uris[1],
        "source": None if src is None else src.info.uri,
        "sample": {
            "requested": sample,
            "seed": seed,
            "pairs": len(paired.ids),
            "judged": sum(i in judged for i in paired.ids),
            "excluded": len(excluded),
            "rows": rows,
            "common": paired.common,
        },
        "checks": [c.as_dict() for c in checks],
        "scores": scores,
        "baselines": {"mean_estimator": baseline},
        "r2_reference": "sample mean" if mean is None else "target_train_mean",
        "cosine": cosine,
        "retrieval": retrieval,
        "consistency": consistency or None,
    }
    return _write(report, checks, cosines, folder, junit)


def _write(
    report: dict[str, Any],
    checks: list[Check],
    cosines: np.ndarray,
    folder: Path,
    junit: Path | None,
) -> VerifyResult:
    """Write the plot, the JSON, the Markdown and the JUnit files; the result."""
    folder.mkdir(parents=True, exist_ok=True)
    cosine_check = next((c for c in checks if c.name == "min_mean_cosine"), None)
    plot = plot_cosines(
        folder / PLOT_FILE,
        cosines,
        threshold=None if cosine_check is None else cosine_check.threshold,
    )
    report["files"] = {
        "json": JSON_FILE,
        "markdown": MARKDOWN_FILE,
        "plot": None if plot is None else PLOT_FILE,
        "junit": None if junit is None else str(junit),
    }
    if plot is None:
        report["files"]["plot_missing"] = NO_PLOT
    files = {
        "json": write_json(folder / JSON_FILE, report),
        "markdown": write_text(folder / MARKDOWN_FILE, markdown_report(report)),
    }
    if plot is not None:
        files["plot"] = plot
    if junit is not None:
        properties = {"target": report["target"], "native": report["native"]}
        properties["pairs"] = report["sample"]["pairs"]
        files["junit"] = junit_xml(
            junit, checks, suite="lead.migrate.verify", properties=properties
        )
    return VerifyResult(report["passed"], checks, report, files)
