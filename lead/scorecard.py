"""The held-out scorecard of a stitch: how well it aligns, against honest baselines.

:func:`score_stitch` translates held-out source vectors and compares them with their
target-model partners (:mod:`lead.metrics`), optionally grades retrieval over the held-out
documents (:mod:`lead.retrieval`), and scores the same metrics for two baselines:

- ``mean_estimator``: predict the TRAINING target mean for every row (R² = 0 by
  construction; its cosine is that of each target to the mean, its top-1 is 1/n or 0 and its
  mean rank (n + 1) / 2, the chance levels; its mutual kNN and CKA are 0: no structure);
- ``identity``: use the source vectors as they are, when ``d_src == d_tgt`` (else ``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from torch import Tensor

from lead import metrics
from lead._apply import apply_stitch
from lead._metric_inputs import _pair
from lead._validation import as_matrix, check_stitch
from lead.errors import InvalidInputError, ModelMismatchError, ShapeMismatchError
from lead.retrieval import Qrels, retrieval_scores
from lead.stitches import InvertibleStitch, Stitch, StitchInfo

__all__ = [
    "CORE_METRICS",
    "ROUND_TRIP_METRICS",
    "RetrievalData",
    "Scorecard",
    "below_baseline_cause",
    "core_scores",
    "round_trip_scores",
    "score_stitch",
]

#: The metrics every scorecard and each of its baselines carries, in layout order.
CORE_METRICS = (
    "mean_squared_error",
    "r2_score",
    "mean_cosine_similarity",
    "top1_accuracy_score",
    "mean_rank_error",
    "mutual_knn_score",
    "linear_cka_score",
)
#: The round-trip (A → B → A) figures of :func:`round_trip_scores`.
ROUND_TRIP_METRICS = (
    "round_trip_mean_squared_error",
    "round_trip_mean_cosine_similarity",
    "round_trip_top1_accuracy_score",
)
#: Neighbourhood size of :func:`lead.metrics.mutual_knn_score` (Huh et al. 2024).
MUTUAL_KNN_K = 10
#: Retrieval cut-off of the scorecard (recall@10, nDCG@10).
RETRIEVAL_K = 10


@dataclass(frozen=True, eq=False)
class RetrievalData:
    """Queries and relevance judgments for grading retrieval over held-out documents.

    Attributes
    ----------
    target_queries : array or Tensor of shape (m, d_tgt)
        The queries embedded by the target model (they search the translated documents).
    query_ids : sequence of str, length m
    corpus_ids : sequence of str, length n
        Ids of the held-out documents, in the row order of ``X_test`` / ``Y_test``.
    qrels : mapping of str to mapping of str to int
        ``{query_id: {doc_id: grade}}``; grade > 0 is relevant.
    source_queries : array or Tensor of shape (m, d_src), optional
        The same queries embedded by the source model; when given, the scorecard also
        grades translated queries searching the native target documents (query side).
    """

    target_queries: Any
    query_ids: Sequence[str]
    corpus_ids: Sequence[str]
    qrels: Qrels
    source_queries: Any = None


@dataclass
class Scorecard:
    """Held-out alignment figures of a stitch; :meth:`to_dict` is the stored layout.

    Attributes
    ----------
    pairs : int
        Held-out pairs ``n``.
    pool_size : int
        Candidates among which top-1 and mean rank are computed (all held-out targets, ``n``).
    mean_squared_error, r2_score, mean_cosine_similarity, top1_accuracy_score,
    mean_rank_error, mutual_knn_score, linear_cka_score : float
        See :mod:`lead.metrics`. Mutual kNN uses ``k = min(10, n - 2)``.
    retrieval : dict or None
        ``{"k", "queries", "recall_at_10_score", "ndcg_at_10_score",
        "native_recall_at_10_score", "native_ndcg_at_10_score", "recall_at_10_ratio",
        "ndcg_at_10_ratio"}``: native target queries searching the translated held-out
        documents, the same queries searching the native documents, and their ratio
        (0 when the native score is 0). With source queries, also ``query_side_*`` scores
        and ratios (translated source queries searching the native documents), the
        source-native figure ``source_native_ndcg_at_10_score`` (source queries searching
        the held-out source documents), the information bound ``bound_ndcg_at_10_score``
        = min(source native, target native), and ``ndcg_at_10_bound_ratio`` /
        ``query_side_ndcg_at_10_bound_ratio`` (each side's nDCG@10 over the bound).
    baselines : dict
        ``{"mean_estimator": {core metrics}, "identity": {core metrics} or None}``.
    round_trip : dict or None
        For a stitch that can be run back (an invertible one, or with a reverse stitch
        given): :func:`round_trip_scores` of the held-out source vectors, and ``via``
        (``"inverse"`` or ``"reverse_stitch"``).
    """

    pairs: int
    pool_size: int
    mean_squared_error: float
    r2_score: float
    mean_cosine_similarity: float
    top1_accuracy_score: float
    mean_rank_error: float
    mutual_knn_score: float
    linear_cka_score: float
    retrieval: dict[str, Any] | None = None
    baselines: dict[str, dict[str, float] | None] = field(default_factory=dict)
    round_trip: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict in the layout of the contract (key order included)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["retrieval"] = None if self.retrieval is None else dict(self.retrieval)
        out["baselines"] = {
            name: None if core is None else dict(core) for name, core in self.baselines.items()
        }
        out["round_trip"] = None if self.round_trip is None else dict(self.round_trip)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scorecard:
        """Rebuild a scorecard from :meth:`to_dict` output.

        Raises
        ------
        InvalidInputError
            If a key is missing or unknown.
        """
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data) - {"round_trip"})  # absent before round trips
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise InvalidInputError(
                f"not a scorecard: missing keys {missing}, unknown keys {unknown}",
                param="scorecard",
            )
        values = {name: float(data[name]) for name in CORE_METRICS}
        return cls(
            pairs=int(data["pairs"]),
            pool_size=int(data["pool_size"]),
            retrieval=None if data["retrieval"] is None else dict(data["retrieval"]),
            round_trip=None if data.get("round_trip") is None else dict(data["round_trip"]),
            baselines={
                name: None if core is None else {m: float(v) for m, v in core.items()}
                for name, core in data["baselines"].items()
            },
            **values,
        )


def below_baseline_cause(scorecard: dict[str, Any]) -> str:
    """The likely cause of a held-out ``r2_score`` at or below the mean-estimator baseline,
    as a sentence for the user, from the scorecard's other figures.

    Rows of source and target in two different orders score like that, and so does a map
    that fits the data poorly (Procrustes on a few hundred pairs: R² -0.05 with a top-1
    accuracy of 0.975). Row order is blamed only when the top-1 accuracy is low too: with
    the rows unpaired it is near chance, ``1 / pool_size``.

    Parameters
    ----------
    scorecard : dict
        A scorecard's figures (:meth:`Scorecard.to_dict`): ``top1_accuracy_score`` and
        ``pool_size`` are read when present.

    Returns
    -------
    str
    """
    top1, pool = scorecard.get("top1_accuracy_score"), scorecard.get("pool_size")
    if (
        isinstance(top1, int | float)
        and isinstance(pool, int)
        and pool > 0
        and top1 >= max(0.1, 10 / pool)
    ):
        return (
            f"Its held-out top-1 accuracy ({top1:.3f} among {pool}) shows that the rows are "
            "paired: the method fits this data poorly (a map too rigid, or too few pairs for "
            "it); try ridge, or more pairs"
        )
    return (
        "Check that row i of source and target embed the same text (same ids, same order; "
        "rows in two orders score like this)"
    )


def core_scores(Y_true: Any, Y_pred: Any, *, target_train_mean: Any) -> dict[str, float]:
    """The :data:`CORE_METRICS` of translated vectors against their targets.

    Parameters
    ----------
    Y_true : array or Tensor of shape (n, d_tgt)
        Held-out target vectors (also the candidate pool of top-1 and mean rank).
    Y_pred : array or Tensor of shape (n, d_tgt)
        Predictions for those rows.
    target_train_mean : array or Tensor of shape (d_tgt,)
        Mean of the training targets (the reference of R²).

    Returns
    -------
    dict of str to float
        One entry per name in :data:`CORE_METRICS`.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        As the functions of :mod:`lead.metrics`.
    """
    T = as_matrix(Y_true, name="Y_test")
    P = as_matrix(Y_pred, name="Y_pred").to(T.device)
    k = min(MUTUAL_KNN_K, T.shape[0] - 2)
    greater, ties = metrics._ranks(P, T)
    return {
        "mean_squared_error": metrics.mean_squared_error(T, P),
        "r2_score": metrics.r2_score(T, P, reference_mean=target_train_mean),
        "mean_cosine_similarity": metrics.mean_cosine_similarity(T, P),
        "top1_accuracy_score": float(((greater + ties) == 0).double().mean()),
        "mean_rank_error": float((1.0 + greater.double() + 0.5 * ties.double()).mean()),
        "mutual_knn_score": metrics.mutual_knn_score(P, T, k=max(k, 1)),
        "linear_cka_score": metrics.linear_cka_score(P, T),
    }


def _ratio(value: float, native: float) -> float:
    return value / native if native > 0 else 0.0


def _retrieval(
    stitch: Stitch, translated: Tensor, X_test: Tensor, Y_test: Tensor, data: RetrievalData
) -> dict[str, Any]:
    if len(data.corpus_ids) != Y_test.shape[0]:
        raise ShapeMismatchError(
            f"{len(data.corpus_ids)} corpus ids for {Y_test.shape[0]} held-out documents",
            expected=Y_test.shape[0],
            got=len(data.corpus_ids),
            param="retrieval.corpus_ids",
        )

    def search(queries: Any, docs: Tensor) -> dict[str, Any]:
        return retrieval_scores(
            queries,
            docs,
            query_ids=data.query_ids,
            corpus_ids=data.corpus_ids,
            qrels=data.qrels,
            k=RETRIEVAL_K,
        )

    native = search(data.target_queries, Y_test)
    stitched = search(data.target_queries, translated)
    recall, ndcg = f"recall_at_{RETRIEVAL_K}_score", "ndcg_at_10_score"
    out: dict[str, Any] = {
        "k": RETRIEVAL_K,
        "queries": native["queries"],
        recall: stitched[recall],
        ndcg: stitched[ndcg],
        f"native_{recall}": native[recall],
        f"native_{ndcg}": native[ndcg],
        f"recall_at_{RETRIEVAL_K}_ratio": _ratio(stitched[recall], native[recall]),
        "ndcg_at_10_ratio": _ratio(stitched[ndcg], native[ndcg]),
    }
    if data.source_queries is not None:
        side = search(apply_stitch(stitch, data.source_queries), Y_test)
        out[f"query_side_{recall}"] = side[recall]
        out[f"query_side_{ndcg}"] = side[ndcg]
        out[f"query_side_recall_at_{RETRIEVAL_K}_ratio"] = _ratio(side[recall], native[recall])
        out["query_side_ndcg_at_10_ratio"] = _ratio(side[ndcg], native[ndcg])
        source_native = search(data.source_queries, X_test)[ndcg]
        bound = min(source_native, native[ndcg])
        out[f"source_native_{ndcg}"] = source_native
        out[f"bound_{ndcg}"] = bound
        out["ndcg_at_10_bound_ratio"] = _ratio(stitched[ndcg], bound)
        out["query_side_ndcg_at_10_bound_ratio"] = _ratio(side[ndcg], bound)
    return out


def _check_reverse_models(stitch: Stitch, reverse: Stitch) -> None:
    """The reverse stitch must map the stitch's target model to its source model (models
    left at their ``unknown-*`` defaults are not compared)."""
    default = StitchInfo()
    pairs = (
        ("source_model", reverse.info.source_model, stitch.info.target_model),
        ("target_model", reverse.info.target_model, stitch.info.source_model),
    )
    for side, got, expected in pairs:
        known = got not in (default.source_model, default.target_model) and expected not in (
            default.source_model,
            default.target_model,
        )
        if known and got != expected:
            raise ModelMismatchError(
                f"the reverse stitch's {side} is {got!r}, expected {expected!r}: a round trip "
                "goes back from the stitch's target model to its source model",
                param="reverse",
            )


def round_trip_scores(stitch: Stitch, X: Any, *, reverse: Stitch | None = None) -> dict[str, Any]:
    """Translate source vectors to the target space and back (A → B → A), and compare.

    Parameters
    ----------
    stitch : Stitch
        The forward stitch (A → B).
    X : array or Tensor of shape (n, d_src)
        Source-model vectors, ``n >= 4`` (held out from both fits).
    reverse : Stitch, optional
        A stitch B → A (any architecture). When omitted, ``stitch`` must be an
        :class:`~lead.stitches.InvertibleStitch`, run backwards.

    Returns
    -------
    dict
        ``via`` (``"inverse"`` or ``"reverse_stitch"``) and the :data:`ROUND_TRIP_METRICS`:
        mean squared error and mean cosine of the round-tripped vectors against ``X``, and
        the share of them whose nearest ``X`` row (cosine) is their own.

    Raises
    ------
    ShapeMismatchError
        If the dimensions of ``X``, ``stitch`` and ``reverse`` do not join up.
    NotInvertibleError
        If ``reverse`` is omitted and ``stitch`` is not invertible.
    ModelMismatchError
        If ``reverse`` does not map the stitch's target model back to its source model.
    NonFiniteError, TooFewPairsError, NonFiniteOutputError
        For bad input, fewer than 4 rows, or NaN from a stitch.
    InvalidInputError
        If ``stitch`` or ``reverse`` is not a stitch.

    References
    ----------
    .. [1] Guo, Y. et al. (2023). All roads lead to Rome? Exploring the invariance of
       transformers' representations. arXiv:2305.14555 (round trips through bijective maps)
    """
    check_stitch(stitch)
    if reverse is not None:
        check_stitch(reverse, "reverse")
    source = as_matrix(X, name="X")
    there = apply_stitch(stitch, source)
    if reverse is None:
        back = apply_stitch(stitch, there, inverse=True)
    else:
        if (reverse.d_src, reverse.d_tgt) != (stitch.d_tgt, stitch.d_src):
            raise ShapeMismatchError(
                f"the reverse stitch maps {reverse.d_src} → {reverse.d_tgt}, expected "
                f"{stitch.d_tgt} → {stitch.d_src}",
                expected=(stitch.d_tgt, stitch.d_src),
                got=(reverse.d_src, reverse.d_tgt),
                param="reverse",
            )
        _check_reverse_models(stitch, reverse)
        back = apply_stitch(reverse, there)
    back = back.to(source.device)
    return {
        "via": "inverse" if reverse is None else "reverse_stitch",
        "round_trip_mean_squared_error": metrics.mean_squared_error(source, back),
        "round_trip_mean_cosine_similarity": metrics.mean_cosine_similarity(source, back),
        "round_trip_top1_accuracy_score": metrics.top1_accuracy_score(back, source),
    }


def score_stitch(
    stitch: Stitch,
    X_test: Any,
    Y_test: Any,
    *,
    target_train_mean: Any,
    retrieval: RetrievalData | None = None,
    reverse: Stitch | None = None,
) -> Scorecard:
    """Score a fitted stitch on held-out pairs, with the mean-estimator and identity baselines.

    Parameters
    ----------
    stitch : Stitch
        The fitted stitch (any device and dtype).
    X_test : array or Tensor of shape (n, d_src)
        Held-out source vectors, never seen in fitting.
    Y_test : array or Tensor of shape (n, d_tgt)
        Their target-model partners.
    target_train_mean : array or Tensor of shape (d_tgt,)
        Mean of the training targets: the reference of R² and the mean-estimator prediction.
    retrieval : RetrievalData, optional
        Queries and judgments over the held-out documents (``corpus_ids`` in row order).
    reverse : Stitch, optional
        A stitch from the target model back to the source model; with it (or for an
        invertible ``stitch``) the scorecard holds the round trip of ``X_test``.

    Returns
    -------
    Scorecard
        All :data:`CORE_METRICS`, ``pool_size = n``, retrieval figures or ``None``, the
        baselines, and the round trip or ``None``.

    Raises
    ------
    ShapeMismatchError
        Row counts that differ, dimensions that do not match the stitch, ids not matching.
    NonFiniteError
        NaN or infinity in an input.
    TooFewPairsError
        Fewer than 4 held-out pairs.
    NonFiniteOutputError
        If the stitch produces NaN or infinity.
    InvalidInputError
        If retrieval is asked for and no query has a relevant held-out document, or
        ``stitch`` or ``reverse`` is not a stitch.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from lead.stitches import AffineStitch
    >>> stitch = AffineStitch(3, 3)
    >>> with torch.no_grad():
    ...     _ = stitch.weight.copy_(torch.eye(3))
    >>> X = np.random.default_rng(0).normal(size=(20, 3))
    >>> card = score_stitch(stitch, X, X, target_train_mean=np.zeros(3))
    >>> card.top1_accuracy_score, card.baselines["mean_estimator"]["r2_score"]
    (1.0, 0.0)
    """
    check_stitch(stitch)
    if reverse is not None:
        check_stitch(reverse, "reverse")
    X, Y = _pair(X_test, Y_test, ("X_test", "Y_test"), same_dim=False)
    if Y.shape[1] != stitch.d_tgt:
        raise ShapeMismatchError(
            f"Y_test has {Y.shape[1]} columns but the stitch maps to d_tgt={stitch.d_tgt}",
            expected=stitch.d_tgt,
            got=Y.shape[1],
            param="Y_test",
        )
    translated = apply_stitch(stitch, X).to(Y.device)
    raw = (
        target_train_mean
        if isinstance(target_train_mean, Tensor)
        else np.asarray(target_train_mean)
    )
    mean = as_matrix(raw.reshape(1, -1), name="target_train_mean").to(Y.device)
    scores = core_scores(Y, translated, target_train_mean=mean)
    n = Y.shape[0]
    baselines: dict[str, dict[str, float] | None] = {
        "mean_estimator": core_scores(Y, mean.expand(n, -1), target_train_mean=mean),
        "identity": (
            core_scores(Y, X, target_train_mean=mean) if X.shape[1] == Y.shape[1] else None
        ),
    }
    round_trip = None
    if reverse is not None or isinstance(stitch, InvertibleStitch):
        round_trip = round_trip_scores(stitch, X, reverse=reverse)
    return Scorecard(
        pairs=n,
        pool_size=n,
        retrieval=None if retrieval is None else _retrieval(stitch, translated, X, Y, retrieval),
        baselines=baselines,
        round_trip=round_trip,
        **scores,
    )
