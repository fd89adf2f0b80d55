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
training on their own corpus) and ``bundled`` (the same plus the bundled stitches' extra
data: the 809 non-test SciFact queries and the 12,935 STS-B sentences). Writes
``models/retrieval.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from build import MODELS_DIR, STITCHES, scifact_pairs
from safetensors.numpy import load_file

from lead.crossfit import crossfit_retrieval

PAIRS = ("minilm-to-pml3", "minilm-to-e5", "minilm-to-mpnet")
#: name -> (method, options). "ridge" picks its strength by held-out MSE, which favours
#: more shrinkage than retrieval likes; "ridge-1e-6" fixes a small one.
VARIANTS = {
    "ridge": ("ridge", {}),
    "ridge-1e-6": ("ridge", {"alpha": 1e-6}),
    "procrustes": ("procrustes", {}),
    "mlp": ("mlp", {"hidden_dim": 512, "max_epochs": 8, "patience": 2}),
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
        extra = (
            np.concatenate([pairs["source_queries"], pairs["source_sts"]]),  # type: ignore[list-item]
            np.concatenate([pairs["target_queries"], pairs["target_sts"]]),  # type: ignore[list-item]
        )
        for variant in args.methods.split(","):
            method, options = VARIANTS[variant]
            for regime in ("scifact", "bundled"):
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
                    extra_pairs=extra if regime == "bundled" else None,
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
