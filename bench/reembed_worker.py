"""Time re-embedding SciFact documents from text with one offline model.

Runs in the embedding virtualenv (``.venv-embed``, made by
``../shared/data/tools/setup_offline_models.sh``), not in the project's: it imports
``embedders.py`` from ``../shared/data/tools``. Prints one JSON line.

Usage: python bench/reembed_worker.py MODEL N_DOCS [SEED]
"""

import json
import os
import sys
import time
from pathlib import Path

DATA = Path(
    os.environ.get("LEAD_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


def main() -> None:
    key, n = sys.argv[1], int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    import numpy as np

    sys.path.insert(0, str(DATA / "tools"))
    start = time.perf_counter()
    import embedders

    ids = json.loads((DATA / "scifact" / "ids.json").read_text())["corpus"]
    sample = [ids[i] for i in np.random.default_rng(seed).choice(len(ids), n, replace=False)]
    wanted = set(sample)
    texts = {}
    with open(DATA / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if doc["_id"] in wanted:
                texts[doc["_id"]] = (doc["title"] + " " + doc["text"]).strip()
    docs = [texts[d] for d in sample]
    model = embedders.MODELS[key]()
    model.encode(docs[:2], kind="passage")  # warm-up
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    vectors = model.encode(docs, kind="passage")
    encode_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "model": key,
                "docs": n,
                "dim": int(vectors.shape[1]),
                "load_and_warmup_s": load_s,
                "encode_s": encode_s,
                "docs_per_s": n / encode_s,
                "mean_words": float(np.mean([len(d.split()) for d in docs])),
            }
        )
    )


if __name__ == "__main__":
    main()
