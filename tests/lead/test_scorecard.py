"""The held-out scorecard: layout, baselines, retrieval, errors, and a real stitch."""

from __future__ import annotations

import doctest
import json
import math
import time
from typing import Any

import numpy as np
import pytest
import torch

import lead.scorecard as ls
from lead.errors import (
    InvalidInputError,
    NonFiniteError,
    NonFiniteOutputError,
    ShapeMismatchError,
    TooFewPairsError,
)
from lead.fitting import fit_ridge
from lead.retrieval import retrieval_scores
from lead.scorecard import CORE_METRICS, RetrievalData, Scorecard, score_stitch
from lead.splits import holdout_split
from lead.stitches import AffineStitch, StitchInfo

LAYOUT = [
    "pairs",
    "pool_size",
    "mean_squared_error",
    "r2_score",
    "mean_cosine_similarity",
    "top1_accuracy_score",
    "mean_rank_error",
    "mutual_knn_score",
    "linear_cka_score",
    "retrieval",
    "baselines",
    "round_trip",
]
RETRIEVAL_LAYOUT = {
    "k",
    "queries",
    "recall_at_10_score",
    "ndcg_at_10_score",
    "native_recall_at_10_score",
    "native_ndcg_at_10_score",
    "recall_at_10_ratio",
    "ndcg_at_10_ratio",
}
QUERY_SIDE = {
    "query_side_recall_at_10_score",
    "query_side_ndcg_at_10_score",
    "query_side_recall_at_10_ratio",
    "query_side_ndcg_at_10_ratio",
    "source_native_ndcg_at_10_score",
    "bound_ndcg_at_10_score",
    "ndcg_at_10_bound_ratio",
    "query_side_ndcg_at_10_bound_ratio",
}


def _identity_stitch(d: int) -> AffineStitch:
    # it takes raw vectors as they are (a stitch fitted on unit-length ones would rescale)
    stitch = AffineStitch(d, d, info=StitchInfo(source_normalized=False, target_normalized=False))
    with torch.no_grad():
        stitch.weight.copy_(torch.eye(d))
    return stitch


def _fit_holdout(
    data: Any, src: str, tgt: str
) -> tuple[AffineStitch, np.ndarray, np.ndarray, np.ndarray, RetrievalData]:
    train, test = holdout_split(len(data.corpus_ids), 0.25, seed=0)
    X, Y = data.corpus[src], data.corpus[tgt]
    stitch = fit_ridge(X[train], Y[train])
    retrieval = RetrievalData(
        target_queries=data.queries[tgt],
        source_queries=data.queries[src],
        query_ids=data.query_ids,
        corpus_ids=[data.corpus_ids[i] for i in test],
        qrels=data.qrels,
    )
    return stitch, X[test], Y[test], Y[train].mean(axis=0), retrieval


def test_doctests() -> None:
    result = doctest.testmod(ls)
    assert result.failed == 0 and result.attempted > 0


def test_layout_without_retrieval_is_exactly_the_contract() -> None:
    X = np.random.default_rng(0).normal(size=(30, 5))
    card = score_stitch(_identity_stitch(5), X, X, target_train_mean=np.zeros(5))
    out = card.to_dict()
    assert list(out) == LAYOUT
    assert out["pairs"] == out["pool_size"] == 30
    assert out["retrieval"] is None
    assert list(out["baselines"]) == ["mean_estimator", "identity"]
    for core in out["baselines"].values():
        assert list(core) == list(CORE_METRICS)
    json.dumps(out)  # plain JSON types only
    # A float32 identity stitch: perfect up to float32 rounding.
    assert out["r2_score"] == pytest.approx(1.0) and out["top1_accuracy_score"] == 1.0
    assert out["mean_rank_error"] == 1.0 and out["mutual_knn_score"] == 1.0
    assert out["linear_cka_score"] == pytest.approx(1.0)


def test_round_trip_and_strict_from_dict() -> None:
    X = np.random.default_rng(1).normal(size=(12, 4))
    card = score_stitch(_identity_stitch(4), X, X + 0.1, target_train_mean=np.zeros(4))
    again = Scorecard.from_dict(json.loads(json.dumps(card.to_dict())))
    assert again == card
    broken = card.to_dict()
    del broken["r2_score"]
    with pytest.raises(InvalidInputError, match="r2_score"):
        Scorecard.from_dict(broken)
    with pytest.raises(InvalidInputError, match="surprise"):
        Scorecard.from_dict({**card.to_dict(), "surprise": 1})


