"""Zero-shot stitching on real SciFact embeddings: few anchors, and no pairs at all.

``python -m bench.zeroshot`` (from the repository root, ``../shared`` beside it) writes
``bench/results/zeroshot.json``. Pair: all-MiniLM-L6-v2 → paraphrase-MiniLM-L3-v2
(``minilm`` → ``pml3``, both 384-d), the 5,183 SciFact documents. 1,000 documents (a seeded
permutation) are held out; nothing is ever fitted on them.

(a) Anchors. For k in 100, 300, 1000 the first k documents of the rest are the anchors;
:func:`lead.anchors.fit_anchors`, :func:`lead.fitting.fit_ridge` (its own hold-out choice
of alpha) and :func:`lead.fitting.fit_procrustes` (centred orthogonal Procrustes, the
latent-space-translation recipe of Maiorca et al.) are fitted on the same k pairs. On the
1,000 held-out documents: R² (reference: the mean of the anchors' targets), top-1 among
the 1,000 and mean cosine. Document-side retrieval: 5 folds; fold f is translated by a
stitch fitted on k anchors drawn from the other folds; native pml3 test queries (300)
search the translated corpus; nDCG@10 as a ratio to all-native pml3 retrieval.

(b) No pairs. :func:`lead.unsupervised.fit_unsupervised` with ``X`` = minilm vectors of
2,000 documents and ``Y`` = pml3 vectors of (i) 2,000 *other* documents ("disjoint") or
(ii) the same 2,000 documents shuffled ("same_shuffled"), three seeds each; top-1 and R²
on the 1,000 held-out documents, beside ridge and Procrustes fitted on the 2,000 true
pairs. Retrieval: 5 folds as in :func:`lead.crossfit.crossfit_retrieval`; fold f is
translated by an unsupervised stitch fitted on the other folds split into two disjoint
halves (minilm vectors of one, pml3 vectors of the other), beside cross-fitted supervised
ridge and Procrustes on the same folds; and again with each fold's stitch fitted on the
other folds' minilm vectors and the same documents' pml3 vectors shuffled. Query side:
minilm test queries translated by an unsupervised stitch fitted on the whole corpus (two
disjoint halves, or all documents shuffled), searching native pml3 vectors.

Every fit runs with one torch thread (see ``bench/fitcost.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.common import log, machine, write_result
from bench.data import MODEL_IDS, load_scifact
from lead.anchors import fit_anchors
from lead.crossfit import crossfit_retrieval
from lead.fitting import fit_procrustes, fit_ridge
from lead.metrics import mean_cosine_similarity, r2_score, top1_accuracy_score
from lead.retrieval import retrieval_scores
from lead.splits import kfold_indices
from lead.stitches import Stitch
from lead.unsupervised import fit_unsupervised

SOURCE, TARGET = "minilm", "pml3"
HELD_OUT = 1000
ANCHOR_COUNTS = (100, 300, 1000)
UNPAIRED_ROWS = 2000
SEEDS = (0, 1, 2)
FOLDS = 5
THREADS = 1

Fit = Callable[[np.ndarray, np.ndarray], Stitch]
ANCHOR_METHODS: dict[str, Fit] = {
    "anchors": lambda X, Y: fit_anchors(X, Y),
    "ridge": lambda X, Y: fit_ridge(X, Y),
    "procrustes": lambda X, Y: fit_procrustes(X, Y),
}


def _translate(stitch: Stitch, X: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return stitch(torch.from_numpy(X).float()).double().numpy()


def _held_out_scores(
    stitch: Stitch, X: np.ndarray, Y: np.ndarray, ref: np.ndarray
) -> dict[str, float]:
    pred = _translate(stitch, X)
    return {
        "r2_score": r2_score(Y, pred, reference_mean=ref),
        "top1_accuracy_score": top1_accuracy_score(pred, Y),
        "mean_cosine_similarity": mean_cosine_similarity(Y, pred),
    }


def _timed(fit: Callable[[], Stitch]) -> tuple[Stitch, float]:
    start = time.perf_counter()
    stitch = fit()
    return stitch, time.perf_counter() - start


def run() -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    sf = load_scifact((SOURCE, TARGET))
    X, Y, ids = sf.pair(SOURCE, TARGET)
    queries_src, queries_tgt = sf.test_queries(SOURCE), sf.test_queries(TARGET)

    def ndcg(queries: np.ndarray, docs: np.ndarray) -> float:
        scores = retrieval_scores(
            queries, docs, query_ids=sf.test_query_ids, corpus_ids=ids, qrels=sf.qrels
        )
        return float(scores["ndcg_at_10_score"])

    native = ndcg(queries_tgt, Y)
    order = np.random.default_rng(0).permutation(len(X))
    test, pool = order[:HELD_OUT], order[HELD_OUT:]
    folds = kfold_indices(len(X), FOLDS, 0)

    def others(f: int) -> np.ndarray:
        return np.concatenate([p for g, p in enumerate(folds) if g != f])

    # (a) anchors vs ridge vs Procrustes on the same k pairs
    anchors: dict[str, Any] = {}
    for k in ANCHOR_COUNTS:
        rows = pool[:k]
        fold_anchors = [np.random.default_rng(f).permutation(others(f))[:k] for f in range(FOLDS)]
        for name, fit in ANCHOR_METHODS.items():
            stitch, seconds = _timed(lambda fit=fit, rows=rows: fit(X[rows], Y[rows]))
            entry: dict[str, Any] = {
                "fit_seconds": seconds,
                **_held_out_scores(stitch, X[test], Y[test], Y[rows].mean(axis=0)),
            }
            translated = np.empty_like(Y, dtype=np.float64)
            for f, part in enumerate(folds):
                a = fold_anchors[f]
                translated[part] = _translate(fit(X[a], Y[a]), X[part])
            entry["document_side_ndcg_at_10_score"] = ndcg(queries_tgt, translated)
            entry["document_side_ndcg_at_10_ratio"] = (
                entry["document_side_ndcg_at_10_score"] / native
            )
            anchors.setdefault(str(k), {})[name] = entry
            ratio = entry["document_side_ndcg_at_10_ratio"]
            log(f"zeroshot: k={k} {name}: top1 {entry['top1_accuracy_score']:.3f} "
                f"r2 {entry['r2_score']:.3f} ndcg ratio {ratio:.3f}")  # fmt: skip

    # (b) no pairs: held-out top-1 in two unpaired settings, beside supervised fits
    set_a, set_b = pool[:UNPAIRED_ROWS], pool[UNPAIRED_ROWS : 2 * UNPAIRED_ROWS]
    unsupervised: dict[str, Any] = {"settings": {}, "supervised_on_the_true_pairs": {}}
    for setting in ("disjoint", "same_shuffled"):
        runs = []
        for seed in SEEDS:
            if setting == "disjoint":
                target_rows = set_b
            else:
                target_rows = np.random.default_rng(100 + seed).permutation(set_a)
            stitch, seconds = _timed(
                lambda t=target_rows, s=seed: fit_unsupervised(X[set_a], Y[t], seed=s)
            )
            entry = {
                "seed": seed,
                "fit_seconds": seconds,
                **_held_out_scores(stitch, X[test], Y[test], Y[target_rows].mean(axis=0)),
                "fit_info": stitch.info.fit,
            }
            runs.append(entry)
            log(f"zeroshot: unsupervised {setting} seed {seed}: top1 "
                f"{entry['top1_accuracy_score']:.3f} in {seconds:.0f} s")  # fmt: skip
        top1 = [r["top1_accuracy_score"] for r in runs]
        unsupervised["settings"][setting] = {
            "source_rows": UNPAIRED_ROWS,
            "target_rows": UNPAIRED_ROWS,
            "runs": runs,
            "top1_min": min(top1),
            "top1_mean": float(np.mean(top1)),
            "fit_seconds_mean": float(np.mean([r["fit_seconds"] for r in runs])),
        }
    for name, fit in (("ridge", fit_ridge), ("procrustes", fit_procrustes)):
        stitch = fit(X[set_a], Y[set_a])
        unsupervised["supervised_on_the_true_pairs"][name] = _held_out_scores(
            stitch, X[test], Y[test], Y[set_a].mean(axis=0)
        )

    # (b) retrieval: cross-fitted unsupervised vs cross-fitted supervised ridge / Procrustes
    def unpaired(rows: np.ndarray, setting: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Source rows and target rows of an unpaired fit on ``rows`` in ``setting``."""
        rows = np.random.default_rng(seed).permutation(rows)
        if setting == "disjoint":
            half = len(rows) // 2
            return rows[:half], rows[half:]
        return rows, np.random.default_rng(seed + 1).permutation(rows)

    retrieval: dict[str, Any] = {"native_ndcg_at_10_score": native}
    for setting in ("disjoint", "same_shuffled"):
        translated = np.empty_like(Y, dtype=np.float64)
        fold_seconds = []
        for f, part in enumerate(folds):
            src, tgt = unpaired(others(f), setting, 200 + f)
            stitch, seconds = _timed(lambda a=src, b=tgt: fit_unsupervised(X[a], Y[b]))
            fold_seconds.append(seconds)
            translated[part] = _translate(stitch, X[part])
            log(f"zeroshot: unsupervised {setting} fold {f}: {seconds:.0f} s")
        src, tgt = unpaired(np.arange(len(X)), setting, 300)
        stitch = fit_unsupervised(X[src], Y[tgt])
        entry = {
            "unpaired_rows_per_fold_fit": [len(s) for s in unpaired(others(0), setting, 0)],
            "document_side_ndcg_at_10_score": ndcg(queries_tgt, translated),
            "query_side_ndcg_at_10_score": ndcg(_translate(stitch, queries_src), Y),
            "fold_fit_seconds": fold_seconds,
        }
        for side in ("document_side", "query_side"):
            entry[f"{side}_ndcg_at_10_ratio"] = entry[f"{side}_ndcg_at_10_score"] / native
        retrieval[f"unsupervised_{setting}"] = entry
        log(f"zeroshot: unsupervised {setting} document-side nDCG@10 ratio "
            f"{entry['document_side_ndcg_at_10_ratio']:.3f}")  # fmt: skip
    for method in ("ridge", "procrustes"):
        out = crossfit_retrieval(
            X, Y, doc_ids=ids, target_queries=queries_tgt, query_ids=sf.test_query_ids,
            qrels=sf.qrels, source_queries=queries_src, method=method, folds=FOLDS, seed=0,
        )  # fmt: skip
        retrieval[f"supervised_{method}_crossfit"] = {
            "document_side": out["document_side"],
            "query_side": out["query_side"],
        }
        log(f"zeroshot: supervised {method} document-side nDCG@10 ratio "
            f"{out['document_side']['ndcg_at_10_ratio']:.3f}")  # fmt: skip
    unsupervised["retrieval"] = retrieval
    return {
        "source": MODEL_IDS[SOURCE],
        "target": MODEL_IDS[TARGET],
        "docs": len(X),
        "held_out_docs": HELD_OUT,
        "test_queries": len(sf.test_query_ids),
        "folds": FOLDS,
        "threads": THREADS,
        "anchors": anchors,
        "unsupervised": unsupervised,
        "machine": machine(),
    }


def main() -> None:
    start = time.perf_counter()
    payload = run()
    payload["seconds"] = time.perf_counter() - start
    path = write_result("zeroshot", payload)
    log(f"zeroshot: wrote {path} in {payload['seconds']:.0f} s")


if __name__ == "__main__":
    main()
