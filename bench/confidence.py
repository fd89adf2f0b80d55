"""Per-vector confidence: Spearman(confidence, true cosine) on held-out rows, and its cost.

``python -m bench.confidence [--pairs minilm-mpnet,...] [--methods ridge,procrustes,mlp,gated]
[--mixed]`` (standalone, needs ``../shared/data``; ~10 minutes on 2 cores for the first three
methods, ~8 more for gated); ``results/confidence.json`` (the methods run replace theirs,
the others are kept; with ``--mixed`` they are recorded as ``METHOD+general``).

Protocol per pair and method (seed 0): SciFact documents split 60 / 20 / 20 into train /
calibration / test, STS-B sentences 70 / 15 / 15 likewise; the stitch is fitted on the train
documents, the 809 training queries and the train sentences (as ``models/build.py`` does;
gated: the sentences at weight 0.05); :func:`lead.confidence.fit_confidence` calibrates on
the calibration documents (as ``lead fit --holdout-from 1`` does; ``--mixed``: and on the
calibration sentences as general rows, as ``--general-from 3`` does);
the Spearman correlation between the confidence and the true ``cos(translation, native)``
is measured on the test documents (in domain) and the test sentences (out of domain), rows
that neither the stitch nor the head saw. ``fit_oof`` is the out-of-fold figure that
``fit_confidence`` itself reports (``fit_oof_generic``: without the stitch's own features).
The cost is what ``Stitch.forward_scored`` (the forward and its confidence, as the service
computes them) adds to the stitch's forward, both batch-invariant, at batch 1 and 1,024
(median of 200 / 20 runs, one thread; a gated stitch's confidence features come from its
forward's memory search).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lead.metrics import spearman_score

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
PAIRS = ("minilm-mpnet", "minilm-e5", "minilm-pml3", "e5-minilm", "mpnet-minilm")
METHODS: dict[str, dict[str, Any]] = {
    "ridge": {},
    "procrustes": {},
    "mlp": {"hidden_dim": 512, "max_epochs": 8},
    "gated": {"hidden_dim": 512, "max_epochs": 8, "patience": 2},
}
#: Row weights of the gated stitch's training parts (as in ``models/build.py``).
GATED_WEIGHTS = {"docs": 1.0, "queries": 1.0, "sts": 0.05}


def _split(n: int, shares: tuple[float, float], rng: np.random.Generator) -> list[np.ndarray]:
    perm = rng.permutation(n)
    a, b = int(n * shares[0]), int(n * (shares[0] + shares[1]))
    return [perm[:a], perm[a:b], perm[b:]]


def _median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def _cost(stitch: Any) -> dict[str, float]:
    from lead.batch_invariance import forward_batch_invariant

    out: dict[str, float] = {}
    torch.set_num_threads(1)
    with torch.inference_mode():
        for batch, repeat in ((1, 200), (1024, 20)):
            x = torch.nn.functional.normalize(torch.randn(batch, stitch.d_src), dim=1)
            forward = _median_ms(lambda x=x: forward_batch_invariant(stitch, x), repeat)
            scored = _median_ms(lambda x=x: stitch.forward_scored(x), repeat)
            score = max(scored - forward, 0.0)
            out[f"forward_ms_batch{batch}"] = round(forward, 4)
            out[f"score_ms_batch{batch}"] = round(score, 4)
            out[f"score_over_forward_batch{batch}"] = round(score / forward, 3)
    torch.set_num_threads(2)
    return out


def run_pair(pair: str, methods: list[str], mixed: bool = False) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "models"))
    from build import scifact_pairs

    from lead.confidence import fit_confidence, translate_with_confidence
    from lead.fitting import fit_stitch

    src, tgt = pair.split("-")
    p = scifact_pairs(DATA, src, tgt)
    rng = np.random.default_rng(0)
    X, Y = p["source_docs"], p["target_docs"]
    Xs, Ys = p["source_sts"], p["target_sts"]
    Xq, Yq = p["source_queries"], p["target_queries"]
    dtr, dca, dte = _split(len(X), (0.6, 0.2), rng)
    str_, sca, ste = _split(len(Xs), (0.7, 0.15), rng)
    X_train = np.concatenate([X[dtr], Xq, Xs[str_]])
    Y_train = np.concatenate([Y[dtr], Yq, Ys[str_]])
    general = {"X_general": Xs[sca], "Y_general": Ys[sca]} if mixed else {}
    weights = np.concatenate(
        [
            np.full(n, GATED_WEIGHTS[part])
            for part, n in (("docs", len(dtr)), ("queries", len(Xq)), ("sts", len(str_)))
        ]
    )
    result: dict[str, Any] = {}
    for method in methods:
        start = time.perf_counter()
        extra = {"sample_weight": weights} if method == "gated" else {}
        stitch = fit_stitch(X_train, Y_train, method, seed=0, **extra, **METHODS[method])
        fit_s = time.perf_counter() - start
        start = time.perf_counter()
        report = fit_confidence(stitch, X_train, Y_train, X[dca], Y[dca], seed=0, **general)
        head_s = time.perf_counter() - start
        row: dict[str, Any] = {
            "calibrated_on": "documents and sentences" if mixed else "documents",
            "fit_oof": report["in_domain_spearman_score"],
            "fit_oof_generic": report["generic_spearman_score"],
        }
        for name, (A, B) in (
            ("in_domain", (X[dte], Y[dte])),
            ("out_of_domain", (Xs[ste], Ys[ste])),
        ):
            y, conf, ood = translate_with_confidence(stitch, A)
            yn = y.double().numpy()
            cos = (yn * B).sum(1) / np.linalg.norm(yn, axis=1) / np.linalg.norm(B, axis=1)
            row[f"spearman_{name}"] = round(spearman_score(conf.numpy(), cos), 4)
            row[f"ood_fraction_{name}"] = round(float(ood.float().mean()), 4)
            row[f"mean_abs_error_{name}"] = round(float(np.abs(conf.numpy() - cos).mean()), 4)
        garbage = torch.randn(1000, stitch.d_src)
        row["ood_fraction_gaussian"] = float(
            translate_with_confidence(stitch, garbage)[2].float().mean()
        )
        row["fit_head_s"] = round(head_s, 2)
        row["fit_stitch_s"] = round(fit_s, 2)
        row.update(_cost(stitch))
        key = f"{method}+general" if mixed else method
        print(pair, key, json.dumps(row), flush=True)
        result[key] = row
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--mixed", action="store_true", help="calibrate on sentences too")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "confidence.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for pair in args.pairs.split(","):
        results.setdefault(pair, {}).update(run_pair(pair, args.methods.split(","), args.mixed))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
