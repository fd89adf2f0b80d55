"""Real SciFact / STS-B embeddings from ``../shared/data``, paired by document id.

Every model embedded the whole SciFact corpus except mpnet (2,560 documents, rows in
``mpnet_corpus_ids.json`` order); a pair of models is evaluated over the documents that
both have, in the row order of the model with fewer documents.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[1]
MODELS = ("minilm", "mpnet", "e5", "pml3", "glove")
MODEL_IDS = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
    "e5": "intfloat/multilingual-e5-small",
    "pml3": "sentence-transformers/paraphrase-MiniLM-L3-v2",
    "glove": "glove-6B-50d-sif",
}


def data_dir() -> Path:
    """``$LEAD_SHARED_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("LEAD_SHARED_DATA", REPO.parent / "shared" / "data")).resolve()


@dataclass
class SciFact:
    """Embeddings of one model: ``corpus`` (n_docs, d), ``queries`` (1109, d), float32."""

    corpus: dict[str, np.ndarray]
    queries: dict[str, np.ndarray]
    corpus_ids: dict[str, list[str]]
    query_ids: list[str]
    qrels: dict[str, dict[str, int]]  # test split: query id → {doc id: grade}
    test_query_ids: list[str] = field(default_factory=list)

    def dim(self, key: str) -> int:
        return int(self.corpus[key].shape[1])

    def pair(self, src: str, tgt: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Document rows both models have: ``(X (n, d_src), Y (n, d_tgt), doc_ids)``."""
        a, b = self.corpus_ids[src], self.corpus_ids[tgt]
        ids = a if len(a) <= len(b) else b
        ia = {d: i for i, d in enumerate(a)}
        ib = {d: i for i, d in enumerate(b)}
        ids = [d for d in ids if d in ia and d in ib]
        xa = self.corpus[src][[ia[d] for d in ids]]
        xb = self.corpus[tgt][[ib[d] for d in ids]]
        return xa, xb, ids

    def test_queries(self, key: str) -> np.ndarray:
        """The 300 test queries' vectors of one model, rows in ``test_query_ids`` order."""
        index = {q: i for i, q in enumerate(self.query_ids)}
        return self.queries[key][[index[q] for q in self.test_query_ids]]


@cache
def load_scifact(models: tuple[str, ...] = MODELS) -> SciFact:
    root = data_dir() / "scifact"
    ids = json.loads((root / "ids.json").read_text())
    corpus, queries, corpus_ids = {}, {}, {}
    for key in models:
        t = load_file(root / "embeddings" / f"{key}.safetensors")
        corpus[key], queries[key] = t["corpus"], t["queries"]
        if key == "mpnet":
            corpus_ids[key] = json.loads(
                (root / "embeddings" / "mpnet_corpus_ids.json").read_text()
            )
        else:
            corpus_ids[key] = list(ids["corpus"])
        assert corpus[key].shape[0] == len(corpus_ids[key]), key
    qrels: dict[str, dict[str, int]] = {}
    with open(root / "qrels" / "test.tsv", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    known = set(ids["queries"])
    test_q = [q for q in qrels if q in known]
    return SciFact(corpus, queries, corpus_ids, list(ids["queries"]), qrels, test_q)


@cache
def load_stsb(key: str) -> np.ndarray:
    """STS-B sentence vectors of one model, (12935, d) float32."""
    return load_file(data_dir() / "stsb" / "embeddings" / f"{key}.safetensors")["sentences"]


def read_documents(doc_ids: list[str]) -> list[str]:
    """``title + " " + text`` of the given SciFact documents (read, never copied)."""
    wanted = set(doc_ids)
    texts: dict[str, str] = {}
    with open(data_dir() / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if doc["_id"] in wanted:
                texts[doc["_id"]] = (doc["title"] + " " + doc["text"]).strip()
    return [texts[d] for d in doc_ids]
