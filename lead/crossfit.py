"""Cross-fitted retrieval: how much of a target model's search quality a stitch keeps.

The whole corpus is translated without any document ever being translated by a stitch
that saw it: the documents are split into ``folds``, each fold is translated by a stitch
fitted on the other folds (plus optional extra pairs), and native target-model queries
search the translated corpus ("document side": the corpus was embedded by the source
model, the queries by the target model). Separately, source-model queries translated by a
stitch fitted on all documents search the native target corpus ("query side"). Queries
never enter any fit. Both are reported as scores and as ratios to all-native retrieval.

With source queries, both sides are also reported as a ratio to the **information bound**:
a translated vector only carries what the source model captured, so the natural ceiling
is min(source-native, target-native) nDCG@10 on the same corpus and queries, where
source-native is the source model's own queries searching its own corpus (what keeping
the old model gives).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lead._apply import apply_stitch
from lead._validation import as_matrix, check_pairs
from lead.errors import ShapeMismatchError
from lead.fitting import ProgressCallback, fit_stitch
from lead.retrieval import Qrels, retrieval_scores
from lead.splits import kfold_indices

__all__ = ["crossfit_retrieval"]


def _ratio(value: float, native: float) -> float:
    return value / native if native > 0 else 0.0


def _side(
    scores: dict[str, Any], native: dict[str, Any], k: int, bound: float | None
) -> dict[str, float]:
    recall, ndcg = f"recall_at_{k}_score", "ndcg_at_10_score"
    out = {
        ndcg: scores[ndcg],
        recall: scores[recall],
        "ndcg_at_10_ratio": _ratio(scores[ndcg], native[ndcg]),
        f"recall_at_{k}_ratio": _ratio(scores[recall], native[recall]),
    }
    if bound is not None:
        out["ndcg_at_10_bound_ratio"] = _ratio(scores[ndcg], bound)
    return out


def crossfit_retrieval(
    X_docs: Any,
    Y_docs: Any,
    *,
    doc_ids: Sequence[str],
    target_queries: Any,
    query_ids: Sequence[str],
    qrels: Qrels,
    source_queries: Any = None,
    method: str = "ridge",
    options: Mapping[str, Any] | None = None,
    folds: int = 5,
    seed: int = 0,
    extra_pairs: tuple[Any, Any] | None = None,
    k: int = 10,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    r"""Cross-fitted document-side and query-side retrieval retention of a stitch method.

    Parameters
    ----------
    X_docs : array or Tensor of shape (n, d_src)
        The corpus embedded by the source model.
    Y_docs : array or Tensor of shape (n, d_tgt)
        The same documents embedded by the target model.
    doc_ids : sequence of str, length n
        Document ids, in row order.
    target_queries : array or Tensor of shape (m, d_tgt)
        Queries embedded by the target model.
    query_ids : sequence of str, length m
    qrels : mapping of str to mapping of str to int
        ``{query_id: {doc_id: grade}}``; grade > 0 is relevant.
    source_queries : array or Tensor of shape (m, d_src), optional
        The same queries embedded by the source model; enables the query side and the
        bound (source-native retrieval: these queries searching ``X_docs``).
    method : str, default "ridge"
        Any method of :func:`lead.fitting.fit_stitch`.
    options : mapping, optional
        Keyword options of that method (``alpha``, ``scaling``, ``hidden_dim``, ...).
    folds : int, default 5
        Number of document folds (at least 2).
    seed : int, default 0
        Seed of the fold split and of every fit.
    extra_pairs : (array of shape (n_extra, d_src), array of shape (n_extra, d_tgt)), optional
        Additional training pairs (e.g. general-domain sentences) added to every fit.
    k : int, default 10
        Recall cut-off (nDCG is always at 10).
    progress : callable, optional
        ``progress("crossfit", step, total)`` after each fit (``folds + 1`` fits when
        ``source_queries`` is given, else ``folds``); an exception it raises propagates.

    Returns
    -------
    dict
        ``method``, ``options``, ``folds``, ``seed``, ``docs`` (n), ``queries`` (evaluated),
        ``skipped_queries``, ``extra_pairs`` (count), ``k``, ``native_ndcg_at_10_score``
        (target native), ``native_recall_at_{k}_score``, ``source_native_ndcg_at_10_score``
        and ``bound_ndcg_at_10_score`` (both ``None`` without source queries),
        ``document_side`` and ``query_side`` (``None`` without source queries), each
        ``{"ndcg_at_10_score", "recall_at_{k}_score", "ndcg_at_10_ratio",
        "recall_at_{k}_ratio"}`` plus ``"ndcg_at_10_bound_ratio"`` with source queries.
        Scores in ``[0, 1]``; ratios are best near (or above) 1, and 0 when the native
        score (or the bound) is 0.

    Raises
    ------
    ShapeMismatchError, NonFiniteError, TooFewPairsError
        Bad shapes, non-finite input, ids not matching rows, too few documents per fold.
    InvalidInputError
        Unknown method or option, ``folds < 2``, or no query with a relevant document.

    Notes
    -----
    Document side: :math:`\hat Y_{F_f} = s_{-f}(X_{F_f})` for each fold :math:`F_f`, with
    :math:`s_{-f}` fitted on the other folds; retention
    :math:`= \mathrm{nDCG@10}(Q^{tgt}, \hat Y) / \mathrm{nDCG@10}(Q^{tgt}, Y)`.
    Query side: :math:`\mathrm{nDCG@10}(s(Q^{src}), Y) / \mathrm{nDCG@10}(Q^{tgt}, Y)` with
    :math:`s` fitted on all documents. Bound:
    :math:`B = \min(\mathrm{nDCG@10}(Q^{src}, X), \mathrm{nDCG@10}(Q^{tgt}, Y))`; each side's
    ``ndcg_at_10_bound_ratio`` is its nDCG@10 divided by :math:`B`.

    References
    ----------
    .. [1] N. Thakur et al., "BEIR", NeurIPS Datasets and Benchmarks 2021, arXiv:2104.08663.

    Examples
    --------
    An exactly linear relation: every fold's stitch recovers it, nothing is lost.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(40, 4))
    >>> Y = X @ rng.normal(size=(4, 4))
    >>> ids = [f"d{i}" for i in range(40)]
    >>> out = crossfit_retrieval(X, Y, doc_ids=ids, target_queries=Y[:5], query_ids=ids[:5],
    ...                          qrels={i: {i: 1} for i in ids[:5]}, options={"alpha": 0.0})
    >>> out["docs"], out["queries"], out["document_side"]["ndcg_at_10_ratio"]
    (40, 5, 1.0)
    >>> out["bound_ndcg_at_10_score"] is None  # no source queries, no bound
    True
    """
    X, Y = check_pairs(X_docs, Y_docs)
    n = X.shape[0]
    if len(doc_ids) != n:
        raise ShapeMismatchError(
            f"{len(doc_ids)} doc ids for {n} documents",
            expected=n,
            got=len(doc_ids),
            param="doc_ids",
        )
    extra_x = extra_y = None
    if extra_pairs is not None:
        extra_x, extra_y = check_pairs(*extra_pairs, minimum=1)
        if extra_x.shape[1] != X.shape[1] or extra_y.shape[1] != Y.shape[1]:
            raise ShapeMismatchError(
                f"extra pairs have dimensions ({extra_x.shape[1]}, {extra_y.shape[1]}), "
                f"the documents ({X.shape[1]}, {Y.shape[1]})",
                expected=(X.shape[1], Y.shape[1]),
                got=(extra_x.shape[1], extra_y.shape[1]),
                param="extra_pairs",
            )
    Q = as_matrix(target_queries, name="target_queries")
    opts = dict(options or {})
    fits = folds + (1 if source_queries is not None else 0)

    def fit(rows: np.ndarray) -> Any:
        index = torch.from_numpy(rows)
        train_x, train_y = X[index], Y[index]
        if extra_x is not None and extra_y is not None:
            train_x, train_y = torch.cat([train_x, extra_x]), torch.cat([train_y, extra_y])
        return fit_stitch(train_x, train_y, method, seed=seed, **opts)

    def search(queries: Any, docs: Any) -> dict[str, Any]:
        return retrieval_scores(
            queries, docs, query_ids=query_ids, corpus_ids=doc_ids, qrels=qrels, k=k
        )

    native = search(Q, Y)
    translated = torch.empty_like(Y)
    parts = kfold_indices(n, folds, seed)
    for f, test_rows in enumerate(parts):
        train_rows = np.concatenate([p for g, p in enumerate(parts) if g != f])
        stitch = fit(train_rows)
        index = torch.from_numpy(test_rows)
        translated[index] = apply_stitch(stitch, X[index]).to(Y.device)
        if progress is not None:
            progress("crossfit", f + 1, fits)
    query_side = source_native = bound = None
    if source_queries is not None:
        source_native = search(as_matrix(source_queries, name="source_queries"), X)
        bound = min(source_native["ndcg_at_10_score"], native["ndcg_at_10_score"])
        stitch = fit(np.arange(n))
        side = search(apply_stitch(stitch, source_queries).to(Y.device), Y)
        query_side = _side(side, native, k, bound)
        if progress is not None:
            progress("crossfit", fits, fits)
    recall = f"recall_at_{k}_score"
    return {
        "method": method,
        "options": opts,
        "folds": len(parts),
        "seed": seed,
        "docs": n,
        "queries": native["queries"],
        "skipped_queries": native["skipped_queries"],
        "extra_pairs": 0 if extra_x is None else int(extra_x.shape[0]),
        "k": k,
        "native_ndcg_at_10_score": native["ndcg_at_10_score"],
        f"native_{recall}": native[recall],
        "source_native_ndcg_at_10_score": (
            None if source_native is None else source_native["ndcg_at_10_score"]
        ),
        "bound_ndcg_at_10_score": bound,
        "document_side": _side(search(Q, translated), native, k, bound),
        "query_side": query_side,
    }