def test_baselines_are_honest() -> None:
    rng = np.random.default_rng(2)
    n = 50
    X, Y = rng.normal(size=(n, 6)), rng.normal(size=(n, 6))
    card = score_stitch(_identity_stitch(6), X, Y, target_train_mean=Y.mean(axis=0) + 0.1)
    mean = card.baselines["mean_estimator"]
    assert mean is not None
    assert mean["r2_score"] == 0.0
    assert mean["top1_accuracy_score"] in (0.0, 1 / n)
    assert mean["mean_rank_error"] == pytest.approx((n + 1) / 2)
    assert mean["mutual_knn_score"] == 0.0 and mean["linear_cka_score"] == 0.0
    # The identity baseline is the stitch here (unrelated random sets): no skill.
    identity = card.baselines["identity"]
    assert identity is not None
    assert identity == pytest.approx({m: getattr(card, m) for m in CORE_METRICS}, rel=1e-6)
    assert card.r2_score < 0


def test_identity_baseline_is_none_when_dimensions_differ() -> None:
    X = np.random.default_rng(3).normal(size=(10, 3))
    card = score_stitch(AffineStitch(3, 5), X, np.zeros((10, 5)), target_train_mean=np.zeros(5))
    assert card.baselines["identity"] is None
    assert all(math.isfinite(getattr(card, m)) for m in CORE_METRICS)


def test_real_stitch_beats_the_mean_estimator(scifact_small: Any) -> None:
    stitch, X_test, Y_test, mean, retrieval = _fit_holdout(scifact_small, "minilm", "mpnet")
    card = score_stitch(stitch, X_test, Y_test, target_train_mean=mean, retrieval=retrieval)
    base = card.baselines["mean_estimator"]
    assert base is not None and card.baselines["identity"] is None  # 384 → 768
    assert card.pairs == card.pool_size == 100
    assert card.r2_score > 0.3 > base["r2_score"] + 0.2
    assert card.mean_squared_error < base["mean_squared_error"]
    assert card.top1_accuracy_score > 0.5 > base["top1_accuracy_score"]
    assert card.mean_rank_error < base["mean_rank_error"] / 5
    assert card.mean_cosine_similarity > base["mean_cosine_similarity"]
    assert card.linear_cka_score > 0.5 and card.mutual_knn_score > 0.2
    r = card.retrieval
    assert r is not None and set(r) == RETRIEVAL_LAYOUT | QUERY_SIDE
    assert r["k"] == 10 and 0 < r["queries"] <= 100
    assert 0.5 < r["ndcg_at_10_ratio"] < 1.5 and 0.5 < r["query_side_ndcg_at_10_ratio"] < 1.5
    assert r["ndcg_at_10_ratio"] == pytest.approx(
        r["ndcg_at_10_score"] / r["native_ndcg_at_10_score"]
    )
    # the bound: all-MiniLM-L6-v2's own queries over its own held-out documents
    source_native = retrieval_scores(
        retrieval.source_queries,
        X_test,
        query_ids=retrieval.query_ids,
        corpus_ids=retrieval.corpus_ids,
        qrels=retrieval.qrels,
    )["ndcg_at_10_score"]
    assert r["source_native_ndcg_at_10_score"] == source_native
    assert r["bound_ndcg_at_10_score"] == min(source_native, r["native_ndcg_at_10_score"])
    for prefix in ("", "query_side_"):
        assert r[f"{prefix}ndcg_at_10_bound_ratio"] == pytest.approx(
            r[f"{prefix}ndcg_at_10_score"] / r["bound_ndcg_at_10_score"]
        )


def test_retrieval_layout_without_source_queries(scifact_small: Any) -> None:
    stitch, X_test, Y_test, mean, retrieval = _fit_holdout(scifact_small, "minilm", "pml3")
    plain = RetrievalData(
        target_queries=retrieval.target_queries,
        query_ids=retrieval.query_ids,
        corpus_ids=retrieval.corpus_ids,
        qrels=retrieval.qrels,
    )
    card = score_stitch(stitch, X_test, Y_test, target_train_mean=mean, retrieval=plain)
    assert card.retrieval is not None and set(card.retrieval) == RETRIEVAL_LAYOUT
    assert card.baselines["identity"] is not None  # 384 → 384: source vectors as they are
    assert card.r2_score > card.baselines["identity"]["r2_score"]


