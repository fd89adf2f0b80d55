"""Go / no-go for a migration: thresholds, their checks, and retrieval against the bound.

Both ``calibrate`` (held-out pairs of a fitted stitch) and ``verify`` (translated against
native vectors of a store) grade the same figures, from :mod:`lead.scorecard` and
:mod:`lead.retrieval`, with the same thresholds:

============================  ==========================================================
threshold                     default and why
============================  ==========================================================
``min_r2``                    0: R² must be *above* the mean-estimator baseline, which
                              scores 0 by construction (the check the rest of LEAD makes:
                              ``lead fit`` warns and a job does not serve below it). A
                              pairing that carries no signal (shuffled ids) scores at or
                              below 0.
``min_mean_cosine``           the mean-estimator baseline: the mean cosine must be *above*
                              that of predicting the mean vector. No fixed number: an
                              anisotropic model (E5) has cosines near 0.8 for unrelated
                              texts, minilm → mpnet's baseline is 0.35.
``min_top1``                  0.5: most vectors must find their own native vector first
                              among all the native vectors compared (chance is 1 / n; a
                              larger sample is a harder pool). The bundled stitches score
                              0.90 – 1.00 on held-out pools of 512 – 1037 pairs.
``min_retention``             0.8, with queries only: translated nDCG@10 over the bound
                              (the weaker of source-native and target-native retrieval on
                              the same documents and queries). The bundled stitches keep
                              0.83 – 0.94 of native nDCG@10 on SciFact when fitted on its
                              documents, minilm → e5 about 0.76: a loss a person should
                              look at before migrating.
============================  ==========================================================

A threshold given as ``None`` is not checked. R² and the cosine baseline are exclusive
(the value must be above them), every other threshold inclusive (at or above).

``verify`` given the source store also checks that the migration is complete
(:func:`completeness_check`, ``complete``): the target holds as many vectors as the
source has rows with a vector, no fewer (rows not migrated) and no more (rows of
something else).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lead.errors import InvalidInputError, ShapeMismatchError
from lead.retrieval import Qrels, retrieval_scores

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Check",
    "RetrievalQueries",
    "check_thresholds",
    "completeness_check",
    "evaluate",
    "retrieval_against_bound",
]

#: Thresholds checked when not given (``min_mean_cosine``: the mean-estimator baseline).
DEFAULT_THRESHOLDS: dict[str, float | None] = {
    "min_r2": 0.0,
    "min_mean_cosine": None,
    "min_top1": 0.5,
    "min_retention": 0.8,
}
#: The figure each threshold checks (``min_retention``: nDCG@10, BEIR's headline metric).
_METRIC = {
    "min_r2": "r2_score",
    "min_mean_cosine": "mean_cosine_similarity",
    "min_top1": "top1_accuracy_score",
    "min_retention": "ndcg_at_10_retention",
}
#: The highest figure each bounded metric can reach: a threshold above it could never pass.
_MOST = {"min_r2": 1.0, "min_mean_cosine": 1.0, "min_top1": 1.0}


@dataclass(frozen=True, eq=False)
class RetrievalQueries:
    """Queries and relevance judgments over the documents of a store.

    Attributes
    ----------
    target_queries : ndarray of shape (m, d_tgt)
        The queries embedded by the new (target) model: they search the translated and the
        native documents.
    query_ids : sequence of str, length m
    qrels : mapping of str to mapping of str to int
        ``{query_id: {doc_id: grade}}``, grade > 0 relevant; document ids are the store's
        ids as text.
    source_queries : ndarray of shape (m, d_src), optional
        The same queries embedded by the old (source) model: with the source documents they
        give source-native retrieval, the other half of the bound.
    """

    target_queries: Any
    query_ids: Sequence[str]
    qrels: Qrels
    source_queries: Any = None

    def __post_init__(self) -> None:
        for name in ("target_queries", "source_queries"):
            value = getattr(self, name)
            if value is None:
                continue
            rows = np.shape(value)[0] if np.ndim(value) == 2 else None
            if rows != len(self.query_ids):
                raise ShapeMismatchError(
                    f"{name} must be a matrix with one row per query id "
                    f"({len(self.query_ids)}), got shape {np.shape(value)}",
                    expected=len(self.query_ids),
                    got=rows if rows is not None else -1,
                    param=name,
                )

    def judged_ids(self) -> list[str]:
        """Document ids with a positive grade, in first-seen order."""
        seen: dict[str, None] = {}
        for docs in self.qrels.values():
            seen.update((str(d), None) for d, grade in docs.items() if grade > 0)
        return list(seen)


@dataclass(frozen=True)
class Check:
    """One threshold against its figure.

    Attributes
    ----------
    name : str
        The threshold (``min_r2``, ...).
    metric : str
        The figure it checks.
    value : float
    threshold : float
    exclusive : bool
        The value must be above the threshold (else at or above).
    origin : {"given", "default", "baseline", "source"}
    equal : bool, default False
        The value must equal the threshold (``exclusive`` is then ignored).
    count : bool, default False
        Value and threshold are counts: reported as integers.
    """

    name: str
    metric: str
    value: float
    threshold: float
    exclusive: bool
    origin: str
    equal: bool = False
    count: bool = False

    @property
    def passed(self) -> bool:
        if self.equal:
            return self.value == self.threshold
        return self.value > self.threshold if self.exclusive else self.value >= self.threshold

    @property
    def operator(self) -> str:
        """``==``, ``>`` or ``>=``."""
        return "==" if self.equal else ">" if self.exclusive else ">="

    def _shown(self, x: float) -> str:
        return f"{int(x)}" if self.count else f"{x:.4f}"

    def message(self) -> str:
        """``r2_score 0.317 > 0.000 (default): pass``."""
        verdict = "pass" if self.passed else "FAIL"
        return (
            f"{self.metric} {self._shown(self.value)} {self.operator} "
            f"{self._shown(self.threshold)} ({self.origin}): {verdict}"
        )

    def as_dict(self) -> dict[str, Any]:
        number = int if self.count else float
        return {
            "name": self.name,
            "metric": self.metric,
            "value": number(self.value),
            "threshold": number(self.threshold),
            "operator": self.operator,
            "origin": self.origin,
            "passed": self.passed,
        }


def completeness_check(target_vectors: int, source_vectors: int) -> Check:
    """``complete``: the target holds one vector per source row with a vector.

    Parameters
    ----------
    target_vectors : int
        Rows of the target with a vector.
    source_vectors : int
        Rows of the source with a vector (its rows less its NULL ones).

    Returns
    -------
    Check
        ``target_vectors == source_vectors`` (origin ``source``).
    """
    return Check(
        "complete",
        "target_vectors",
        float(target_vectors),
        float(source_vectors),
        exclusive=False,
        origin="source",
        equal=True,
        count=True,
    )


def check_thresholds(
    thresholds: Mapping[str, Any] | None,
) -> tuple[dict[str, float | None], frozenset[str]]:
    """The defaults updated with ``thresholds``, validated; and the names given.

    Raises
    ------
    InvalidInputError
        An unknown name, a value that is not a finite number (or None), or one above the
        most its figure can reach (1 for R², mean cosine and top-1).
    """
    merged = dict(DEFAULT_THRESHOLDS)
    for name, value in (thresholds or {}).items():
        if name not in DEFAULT_THRESHOLDS:
            raise InvalidInputError(
                f"unknown threshold {name!r}; known: {', '.join(DEFAULT_THRESHOLDS)}",
                param=name,
            )
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInputError(
                    f"threshold {name} must be a number, got {value!r}", param=name
                )
            if not np.isfinite(value):
                raise InvalidInputError(f"threshold {name} must be finite", param=name)
            if name in _MOST and value > _MOST[name]:
                raise InvalidInputError(
                    f"threshold {name} must be at most {_MOST[name]:g} (its {_METRIC[name]} "
                    f"cannot exceed it), got {value:g}",
                    param=name,
                )
            value = float(value)
        merged[name] = value
    return merged, frozenset(thresholds or {})


def evaluate(
    thresholds: Mapping[str, float | None],
    given: frozenset[str],
    scores: Mapping[str, float],
    *,
    baseline_cosine: float,
    retention: float | None,
) -> list[Check]:
    """The checks of ``thresholds`` (from :func:`check_thresholds`) on the figures.

    Parameters
    ----------
    given : frozenset of str
        The threshold names the user set (the others are reported as defaults).
    scores : mapping
        At least ``r2_score``, ``mean_cosine_similarity`` and ``top1_accuracy_score``.
    baseline_cosine : float
        The mean-estimator's mean cosine, the default ``min_mean_cosine``.
    retention : float or None
        nDCG@10 retention against the bound; None without queries (not checked).
    """
    checks = []
    figures = {**scores, _METRIC["min_retention"]: retention}
    for name, metric in _METRIC.items():
        threshold = thresholds.get(name)
        origin = "given" if name in given else "default"
        exclusive = name == "min_r2"
        if name == "min_mean_cosine" and threshold is None and name not in given:
            threshold, origin, exclusive = baseline_cosine, "baseline", True
        value = figures.get(metric)
        if threshold is None or value is None:
            continue
        checks.append(Check(name, metric, float(value), float(threshold), exclusive, origin))
    return checks


def _ratio(value: float, bound: float) -> float:
    return value / bound if bound > 0 else 0.0


def retrieval_against_bound(
    queries: RetrievalQueries,
    corpus_ids: Sequence[str],
    translated: Any,
    native: Any,
    source: Any = None,
) -> dict[str, Any]:
    """Retrieval over the same documents: translated, target-native, source-native; the
    bound and the retention.

    Parameters
    ----------
    queries : RetrievalQueries
    corpus_ids : sequence of str, length n
        The documents' ids, in row order.
    translated : ndarray of shape (n, d_tgt)
        The translated documents (searched by the target-model queries).
    native : ndarray of shape (n, d_tgt)
        The same documents embedded by the target model.
    source : ndarray of shape (n, d_src), optional
        The same documents embedded by the source model (searched by
        ``queries.source_queries``, when both are given).

    Returns
    -------
    dict
        ``translated``, ``target_native`` and ``source_native`` (or None): each the output
        of :func:`lead.retrieval.retrieval_scores` (k = 10); ``bound``: per score, the
        smaller of the native ones; ``bound_from``; ``recall_at_10_retention`` and
        ``ndcg_at_10_retention``: translated over the bound (0 when the bound is 0).

    Raises
    ------
    InvalidInputError
        No query has a relevant document among ``corpus_ids``.
    ShapeMismatchError
        Query and document dimensions differ.

    Notes
    -----
    The bound is the weaker of the two models on the same documents and queries: a
    translation cannot be expected to beat the model it came from nor the one it imitates.
    Without source-model queries and documents it is target-native alone.
    """

    def search(query_emb: Any, docs: Any) -> dict[str, Any]:
        return retrieval_scores(
            query_emb,
            docs,
            query_ids=list(queries.query_ids),
            corpus_ids=list(corpus_ids),
            qrels=queries.qrels,
            k=10,
        )

    out: dict[str, Any] = {
        "documents": len(corpus_ids),
        "translated": search(queries.target_queries, translated),
        "target_native": search(queries.target_queries, native),
        "source_native": None,
    }
    natives = [out["target_native"]]
    if source is not None and queries.source_queries is not None:
        out["source_native"] = search(queries.source_queries, source)
        natives.append(out["source_native"])
    out["bound_from"] = (
        "min(source_native, target_native)" if len(natives) == 2 else "target_native"
    )
    scores = ("recall_at_10_score", "ndcg_at_10_score")
    out["bound"] = {s: min(float(n[s]) for n in natives) for s in scores}
    for s in scores:
        out[f"{s[:-6]}_retention"] = _ratio(float(out["translated"][s]), out["bound"][s])
    out["queries"] = out["translated"]["queries"]
    return out
