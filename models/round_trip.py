"""Round trips A → B → A of the bundled stitches (``models/round_trip.json``, quoted in the README).

    .venv/bin/python models/round_trip.py [--data ../shared/data]

For every pair of bundled stitches that join two models both ways, and for every bundled
invertible stitch (run backwards), the held-out SciFact documents of the forward stitch
(listed in its card) are translated there and back; :func:`lead.round_trip_scores` compares
them with the originals (mean squared error, mean cosine, and top-1: is the round-tripped
vector nearest to its own original among all held-out documents?).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from build import MODELS_DIR
from safetensors.numpy import load_file

from lead import InvertibleStitch, load_stitch, read_stitch_config, round_trip_scores

KEYS = {
    "sentence-transformers/all-MiniLM-L6-v2": "minilm",
    "sentence-transformers/all-mpnet-base-v2": "mpnet",
    "intfloat/multilingual-e5-small": "e5",
    "sentence-transformers/paraphrase-MiniLM-L3-v2": "pml3",
}


def held_out_docs(data: Path, key: str, ids: list[str]) -> np.ndarray:
    sci = data / "scifact"
    order = json.loads((sci / "ids.json").read_text())["corpus"]
    if key == "mpnet":
        order = json.loads((sci / "embeddings" / "mpnet_corpus_ids.json").read_text())
    row = {d: i for i, d in enumerate(order)}
    return load_file(sci / "embeddings" / f"{key}.safetensors")["corpus"][[row[d] for d in ids]]


def round_trips(data: Path) -> dict[str, dict[str, object]]:
    folders = sorted(p for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())
    stitches = {p.name: load_stitch(p) for p in folders}
    out: dict[str, dict[str, object]] = {}
    for name, stitch in stitches.items():
        info = stitch.info
        config = read_stitch_config(MODELS_DIR / name)
        ids = config["fit"]["holdout"]["ids"]
        X = held_out_docs(data, KEYS[info.source_model], ids)
        if isinstance(stitch, InvertibleStitch):
            out[f"{name} → inverse"] = {"documents": len(ids), **round_trip_scores(stitch, X)}
        for back_name, back in stitches.items():
            if (back.info.source_model, back.info.target_model) == (
                info.target_model,
                info.source_model,
            ) and not isinstance(back, InvertibleStitch):
                scores = round_trip_scores(stitch, X, reverse=back)
                out[f"{name} → {back_name}"] = {"documents": len(ids), **scores}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=MODELS_DIR.parent.parent / "shared" / "data")
    args = parser.parse_args()
    results = round_trips(args.data)
    (MODELS_DIR / "round_trip.json").write_text(json.dumps(results, indent=1) + "\n")
    for route, r in results.items():
        print(
            f"{route}: cosine {r['round_trip_mean_cosine_similarity']:.4f}, "
            f"top-1 {r['round_trip_top1_accuracy_score']:.3f}"
        )


if __name__ == "__main__":
    main()