def test_errors() -> None:
    stitch = _identity_stitch(3)
    X = np.random.default_rng(4).normal(size=(8, 3))
    mean = np.zeros(3)
    with pytest.raises(TooFewPairsError):
        score_stitch(stitch, X[:3], X[:3], target_train_mean=mean)
    with pytest.raises(ShapeMismatchError):
        score_stitch(stitch, X, X[:7], target_train_mean=mean)
    with pytest.raises(ShapeMismatchError):
        score_stitch(stitch, X[:, :2], X[:, :2], target_train_mean=mean[:2])
    with pytest.raises(ShapeMismatchError):
        score_stitch(stitch, X, X, target_train_mean=np.zeros(4))
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(NonFiniteError):
        score_stitch(stitch, X, bad, target_train_mean=mean)
    wrong_ids = RetrievalData(X[:2], ["a", "b"], ["d"] * 3, {"a": {"d": 1}})
    with pytest.raises(ShapeMismatchError):
        score_stitch(stitch, X, X, target_train_mean=mean, retrieval=wrong_ids)
    with torch.no_grad():
        stitch.weight.fill_(float("inf"))
    with pytest.raises(NonFiniteOutputError):
        score_stitch(stitch, X, X, target_train_mean=mean)


def test_scoring_1000_pairs_of_768_dims_is_fast() -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(1000, 768))
    Y = X + rng.normal(size=(1000, 768))
    stitch = _identity_stitch(768)
    score_stitch(stitch, X[:20], Y[:20], target_train_mean=np.zeros(768))  # warm-up
    start = time.perf_counter()
    card = score_stitch(stitch, X, Y, target_train_mean=np.zeros(768))
    elapsed = time.perf_counter() - start
    assert card.pairs == 1000
    # Stitch + two baselines; about 0.8 s on 2 idle cores, loose against a busy machine.
    assert elapsed < 15.0, f"{elapsed:.2f} s"


def test_round_trip_through_an_invertible_stitch_is_exact(scifact_small: Any) -> None:
    from lead.fitting import fit_stitch
    from lead.scorecard import round_trip_scores

    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    stitch = fit_stitch(X[:300], Y[:300], "invertible", max_epochs=1, hidden_dim=16)
    scores = round_trip_scores(stitch, X[300:])
    assert scores["via"] == "inverse"
    assert scores["round_trip_mean_squared_error"] < 1e-8
    assert scores["round_trip_mean_cosine_similarity"] > 0.9999
    assert scores["round_trip_top1_accuracy_score"] == 1.0
    card = score_stitch(stitch, X[300:], Y[300:], target_train_mean=Y[:300].mean(axis=0))
    assert card.round_trip == scores
    assert Scorecard.from_dict(card.to_dict()) == card


def test_round_trip_through_a_reverse_stitch_loses_something(scifact_small: Any) -> None:
    from lead.errors import NotInvertibleError
    from lead.fitting import fit_stitch
    from lead.scorecard import round_trip_scores

    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    there = fit_stitch(X[:300], Y[:300], "ridge")
    back = fit_stitch(Y[:300], X[:300], "ridge")
    scores = round_trip_scores(there, X[300:], reverse=back)
    assert scores["via"] == "reverse_stitch"
    # two shrinking ridge maps lose detail but keep each document nearest to itself
    assert 0.3 < scores["round_trip_mean_cosine_similarity"] < 0.999
    assert scores["round_trip_top1_accuracy_score"] > 0.8
    with pytest.raises(NotInvertibleError):
        round_trip_scores(there, X[300:])
    with pytest.raises(ShapeMismatchError, match="reverse"):
        round_trip_scores(there, X[300:], reverse=there)
    card = score_stitch(
        there, X[300:], Y[300:], target_train_mean=Y[:300].mean(axis=0), reverse=back
    )
    assert card.round_trip == scores


def test_scorecards_stored_before_round_trips_still_load(scifact_small: Any) -> None:
    from lead.fitting import fit_stitch

    X, Y = scifact_small.corpus["minilm"], scifact_small.corpus["pml3"]
    stitch = fit_stitch(X[:300], Y[:300], "ridge")
    stored = score_stitch(stitch, X[300:], Y[300:], target_train_mean=Y[:300].mean(axis=0))
    old = stored.to_dict()
    assert old.pop("round_trip") is None
    assert Scorecard.from_dict(old) == stored
