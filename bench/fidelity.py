"""Fidelity to the information bound: learning curve, progressive migration, out of domain.

The **bound** of a pair is min(source-native, target-native) nDCG@10 on SciFact's 300 test
queries: a translated vector only carries what the source model captured, so keeping the
old model is the natural ceiling. Everything here is cross-fitted: no document is
translated by a stitch that saw it (documents split into 5 folds, each fold translated by
a stitch fitted on the other four), and test queries never enter a fit.

- **Learning curve** ("how many documents must we re-embed to calibrate?"): for each K,
  every fold's stitch is fitted on K documents drawn (seeded) from the other four folds,
  the whole translated corpus is searched by native target queries, and nDCG@10 is
  reported over the bound; the mean over seeds (each seed its own folds and draws).
- **Progressive migration**: with the cross-fitted translations of a bundled pair (the
  bundled stitch's method and options, SciFact documents only), a fraction f of the
  documents is replaced by its native target vectors; nDCG@10 of native target queries
  over the mixed corpus, in random order (mean over seeds) and lowest-confidence-first
  when :mod:`lead.confidence` exists (the fold stitch is then fitted on 80 % of its
  training documents and its confidence head on the other 20 %). Each curve with and
  without the variance-restoring output scale (:mod:`lead.calibration`), which is fitted
  on the fold's training documents.
- **Out of domain (a proxy)**: ``../shared/data/stsb`` holds sentences and embeddings but
  **no gold similarity labels** (and there is no network), so the STS-B Spearman against
  gold scores cannot be computed. Instead, for a seeded sample of STS-B sentences (never
  in any fit here: the stitches are fitted on SciFact documents only), each sentence ``a``
  is paired with its nearest neighbours and with random sentences in target space (so
  similarities spread), and the Spearman correlation between the mixed-space cosine
  ``cos(stitch(src_a), tgt_b)`` and the target model's native cosine ``cos(tgt_a, tgt_b)``
  is reported, beside the source model's own ``cos(src_a, src_b)`` against the same
  native cosine (what keeping the old model gives). A value of 1 means the translated
  space ranks pairs exactly like the target model.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import numpy as np

from bench.common import log
from bench.data import REPO, load_scifact, load_stsb
from lead.metrics import spearman_score

#: Bundled stitch id -> (source, target) model keys.
BUNDLED = {
    "minilm-to-mpnet": ("minilm", "mpnet"),
    "minilm-to-e5": ("minilm", "e5"),
    "minilm-to-pml3": ("minilm", "pml3"),
    "mpnet-to-minilm": ("mpnet", "minilm"),
    "e5-to-minilm": ("e5", "minilm"),
}
FOLDS = 5


def bundled_method(stitch_id: str) -> tuple[str, dict[str, Any]]:
    """The method and options the bundled stitch was fitted with (its ``config.json``)."""
    fit = json.loads((REPO / "models" / stitch_id / "config.json").read_text())["fit"]
    return str(fit["method"]), dict(fit.get("options") or {})


def curve_options(src: str, tgt: str, method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options a learning-curve row fits ``method`` with: on a bundled pair, when
    ``method`` is the bundled stitch's, the bundled stitch's own options; else ``options``."""
    for stitch_id, pair in BUNDLED.items():
        if pair == (src, tgt):
            bundled, bundled_options = bundled_method(stitch_id)
            if bundled == method:
                return bundled_options
    return options


def has_confidence() -> bool:
    """Whether this checkout has :mod:`lead.confidence` (per-vector confidence heads)."""
    return importlib.util.find_spec("lead.confidence") is not None


def _ndcg(queries: np.ndarray, docs: np.ndarray, ids: list[str]) -> float:
    from lead.retrieval import retrieval_scores

    scifact = load_scifact()
    return float(
        retrieval_scores(
            queries, docs, query_ids=scifact.test_query_ids, corpus_ids=ids, qrels=scifact.qrels
        )["ndcg_at_10_score"]
    )


