"""Cross-fitted retrieval figures of the bundled stitch pairs on SciFact (``models/README.md``).

    .venv/bin/python models/evaluate.py [--data ../shared/data] [--methods ridge,mlp]

For each pair and method, the documents are split into 5 folds; each fold is translated by
a stitch fitted on the other four (never on test queries), then the 300 native target-model
test queries search the whole translated corpus (document side), and the source-model test
queries translated by a stitch fitted on all documents search the native target corpus
(query side). Both nDCG@10 figures are divided by all-native target-model retrieval and
by the information bound, min(source-native, target-native) nDCG@10 (source native: the
source model's own test queries over its own corpus; a translated vector only carries what
the source model captured, so keeping the old model is the natural ceiling).

Two training regimes: ``scifact`` (the fold's SciFact documents only: what a user gets by
training on their own corpus; for the weighted ``local`` and ``gated`` methods also the
809 non-test SciFact queries) and ``bundled`` (the same plus the bundled stitches' extra
data: the 809 non-test SciFact queries and the 12,935 STS-B sentences). Writes
``models/retrieval.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from build import (
    MODELS_DIR,
    STITCHES,
    WEIGHTED_METHODS,
    WEIGHTS,
    changed_options,
    scifact_pairs,
)
from safetensors.numpy import load_file

from lead.crossfit import crossfit_retrieval

PAIRS = (
    "minilm-to-pml3",
    "minilm-to-e5",
    "minilm-to-mpnet",
    "mpnet-to-minilm",
    "e5-to-minilm",
)
#: name -> (method, options). "ridge" picks its strength by held-out MSE, which favours
#: more shrinkage than retrieval likes; "ridge-1e-6" fixes a small one.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ridge": ("ridge", {}),
    "ridge-1e-6": ("ridge", {"alpha": 1e-6}),
    "procrustes": ("procrustes", {}),
    "mlp": ("mlp", {"hidden_dim": 512, "max_epochs": 8, "patience": 2}),
    # the bundled recipe (models/build.py): weighted parts, capped memory; with the output
    # scale (calibrate_variance) for the e5 pairs, whose mixed corpora need it
    "local": ("local", {"max_memory": 6500}),
    "local-calibrated": ("local", {"max_memory": 6500, "calibrate_variance": True}),
    # the bundled method (models/build.py): the local stitch near the SciFact memory, the
    # MLP elsewhere; with each expert's output scale for the e5 pairs
    "gated": ("gated", {"hidden_dim": 512, "max_epochs": 8, "patience": 2}),
    "gated-calibrated": (
        "gated",
        {"hidden_dim": 512, "max_epochs": 8, "patience": 2, "calibrate_variance": True},
    ),
}


def test_queries(
    data: Path, keys: tuple[str, ...]
) -> tuple[list[np.ndarray], list[str], dict[str, dict[str, int]]]:
    """The 300 test queries embedded by each model of ``keys``, their ids and judgments."""
    sci = data / "scifact"
    ids = json.loads((sci / "ids.json").read_text())
    qrels: dict[str, dict[str, int]] = {}
    for line in (sci / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    rows = [i for i, q in enumerate(ids["queries"]) if q in qrels]
    queries = [
        load_file(sci / "embeddings" / f"{key}.safetensors")["queries"][rows] for key in keys
    ]
    return queries, [ids["queries"][i] for i in rows], qrels


def _extra(
    pairs: dict[str, Any], regime: str, weighted: bool
) -> tuple[tuple[np.ndarray, np.ndarray] | None, np.ndarray | None]:
    """The extra training pairs (and their weights, for methods that take them) of a
    regime: ``bundled``, the training queries and the STS-B sentences; ``scifact``, none,
    or for weighted methods the training queries (SciFact data: a team embeds a sample of
    its own queries with both models far more cheaply than its corpus)."""
    parts = ("queries", "sts") if regime == "bundled" else ("queries",) if weighted else ()
    if not parts:
        return None, None
    extra = (
        np.concatenate([pairs[f"source_{part}"] for part in parts]),
        np.concatenate([pairs[f"target_{part}"] for part in parts]),
    )
    if not weighted:
        return extra, None
    weights = np.concatenate([np.full(len(pairs[f"source_{p}"]), WEIGHTS[p]) for p in parts])
    return extra, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=MODELS_DIR.parent.parent / "shared" / "data")
    parser.add_argument("--methods", default=",".join(VARIANTS), help="of " + ", ".join(VARIANTS))
    parser.add_argument("--pairs", default=",".join(PAIRS))
    args = parser.parse_args()
    out_path = MODELS_DIR / "retrieval.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    for stitch_id in args.pairs.split(","):
        src, tgt = STITCHES[stitch_id]
        pairs = scifact_pairs(args.data, src, tgt)
        (q_src, q_tgt), query_ids, qrels = test_queries(args.data, (src, tgt))
        for variant in args.methods.split(","):
            method, options = VARIANTS[variant]
            if variant.startswith("gated"):  # the bundled stitch's own MLP size
                options = changed_options(stitch_id, "gated", options)
            for regime in ("scifact", "bundled"):
                extra, weights = _extra(pairs, regime, method in WEIGHTED_METHODS)
                start = time.perf_counter()
                figures = crossfit_retrieval(
                    pairs["source_docs"],
                    pairs["target_docs"],
                    doc_ids=pairs["doc_ids"],  # type: ignore[arg-type]
                    target_queries=q_tgt,
                    source_queries=q_src,
                    query_ids=query_ids,
                    qrels=qrels,
                    method=method,
                    options=options,
                    folds=5,
                    seed=0,
                    extra_pairs=extra,
                    extra_weights=weights,
                )
                figures["seconds"] = round(time.perf_counter() - start, 1)
                results[f"{stitch_id}/{variant}/{regime}"] = figures
                doc, query = figures["document_side"], figures["query_side"]
                print(
                    f"{stitch_id:16s} {variant:10s} {regime:8s} docs={figures['docs']} "
                    f"queries={figures['queries']} doc-side nDCG@10 ratio "
                    f"{doc['ndcg_at_10_ratio']:.3f} (bound {doc['ndcg_at_10_bound_ratio']:.3f}), "
                    f"query-side {query['ndcg_at_10_ratio']:.3f} "
                    f"(bound {query['ndcg_at_10_bound_ratio']:.3f}) ({figures['seconds']} s)",
                    flush=True,
                )
                out_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
