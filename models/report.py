"""Write ``models/README.md`` from the build's candidates and the retrieval figures.

.venv/bin/python models/report.py
"""

from __future__ import annotations

import json
from pathlib import Path

from build import CANDIDATES, MIN_GAIN, MODELS_DIR

CORE = (
    ("r2_score", "R²"),
    ("top1_accuracy_score", "top-1"),
    ("mean_rank_error", "mean rank"),
    ("mean_cosine_similarity", "cosine"),
    ("linear_cka_score", "CKA"),
    ("mutual_knn_score", "mutual kNN"),
)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def scorecards(candidates: dict[str, dict]) -> str:
    lines = [
        _row(
            [
                "stitch",
                "method",
                "pool",
                *[label for _, label in CORE],
                "mean-estimator R²",
                "identity R²",
            ]
        ),
        _row(["---"] * (5 + len(CORE))),
    ]
    for stitch_id, entry in sorted(candidates.items()):
        for name in CANDIDATES:
            if name not in entry["candidates"]:  # not fitted in the recorded build
                continue
            card = entry["candidates"][name]["scorecard"]
            chosen = name == entry["chosen"]
            identity = card["baselines"].get("identity")
            lines.append(
                _row(
                    [
                        f"**{stitch_id}**" if chosen else stitch_id,
                        f"**{name}** (bundled)" if chosen else name,
                        str(card["pool_size"]),
                        *[f"{card[key]:.3f}" for key, _ in CORE],
                        f"{card['baselines']['mean_estimator']['r2_score']:.3f}",
                        f"{identity['r2_score']:.3f}" if identity else "—",
                    ]
                )
            )
    return "\n".join(lines)


def _bounds(results: dict[str, dict]) -> dict[tuple[str, int], float]:
    """The information bound of each pair and corpus size, from any row that has it (it
    does not depend on the method: the same documents and queries, natively embedded)."""
    bounds: dict[tuple[str, int], float] = {}
    for key, r in results.items():
        if r.get("bound_ndcg_at_10_score") is not None:
            bounds[key.split("/")[0], r["docs"]] = r["bound_ndcg_at_10_score"]
    return bounds


def retrieval(results: dict[str, dict]) -> str:
    lines = [
        _row(
            [
                "pair",
                "method",
                "training data",
                "documents",
                "queries",
                "source native nDCG@10",
                "target native nDCG@10",
                "bound",
                "document side nDCG@10 (/ target, **/ bound**)",
                "query side nDCG@10 (/ target, / bound)",
                "document side recall@10 / target",
            ]
        ),
        _row(["---"] * 11),
    ]
    bounds = _bounds(results)

    def side(figures: dict[str, float], bound: float | None, bold: bool) -> str:
        over = "—" if not bound else f"{figures['ndcg_at_10_score'] / bound:.3f}"
        over = f"**{over}**" if bold else over
        return f"{figures['ndcg_at_10_score']:.3f} ({figures['ndcg_at_10_ratio']:.3f}, {over})"

    for key, r in sorted(results.items()):
        pair, method, regime = key.split("/")
        doc, query = r["document_side"], r["query_side"]
        bound = bounds.get((pair, r["docs"]))
        source = r.get("source_native_ndcg_at_10_score")
        lines.append(
            _row(
                [
                    pair,
                    method,
                    "SciFact documents only" if regime == "scifact" else "bundled mix",
                    str(r["docs"]),
                    str(r["queries"]),
                    "—" if source is None else f"{source:.3f}",
                    f"{r['native_ndcg_at_10_score']:.3f}",
                    "—" if bound is None else f"{bound:.3f}",
                    side(doc, bound, True),
                    side(query, bound, False),
                    f"{doc['recall_at_10_ratio']:.3f}",
                ]
            )
        )
    return "\n".join(lines)


def out_of_domain(candidates: dict[str, dict]) -> str:
    """On the 80 everyday test sentences: the mean cosine of the translated vectors to the
    true target vectors, how well mixed-space similarities keep the target model's own
    (Spearman over all sentence pairs, beside keeping the source model), and how well each
    vector's confidence ranks the true cosines."""
    import numpy as np
    import torch
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from lead import load_stitch
    from lead.confidence import translate_with_confidence
    from lead.metrics import spearman_score

    fixture = MODELS_DIR.parent / "tests" / "fixtures" / "everyday_sentences.safetensors"
    vectors = load_file(fixture)
    with safe_open(str(fixture), "np") as f:
        keys = {v: k for k, v in json.loads(f.metadata()["models"]).items()}
    header = [
        "stitch",
        "mean cosine to the true target vectors",
        "mean-estimator",
        "mixed-space similarity ρ",
        "keeping the source model ρ",
        "confidence ρ",
        "out of distribution",
    ]
    lines = [_row(header), _row(["---"] * len(header))]
    for stitch_id in sorted(candidates):
        stitch = load_stitch(MODELS_DIR / stitch_id)
        src, tgt = keys[stitch.info.source_model], keys[stitch.info.target_model]
        S, T = vectors[src], vectors[tgt]
        conf = ood = None
        if stitch.confidence_head is not None:
            y_t, conf_t, ood_t = translate_with_confidence(stitch, torch.from_numpy(S))
            y, conf, ood = y_t.numpy(), conf_t.numpy(), ood_t.numpy()
        else:
            with torch.no_grad():
                y = stitch(torch.from_numpy(S)).numpy()
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
        mean = stitch.target_mean.numpy()
        baseline = (T @ (mean / (mean**2).sum() ** 0.5)).mean()
        cosines = (y * T).sum(axis=1)
        upper = np.triu_indices(len(T), k=1)  # every pair of two different sentences
        native = (T @ T.T)[upper]
        mixed = spearman_score((y @ T.T)[upper], native)  # translated a against native b
        keep = spearman_score((S @ S.T)[upper], native)
        cells = [stitch_id, f"{cosines.mean():.3f}", f"{baseline:.3f}"]
        cells += [f"{mixed:.3f}", f"{keep:.3f}"]
        if conf is None or ood is None:
            cells += ["(no head)", "(no head)"]
        else:
            cells += [f"{spearman_score(conf, cosines):.3f}", f"{int(ood.sum())} of {len(ood)}"]
        lines.append(_row(cells))
    return "\n".join(lines)