def bound(src: str, tgt: str) -> dict[str, float]:
    """Source-native, target-native and bound nDCG@10 over the pair's shared documents."""
    scifact = load_scifact()
    X, Y, ids = scifact.pair(src, tgt)
    source = _ndcg(scifact.test_queries(src), X, ids)
    target = _ndcg(scifact.test_queries(tgt), Y, ids)
    return {
        "source_native_ndcg_at_10_score": source,
        "target_native_ndcg_at_10_score": target,
        "bound_ndcg_at_10_score": min(source, target),
    }


def _translate(stitch: Any, X: np.ndarray) -> np.ndarray:
    from lead import apply_stitch

    return apply_stitch(stitch, X).numpy()


def learning_point(
    src: str, tgt: str, method: str, options: dict[str, Any], size: int, seed: int
) -> dict[str, Any]:
    """Cross-fitted document-side nDCG@10 with every fold's stitch fitted on ``size`` pairs."""
    from lead.fitting import fit_stitch
    from lead.splits import kfold_indices

    scifact = load_scifact()
    X, Y, ids = scifact.pair(src, tgt)
    rng = np.random.default_rng(seed)
    translated = np.empty_like(Y)
    parts = kfold_indices(len(ids), FOLDS, seed)
    for f, test in enumerate(parts):
        train = np.concatenate([p for g, p in enumerate(parts) if g != f])
        rows = np.sort(rng.choice(train, size=size, replace=False))
        stitch = fit_stitch(X[rows], Y[rows], method, seed=seed, **options)
        translated[test] = _translate(stitch, X[test])
    score = _ndcg(scifact.test_queries(tgt), translated, ids)
    b = bound(src, tgt)
    log(f"learning curve {src}->{tgt} {method} K={size} seed={seed}: nDCG@10 {score:.3f}")
    return {
        "source": src,
        "target": tgt,
        "method": method,
        "train_pairs": size,
        "seed": seed,
        "ndcg_at_10_score": score,
        "ndcg_at_10_ratio": score / b["target_native_ndcg_at_10_score"],
        "ndcg_at_10_bound_ratio": score / b["bound_ndcg_at_10_score"],
    }


def _fold_translations(
    X: np.ndarray, Y: np.ndarray, method: str, options: dict[str, Any], with_confidence: bool
) -> dict[str, Any]:
    """Cross-fitted translations, plain and with the output scale; with a confidence head
    (fitted on a 20 % split of each fold's training rows) also each row's confidence."""
    import torch

    from lead.calibration import fit_output_scale
    from lead.fitting import fit_stitch
    from lead.splits import holdout_split, kfold_indices

    plain, calibrated = np.empty_like(Y), np.empty_like(Y)
    confidence = np.empty(len(Y), dtype=np.float64) if with_confidence else None
    scales = []
    parts = kfold_indices(len(X), FOLDS, 0)
    for f, test in enumerate(parts):
        train = np.concatenate([p for g, p in enumerate(parts) if g != f])
        held = np.array([], dtype=np.int64)
        if with_confidence:
            fit_rows, held_rows = holdout_split(len(train), 0.2, seed=0)
            train, held = train[fit_rows], train[held_rows]
        stitch = fit_stitch(X[train], Y[train], method, seed=0, **options)
        plain[test] = _translate(stitch, X[test])
        if confidence is not None:
            from lead import confidence as lconf  # type: ignore[attr-defined,unused-ignore]

            lconf.fit_confidence(stitch, X[train], Y[train], X[held], Y[held], seed=0)
            _, conf, _ = lconf.translate_with_confidence(stitch, torch.from_numpy(X[test]))
            confidence[test] = conf.double().numpy()
        scales.append(fit_output_scale(stitch, X[train], Y[train]))
        calibrated[test] = _translate(stitch, X[test])
    return {"plain": plain, "calibrated": calibrated, "scales": scales, "confidence": confidence}


def _mix_curve(
    translated: np.ndarray,
    Y: np.ndarray,
    queries: np.ndarray,
    ids: list[str],
    fractions: tuple[float, ...],
    orders: list[np.ndarray],
) -> list[float]:
    """Mean nDCG@10 over ``orders`` when the first ``f n`` rows of each order are native."""
    curve = []
    for f in fractions:
        scores = []
        for order in orders:
            docs = translated.copy()
            native = order[: round(f * len(order))]
            docs[native] = Y[native]
            scores.append(_ndcg(queries, docs, ids))
        curve.append(float(np.mean(scores)))
    return curve


