"""Quality on real data: scorecards, cross-fitted retrieval, baselines, learning curves.

For every ordered pair of the real models and every method:

- the lead scorecard (:func:`lead.scorecard.score_stitch`) on a seeded 20 % hold-out of the
  SciFact documents both models have, with retrieval over those held-out documents;
- cross-fitted retrieval (:func:`lead.crossfit.crossfit_retrieval`, 5 folds): native
  target-model queries over the whole translated corpus (document side) and translated
  source-model queries over the native target corpus (query side), both as fractions of
  all-native target retrieval, on all 300 test queries;
- the identity baseline where the dimensions match (the source vectors used as they are).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.common import log
from bench.data import MODEL_IDS, MODELS, SciFact, load_scifact


def ordered_pairs(models: tuple[str, ...] = MODELS) -> list[tuple[str, str]]:
    return [(a, b) for a in models for b in models if a != b]


def _identity_retrieval(scifact: SciFact, src: str, tgt: str) -> dict[str, Any] | None:
    """Source vectors used as target vectors, when the dimensions match."""
    from lead.retrieval import retrieval_scores

    X, Y, ids = scifact.pair(src, tgt)
    if X.shape[1] != Y.shape[1]:
        return None
    q_src, q_tgt = scifact.test_queries(src), scifact.test_queries(tgt)

    def ndcg(queries: np.ndarray, docs: np.ndarray) -> float:
        return float(
            retrieval_scores(
                queries,
                docs,
                query_ids=scifact.test_query_ids,
                corpus_ids=ids,
                qrels=scifact.qrels,
            )["ndcg_at_10_score"]
        )

    native = ndcg(q_tgt, Y)
    return {
        "document_side_ndcg_at_10_ratio": ndcg(q_tgt, X) / native,
        "query_side_ndcg_at_10_ratio": ndcg(q_src, Y) / native,
    }


def evaluate_pair(
    scifact: SciFact,
    src: str,
    tgt: str,
    method: str,
    options: dict[str, Any],
    *,
    crossfit: bool = True,
) -> dict[str, Any]:
    """Hold-out scorecard and (optionally) 5-fold cross-fitted retrieval of one method."""
    from lead.crossfit import crossfit_retrieval
    from lead.fitting import fit_stitch
    from lead.scorecard import RetrievalData, score_stitch
    from lead.splits import holdout_split
    from lead.stitches import StitchInfo

    X, Y, ids = scifact.pair(src, tgt)
    q_src, q_tgt = scifact.test_queries(src), scifact.test_queries(tgt)
    train, test = holdout_split(X.shape[0], 0.2, seed=0)
    info = StitchInfo(source_model=MODEL_IDS[src], target_model=MODEL_IDS[tgt])
    start = time.perf_counter()
    stitch = fit_stitch(X[train], Y[train], method, info=info, seed=0, **options)
    fit_seconds = time.perf_counter() - start
    card = score_stitch(
        stitch,
        X[test],
        Y[test],
        target_train_mean=Y[train].astype(np.float64).mean(axis=0),
        retrieval=RetrievalData(
            target_queries=q_tgt,
            source_queries=q_src,
            query_ids=scifact.test_query_ids,
            corpus_ids=[ids[i] for i in test],
            qrels=scifact.qrels,
        ),
    ).to_dict()
    out: dict[str, Any] = {
        "source": src,
        "target": tgt,
        "method": method,
        "options": options,
        "docs": len(ids),
        "train_pairs": len(train),
        "test_pairs": len(test),
        "fit_seconds": fit_seconds,
        "fit_info": {k: v for k, v in stitch.info.fit.items() if k != "alpha_holdout_mse"},
        "scorecard": card,
        "crossfit": None,
    }
    if crossfit:
        out["crossfit"] = crossfit_retrieval(
            X,
            Y,
            doc_ids=ids,
            target_queries=q_tgt,
            source_queries=q_src,
            query_ids=scifact.test_query_ids,
            qrels=scifact.qrels,
            method=method,
            options=options,
            folds=5,
            seed=0,
        )
    out["seconds"] = time.perf_counter() - start
    return out


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _learning_point(
    src: str, tgt: str, n: int, method: str, options: dict[str, Any]
) -> dict[str, Any]:
    """Hold-out quality of a stitch fitted on ``n`` training pairs (a nested seeded subset of
    the 80 % training documents; the same 20 % held-out documents for every ``n``)."""
    from lead.fitting import fit_stitch
    from lead.scorecard import RetrievalData, score_stitch
    from lead.splits import holdout_split

    scifact = load_scifact()
    X, Y, ids = scifact.pair(src, tgt)
    train, test = holdout_split(X.shape[0], 0.2, seed=0)
    rows = np.sort(np.random.default_rng(1).permutation(train)[:n])
    stitch = fit_stitch(X[rows], Y[rows], method, seed=0, **options)
    card = score_stitch(
        stitch,
        X[test],
        Y[test],
        target_train_mean=Y[rows].astype(np.float64).mean(axis=0),
        retrieval=RetrievalData(
            target_queries=scifact.test_queries(tgt),
            query_ids=scifact.test_query_ids,
            corpus_ids=[ids[i] for i in test],
            qrels=scifact.qrels,
        ),
    ).to_dict()
    log(f"learning curve {src}->{tgt} {method} n={n}: R2 {card['r2_score']:.3f}")
    return {
        "source": src,
        "target": tgt,
        "method": method,
        "train_pairs": n,
        "test_pairs": len(test),
        "r2_score": card["r2_score"],
        "top1_accuracy_score": card["top1_accuracy_score"],
        "mean_cosine_similarity": card["mean_cosine_similarity"],
        "ndcg_at_10_ratio": card["retrieval"]["ndcg_at_10_ratio"],
    }


def _alignment_pair(a: str, b: str) -> dict[str, Any]:
    """Representation-similarity scores of two models over their shared documents (k = 10,
    SVCCA on 10 directions); the asymmetric ones again with the models swapped under
    ``"reverse"``. A CCA score with too few documents for its directions is None."""
    from lead import metrics
    from lead.errors import TooFewPairsError

    def cca(score: Any, A: Any, B: Any) -> float | None:
        try:
            return float(score(A, B))
        except TooFewPairsError:
            return None

    X, Y, ids = load_scifact().pair(a, b)
    return {
        "docs": len(ids),
        "linear_cka_score": metrics.linear_cka_score(X, Y),
        "unbiased_cka_score": metrics.unbiased_cka_score(X, Y),
        "mutual_knn_score": metrics.mutual_knn_score(X, Y, k=10),
        "cknna_score": metrics.cknna_score(X, Y, k=10),
        "cycle_knn_score": metrics.cycle_knn_score(X, Y, k=10),
        "svcca_score": cca(metrics.svcca_score, X, Y),
        "pwcca_score": cca(metrics.pwcca_score, X, Y),
        "reverse": {
            "cycle_knn_score": metrics.cycle_knn_score(Y, X, k=10),
            "pwcca_score": cca(metrics.pwcca_score, Y, X),
        },
    }


def _identity_pair(src: str, tgt: str) -> dict[str, Any] | None:
    return _identity_retrieval(load_scifact(), src, tgt)


def _native(key: str) -> dict[str, Any]:
    """All-native retrieval of one model over its whole corpus (the published figure)."""
    from lead.retrieval import retrieval_scores

    scifact = load_scifact()
    return retrieval_scores(
        scifact.test_queries(key),
        scifact.corpus[key],
        query_ids=scifact.test_query_ids,
        corpus_ids=scifact.corpus_ids[key],
        qrels=scifact.qrels,
    )


def _evaluate(
    src: str, tgt: str, method: str, options: dict[str, Any], crossfit: bool
) -> dict[str, Any]:
    row = evaluate_pair(load_scifact(), src, tgt, method, options, crossfit=crossfit)
    doc = row["crossfit"]["document_side"]["ndcg_at_10_ratio"] if crossfit else None
    log(
        f"{src}->{tgt} {method}: R2 {row['scorecard']['r2_score']:.3f}, top1 "
        f"{row['scorecard']['top1_accuracy_score']:.3f}, doc-side nDCG ratio "
        f"{'-' if doc is None else f'{doc:.3f}'} ({row['seconds']:.1f} s)"
    )
    return row


def run(
    *,
    pairs: list[tuple[str, str]],
    methods: dict[str, dict[str, Any]],
    mlp_pairs: list[tuple[str, str]],
    mlp_options: dict[str, Any],
    mlp_crossfit_pairs: list[tuple[str, str]],
    curve_pairs: list[tuple[str, str]],
    curve_sizes: tuple[int, ...],
    curve_methods: dict[str, dict[str, Any]],
    align_models: tuple[str, ...] = MODELS,
    workers: int = 2,
) -> dict[str, Any]:
    """Quality, learning curve and alignment, in ``workers`` processes of one torch thread
    each (these figures are not timings; one thread avoids OpenMP oversubscription)."""
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    scifact = load_scifact()
    # slow tasks first, so that the two workers finish together
    tasks: list[tuple[str, Any, tuple[Any, ...]]] = []
    for src, tgt in pairs:
        if (src, tgt) in mlp_pairs:
            crossfit = (src, tgt) in mlp_crossfit_pairs
            tasks.append(("pair", _evaluate, (src, tgt, "mlp", mlp_options, crossfit)))
    tasks.sort(key=lambda t: not t[2][4])
    for src, tgt in pairs:
        for method, options in methods.items():
            tasks.append(("pair", _evaluate, (src, tgt, method, options, True)))
    for src, tgt in curve_pairs:
        n_train = len(scifact.pair(src, tgt)[2]) - round(0.2 * len(scifact.pair(src, tgt)[2]))
        for n in curve_sizes:
            if n > n_train:
                log(f"learning curve {src}->{tgt}: only {n_train} training pairs, no n={n}")
                continue
            for method, options in curve_methods.items():
                tasks.append(("curve", _learning_point, (src, tgt, n, method, options)))
    for i, a in enumerate(align_models):
        for b in align_models[i + 1 :]:
            tasks.append(("align", _alignment_pair, (a, b)))
    tasks += [("identity", _identity_pair, pair) for pair in pairs]
    tasks += [("native", _native, (key,)) for key in MODELS]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker) as pool:
        futures: list[tuple[str, tuple[Any, ...], Future[dict[str, Any]]]] = [
            (kind, args, pool.submit(fn, *args)) for kind, fn, args in tasks
        ]
        done = [(kind, args, future.result()) for kind, args, future in futures]
    rows = [r for kind, _, r in done if kind == "pair"]
    curve = [r for kind, _, r in done if kind == "curve"]
    align = {f"{a[0]}|{a[1]}": r for kind, a, r in done if kind == "align"}
    identity = {f"{a[0]}->{a[1]}": r for kind, a, r in done if kind == "identity"}
    native = {a[0]: r for kind, a, r in done if kind == "native"}
    quality = {
        "holdout_fraction": 0.2,
        "folds": 5,
        "test_queries": len(scifact.test_query_ids),
        "methods": {**methods, "mlp": mlp_options},
        "pairs": [f"{a}->{b}" for a, b in pairs],
        "mlp_pairs": [f"{a}->{b}" for a, b in mlp_pairs],
        "mlp_crossfit_pairs": [f"{a}->{b}" for a, b in mlp_crossfit_pairs],
        "native_full_corpus": native,
        "identity_retrieval": identity,
        "rows": rows,
    }
    learning = {
        "pairs": [f"{a}->{b}" for a, b in curve_pairs],
        "sizes": list(curve_sizes),
        "methods": curve_methods,
        "rows": curve,
    }
    alignment = {"models": list(align_models), "pairs": align}
    return {"quality": quality, "learning_curve": learning, "alignment": alignment}