def confidence(stitch_ids: list[str]) -> str:
    """Each bundled stitch's confidence report: Spearman(confidence, true cosine), out of
    fold, on the held-out documents (with and without the stitch's own features) and on
    the STS-B sentences kept out of training."""
    lines = [
        _row(
            [
                "stitch",
                "held-out documents",
                "same, generic features only",
                "held-out STS-B sentences",
                "rows (documents / sentences)",
            ]
        ),
        _row(["---"] * 5),
    ]
    for stitch_id in sorted(stitch_ids):
        block = json.loads((MODELS_DIR / stitch_id / "config.json").read_text()).get("confidence")
        if not block:
            lines.append(_row([stitch_id, "(no head)", "", "", ""]))
            continue
        report = block["report"]
        general = report.get("out_of_domain_spearman_score")
        lines.append(
            _row(
                [
                    stitch_id,
                    f"{report['in_domain_spearman_score']:.3f}",
                    f"{report['generic_spearman_score']:.3f}",
                    "—" if general is None else f"{general:.3f}",
                    f"{report['held_out_rows']} / {report.get('general_rows', 0)}",
                ]
            )
        )
    return "\n".join(lines)


def extras(records: dict[str, dict], candidates: dict[str, dict]) -> str:
    """The extra bundled stitches beside the chosen stitch of the same pair."""
    lines = [
        _row(["stitch", "method", "pool", *[label for _, label in CORE], "same pair, bundled"]),
        _row(["---"] * (4 + len(CORE))),
    ]
    for stitch_id, record in sorted(records.items()):
        card = record["scorecard"]
        base_id = stitch_id.rsplit("-", 1)[0]
        chosen = candidates.get(base_id, {})
        base = chosen.get("candidates", {}).get(chosen.get("chosen"), {}).get("scorecard")
        versus = f"{base_id}: R² {base['r2_score']:.3f}" if base else "—"
        lines.append(
            _row(
                [
                    stitch_id,
                    str(record["method"]),
                    str(card["pool_size"]),
                    *[f"{card[key]:.3f}" for key, _ in CORE],
                    versus,
                ]
            )
        )
    return "\n".join(lines)


def round_trips(results: dict[str, dict]) -> str:
    lines = [
        _row(["there → back", "documents", "mean cosine", "top-1", "mean squared error"]),
        _row(["---"] * 5),
    ]
    for route, r in sorted(results.items()):
        lines.append(
            _row(
                [
                    route,
                    str(r["documents"]),
                    f"{r['round_trip_mean_cosine_similarity']:.4f}",
                    f"{r['round_trip_top1_accuracy_score']:.3f}",
                    f"{r['round_trip_mean_squared_error']:.2e}",
                ]
            )
        )
    return "\n".join(lines)


def stsb_gold(report: dict) -> str:
    """The STS Benchmark test-split table (``bench/results/stsb_gold.json``)."""
    if not report:
        return "(run `python -m bench.stsb_gold` on the STS Benchmark test split)"
    lines = [
        "| stitch | target native ρ | source native ρ | mixed ρ (of target native) "
        "| translated ρ (of target native) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['stitch']} | {r['target_native_spearman_similarity']:.3f} "
            f"| {r['source_native_spearman_similarity']:.3f} "
            f"| {r['mixed_spearman_similarity']:.3f} ({r['mixed_ratio']:.3f}) "
            f"| {r['translated_spearman_similarity']:.3f} ({r['translated_ratio']:.3f}) |"
        )
    return "\n".join(lines)


def _json(name: str) -> dict[str, dict]:
    path = MODELS_DIR / name
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> None:
    candidates = json.loads((MODELS_DIR / "candidates.json").read_text())
    results_path = MODELS_DIR / "retrieval.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    template = (MODELS_DIR / "README.template.md").read_text()
    text = template.format(
        scorecards=scorecards(candidates),
        retrieval=retrieval(results) if results else "(run models/evaluate.py)",
        out_of_domain=out_of_domain({**candidates, **_json("extras.json")}),
        confidence=confidence([*candidates, *_json("extras.json")]),
        extras=extras(_json("extras.json"), candidates),
        round_trips=round_trips(_json("round_trip.json")) or "(run models/round_trip.py)",
        stsb_gold=stsb_gold(_json("../bench/results/stsb_gold.json")),
        min_gain=MIN_GAIN,
    )
    (MODELS_DIR / "README.md").write_text(text)
    print(f"wrote {Path(MODELS_DIR / 'README.md')}")


if __name__ == "__main__":
    main()