def progressive(
    stitch_id: str,
    src: str,
    tgt: str,
    method: str,
    options: dict[str, Any],
    fractions: tuple[float, ...],
    seeds: int,
) -> dict[str, Any]:
    """Progressive migration curves of one pair and method, with and without the scale."""
    scifact = load_scifact()
    X, Y, ids = scifact.pair(src, tgt)
    queries = scifact.test_queries(tgt)
    confident = has_confidence()
    fits = _fold_translations(X, Y, method, options, False)
    random_orders = [np.random.default_rng(s).permutation(len(ids)) for s in range(seeds)]
    out: dict[str, Any] = {
        "stitch": stitch_id,
        "source": src,
        "target": tgt,
        "method": method,
        "options": options,
        "fractions": list(fractions),
        "random_seeds": seeds,
        "output_scales": fits["scales"],
        **bound(src, tgt),
    }
    for variant in ("plain", "calibrated"):
        curve = _mix_curve(fits[variant], Y, queries, ids, fractions, random_orders)
        out[variant] = {"random": curve}
    if confident:
        conf = _fold_translations(X, Y, method, options, True)
        order = [np.argsort(conf["confidence"], kind="stable")]
        for variant in ("plain", "calibrated"):
            out[variant]["confidence_80pct_fit"] = {
                "random": _mix_curve(conf[variant], Y, queries, ids, fractions, random_orders),
                "lowest_confidence_first": _mix_curve(
                    conf[variant], Y, queries, ids, fractions, order
                ),
            }
        out["confidence_note"] = "fold stitches fitted on 80 % of their training rows"
    else:
        out["confidence_note"] = "no lead.confidence in this checkout: no confidence order"
    for variant in ("plain", "calibrated"):
        curve = dict(zip(fractions, out[variant]["random"], strict=True))
        out[variant]["never_below_f0"] = {
            str(f): curve[f] >= curve[0.0] for f in (0.2, 0.5) if f in curve and 0.0 in curve
        }
    log(
        f"progressive {stitch_id} {method}: random plain "
        + " ".join(f"{v:.3f}" for v in out["plain"]["random"])
        + ", calibrated "
        + " ".join(f"{v:.3f}" for v in out["calibrated"]["random"])
    )
    return out


