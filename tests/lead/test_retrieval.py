"""Cosine ranking and BEIR-style nDCG@10 / recall@k of ``lead.retrieval``."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

import lead.retrieval as lr
from lead.errors import InvalidInputError, NonFiniteError, ShapeMismatchError
from lead.retrieval import ndcg_at_k_score, rank_corpus, recall_at_k_score, retrieval_scores

DOCS = ["d0", "d1", "d2", "d3"]


def test_doctests() -> None:
    result = doctest.testmod(lr)
    assert result.failed == 0 and result.attempted > 0


def test_rank_corpus_orders_by_cosine_not_dot_product() -> None:
    corpus = np.array([[10.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, -0.1]])
    queries = np.array([[1.0, 0.9], [0.0, 2.0]])
    assert rank_corpus(queries, corpus, 4).tolist() == [[2, 0, 1, 3], [1, 2, 0, 3]]
    assert rank_corpus(queries, corpus, 10).shape == (2, 4)  # k capped at the corpus size


def test_rank_corpus_in_blocks_matches_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    queries, corpus = rng.normal(size=(37, 8)), rng.normal(size=(301, 8))
    whole = rank_corpus(queries, corpus, 10)
    full = np.argsort(
        -(queries / np.linalg.norm(queries, axis=1, keepdims=True))
        @ (corpus / np.linalg.norm(corpus, axis=1, keepdims=True)).T,
        axis=1,
    )[:, :10]
    assert (whole == full).all()
    monkeypatch.setattr(lr, "_BLOCK_ELEMENTS", 64 * 16)  # 16-doc blocks, merged top-k
    assert (rank_corpus(queries, corpus, 10) == whole).all()


def test_rank_corpus_errors() -> None:
    with pytest.raises(ShapeMismatchError):
        rank_corpus(np.ones((2, 3)), np.ones((4, 2)), 1)
    with pytest.raises(InvalidInputError):
        rank_corpus(np.ones((2, 3)), np.ones((4, 3)), 0)
    with pytest.raises(NonFiniteError):
        rank_corpus(np.full((2, 3), np.nan), np.ones((4, 3)), 1)


def test_ndcg_graded_by_hand() -> None:
    ranking = np.array([[2, 0, 1, 3], [3, 1, 0, 2]])
    qrels = {"q1": {"d0": 2, "d1": 1}, "q2": {"d1": 1}}
    # q1: gains (0, 2, 1) at ranks 1..3 → DCG = 2/log2(3) + 1/log2(4); ideal (2, 1) → 2 + 1/log2(3)
    q1 = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    # q2: the only relevant doc at rank 2 → 1/log2(3)
    q2 = 1 / math.log2(3)
    got = ndcg_at_k_score(ranking, query_ids=["q1", "q2"], corpus_ids=DOCS, qrels=qrels, k=3)
    assert got == pytest.approx((q1 + q2) / 2, abs=1e-12)
    # k = 1: q1 misses (0), q2 misses (0)
    assert ndcg_at_k_score(ranking, query_ids=["q1", "q2"], corpus_ids=DOCS, qrels=qrels, k=1) == 0


def test_ndcg_perfect_ranking_is_one_and_ideal_is_cut_at_k() -> None:
    ranking = np.array([[0, 1, 2, 3]])
    qrels = {"q": {"d0": 1, "d1": 1, "d2": 1, "d3": 1}}
    assert ndcg_at_k_score(ranking, query_ids=["q"], corpus_ids=DOCS, qrels=qrels, k=2) == 1.0


def test_recall_by_hand() -> None:
    ranking = np.array([[2, 0, 1, 3], [3, 1, 0, 2]])
    qrels = {"q1": {"d0": 2, "d1": 1, "d3": 1}, "q2": {"d1": 1}}
    ids: dict[str, Any] = {"query_ids": ["q1", "q2"], "corpus_ids": DOCS, "qrels": qrels}
    assert recall_at_k_score(ranking, k=2, **ids) == pytest.approx((1 / 3 + 1) / 2)
    assert recall_at_k_score(ranking, k=4, **ids) == 1.0


def test_unjudged_queries_are_skipped_and_counted() -> None:
    docs = np.eye(4)
    queries = np.eye(4)[[0, 1, 2]]
    qrels = {
        "a": {"d0": 1, "missing-doc": 1},  # judged docs outside the corpus do not count
        "b": {"nowhere": 1},  # no relevant doc in the corpus → skipped
        "c": {"d3": 0},  # grade 0 is not relevant → skipped
        "zzz": {"d1": 1},  # judged but not among the queries → ignored
    }
    out = retrieval_scores(
        queries, docs, query_ids=["a", "b", "c"], corpus_ids=DOCS, qrels=qrels, k=1
    )
    assert out == {
        "k": 1,
        "queries": 1,
        "skipped_queries": 2,
        "recall_at_1_score": 1.0,
        "ndcg_at_10_score": 1.0,
    }


def test_retrieval_errors() -> None:
    docs = np.eye(4)
    ids: dict[str, Any] = {"query_ids": ["a"], "corpus_ids": DOCS}
    with pytest.raises(InvalidInputError, match="judged relevant"):
        retrieval_scores(docs[:1], docs, qrels={"a": {"elsewhere": 1}}, **ids)
    with pytest.raises(ShapeMismatchError):
        retrieval_scores(docs[:2], docs, qrels={"a": {"d0": 1}}, **ids)
    with pytest.raises(ShapeMismatchError):
        retrieval_scores(docs[:1], docs, query_ids=["a"], corpus_ids=DOCS[:3], qrels={})
    with pytest.raises(InvalidInputError, match="duplicate"):
        ndcg_at_k_score(
            np.array([[0]]), query_ids=["a"], corpus_ids=["x", "x"], qrels={"a": {"x": 1}}, k=1
        )
    with pytest.raises(InvalidInputError, match="outside"):
        recall_at_k_score(np.array([[7]]), qrels={"a": {"d0": 1}}, **ids)
    with pytest.raises(ShapeMismatchError):
        recall_at_k_score(np.array([0.5]), qrels={"a": {"d0": 1}}, **ids)
    # a grade beyond the float range was an OverflowError (a job's internal error)
    for grade, why in ((10**400, "finite"), (float("nan"), "finite"), (True, "a number, got bool")):
        with pytest.raises(InvalidInputError, match=why) as caught:
            ndcg_at_k_score(np.array([[0]]), qrels={"a": {"d0": grade}}, **ids, k=1)
        assert "qrels['a']['d0']" in caught.value.message
    assert ndcg_at_k_score(np.array([[0]]), qrels={"a": {"d0": np.int64(2)}}, **ids, k=1) == 1.0
    # a document twice in a ranking scored nDCG 2.13 and recall 3.0; other contract breaks
    three = {"query_ids": ["q"], "corpus_ids": ["a", "b", "c"], "qrels": {"q": {"a": 1}}}
    for score in (ndcg_at_k_score, recall_at_k_score):
        with pytest.raises(InvalidInputError, match="names a document more than once"):
            score(np.array([[0, 0, 0]]), k=3, **three)
        with pytest.raises(ShapeMismatchError, match="fewer than k = 3"):
            score(np.array([[0, 1]]), k=3, **three)
        for k in (2.5, "3", True):
            with pytest.raises(InvalidInputError, match="k must be an integer"):
                score(np.array([[0, 1, 2]]), k=k, **three)
        assert score(np.array([[0, 1, 2]]), k=10**10, **three) == 1.0  # k beyond the corpus
        for qrels in ([1], {"q": ["a"]}):
            with pytest.raises(InvalidInputError, match="qrels must be a mapping"):
                score(np.array([[0, 1, 2]]), k=3, **{**three, "qrels": qrels})
    with pytest.raises(InvalidInputError, match="no documents"):
        rank_corpus(np.eye(3), np.zeros((0, 3)), 5)
    with pytest.raises(InvalidInputError, match="k must be an integer"):
        rank_corpus(np.eye(3), np.eye(3), float("nan"))


def test_native_retrieval_on_the_fixture(scifact_small: Any) -> None:
    data = scifact_small
    scores = {
        key: retrieval_scores(
            data.queries[key],
            data.corpus[key],
            query_ids=data.query_ids,
            corpus_ids=data.corpus_ids,
            qrels=data.qrels,
        )
        for key in ("minilm", "mpnet", "pml3")
    }
    for out in scores.values():
        assert out["queries"] == 100 and out["skipped_queries"] == 0
        assert 0.4 < out["ndcg_at_10_score"] < 1.0
        assert 0.4 < out["recall_at_10_score"] <= 1.0
    # On 400 documents the stronger models keep their order: mpnet > pml3.
    assert scores["mpnet"]["ndcg_at_10_score"] > scores["pml3"]["ndcg_at_10_score"]


def _load_scifact(
    root: Path, key: str
) -> tuple[np.ndarray, np.ndarray, list[str], list[str], dict[str, dict[str, int]]]:
    scifact = root / "scifact"
    ids = json.loads((scifact / "ids.json").read_text())
    qrels: dict[str, dict[str, int]] = {}
    for line in (scifact / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        query, doc, grade = line.split("\t")
        qrels.setdefault(query, {})[doc] = int(grade)
    test_queries = [q for q in ids["queries"] if q in qrels]
    row = {q: i for i, q in enumerate(ids["queries"])}
    emb = load_file(scifact / "embeddings" / f"{key}.safetensors")
    queries = emb["queries"][[row[q] for q in test_queries]]
    return queries, emb["corpus"], test_queries, ids["corpus"], qrels


@pytest.mark.shared
@pytest.mark.parametrize("key", ["minilm", "e5", "pml3"])
def test_native_ndcg_reproduces_published_scifact_figures(shared_data: Path, key: str) -> None:
    expected = json.loads((shared_data / "scifact" / "native_ndcg.json").read_text())["scores"]
    queries, corpus, query_ids, corpus_ids, qrels = _load_scifact(shared_data, key)
    out = retrieval_scores(queries, corpus, query_ids=query_ids, corpus_ids=corpus_ids, qrels=qrels)
    assert out["queries"] == 300 and out["skipped_queries"] == 0
    assert out["ndcg_at_10_score"] == pytest.approx(expected[key], abs=1e-4)
    if key == "minilm":
        assert round(out["ndcg_at_10_score"], 3) == 0.645  # the MTEB figure