def out_of_domain(
    stitch_id: str,
    src: str,
    tgt: str,
    method: str,
    options: dict[str, Any],
    sentences: int = 2000,
    neighbours: int = 5,
    random_partners: int = 5,
) -> dict[str, Any]:
    """Spearman of mixed-space cosines with the target model's native cosines on STS-B
    sentences that no fit here saw (a proxy: the data has no gold similarity labels)."""
    import torch

    from lead import load_stitch
    from lead.calibration import fit_output_scale
    from lead.fitting import fit_stitch

    X, Y, _ = load_scifact().pair(src, tgt)
    S, T = load_stsb(src), load_stsb(tgt)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(len(S), size=min(sentences, len(S)), replace=False))
    S, T = S[rows].astype(np.float64), T[rows].astype(np.float64)
    sims = T @ T.T
    np.fill_diagonal(sims, -np.inf)
    near = np.argsort(-sims, axis=1)[:, :neighbours]
    far = rng.integers(0, len(rows), size=(len(rows), random_partners))
    a = np.repeat(np.arange(len(rows)), neighbours + random_partners)
    b = np.concatenate([near, far], axis=1).reshape(-1)
    keep = a != b
    a, b = a[keep], b[keep]

    def cos(P: np.ndarray, R: np.ndarray) -> np.ndarray:
        P = P / np.linalg.norm(P, axis=1, keepdims=True)
        R = R / np.linalg.norm(R, axis=1, keepdims=True)
        return np.asarray((P[a] * R[b]).sum(axis=1))

    native = cos(T, T)
    stitch = fit_stitch(X, Y, method, seed=0, **options)  # SciFact documents only
    plain = _translate(stitch, S.astype(np.float32)).astype(np.float64)
    fit_output_scale(stitch, X, Y)
    calibrated = _translate(stitch, S.astype(np.float32)).astype(np.float64)
    bundled = load_stitch(REPO / "models" / stitch_id)
    with torch.no_grad():
        seen = _translate(bundled, S.astype(np.float32)).astype(np.float64)
    out = {
        "stitch": stitch_id,
        "source": src,
        "target": tgt,
        "method": method,
        "gold_labels": "absent: proxy against the target model's native cosine",
        "sentences": len(rows),
        "pairs": len(a),
        "neighbours": neighbours,
        "random_partners": random_partners,
        "mixed_spearman_similarity": spearman_score(cos(plain, T), native),
        "mixed_calibrated_spearman_similarity": spearman_score(cos(calibrated, T), native),
        "source_model_spearman_similarity": spearman_score(cos(S, S), native),
        "bundled_stitch_mixed_spearman_similarity": spearman_score(cos(seen, T), native),
        "bundled_stitch_note": "the bundled stitch was fitted with 90 % of the STS-B sentences "
        "(the other 10 % calibrate its confidence head): mostly in domain",
    }
    log(
        f"out of domain {stitch_id}: mixed {out['mixed_spearman_similarity']:.3f}, source "
        f"model {out['source_model_spearman_similarity']:.3f} (proxy, no gold labels)"
    )
    return out


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run(
    *,
    curve_pairs: list[tuple[str, str]],
    curve_sizes: tuple[int, ...],
    curve_methods: dict[str, dict[str, Any]],
    curve_seeds: int,
    progressive_ids: list[str],
    progressive_extra: dict[str, dict[str, Any]],
    progressive_extra_ids: list[str],
    fractions: tuple[float, ...],
    mix_seeds: int,
    ood_ids: list[str],
    ood_sentences: int,
    workers: int = 2,
    method_options: dict[str, dict[str, Any]] | None = None,
    curve_seeds_by_method: dict[str, int] | None = None,
) -> dict[str, Any]:
    """All three studies, in ``workers`` processes of one torch thread each."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    overrides = method_options or {}
    tasks: list[tuple[str, Any, tuple[Any, ...]]] = []
    for stitch_id in progressive_ids:
        method, options = bundled_method(stitch_id)
        options = {**options, **overrides.get(method, {})}
        src, tgt = BUNDLED[stitch_id]
        args = (stitch_id, src, tgt, method, options, fractions, mix_seeds)
        tasks.append(("progressive", progressive, args))
        if stitch_id in ood_ids:
            ood_args = (stitch_id, src, tgt, method, options, ood_sentences)
            tasks.append(("ood", out_of_domain, ood_args))
    for stitch_id in progressive_extra_ids:
        src, tgt = BUNDLED[stitch_id]
        for method, options in progressive_extra.items():
            args = (stitch_id, src, tgt, method, options, fractions, mix_seeds)
            tasks.append(("progressive", progressive, args))
    for src, tgt in curve_pairs:
        for size in curve_sizes:
            for method, options in curve_methods.items():
                for seed in range((curve_seeds_by_method or {}).get(method, curve_seeds)):
                    fit_options = curve_options(src, tgt, method, options)
                    args = (src, tgt, method, fit_options, size, seed)
                    tasks.append(("curve", learning_point, args))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker) as pool:
        futures = [(kind, pool.submit(fn, *args)) for kind, fn, args in tasks]
        done = [(kind, future.result()) for kind, future in futures]
    return {
        "bounds": {f"{s}->{t}": bound(s, t) for s, t in {*curve_pairs, *BUNDLED.values()}},
        "learning_curve": {
            "protocol": "cross-fitted, 5 folds; each fold's stitch fitted on K documents "
            "drawn from the other folds; whole translated corpus, 300 test queries",
            "sizes": list(curve_sizes),
            "seeds": curve_seeds,
            "seeds_by_method": curve_seeds_by_method or {},
            "methods": curve_methods,
            "rows": [r for kind, r in done if kind == "curve"],
        },
        "progressive": [r for kind, r in done if kind == "progressive"],
        "out_of_domain": {
            "gold_labels": "absent in ../shared/data/stsb: Spearman against the target "
            "model's native cosine, not against human similarity scores",
            "rows": [r for kind, r in done if kind == "ood"],
        },
    }
