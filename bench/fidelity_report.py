"""The fidelity part of ``SUMMARY.md`` and its plots (``bench/fidelity.py``'s results)."""

from __future__ import annotations

import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.common import results_dir
from bench.data import REPO


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


def _curve_means(lc: dict[str, Any]) -> dict[tuple[str, str, str], dict[int, list[float]]]:
    """``(source, target, method) -> {K: [bound ratio per seed]}``."""
    out: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    for r in lc["rows"]:
        key = (r["source"], r["target"], r["method"])
        out.setdefault(key, {}).setdefault(r["train_pairs"], []).append(r["ndcg_at_10_bound_ratio"])
    return out


def learning_curve(lc: dict[str, Any], bounds: dict[str, Any]) -> list[str]:
    means = _curve_means(lc)
    sizes = lc["sizes"]
    lines = [
        "### Learning curve: how many documents must be re-embedded to calibrate?",
        "",
        f"{lc['protocol']}; mean over the seeds column (± the spread across seeds). "
        "Cells: document-side nDCG@10 **over the bound**.",
        "",
    ]
    rows = []
    for (src, tgt, method), by_size in means.items():
        bound = bounds[f"{src}->{tgt}"]["bound_ndcg_at_10_score"]
        cells = [
            f"{np.mean(by_size[k]):.3f} ± {np.std(by_size[k]):.3f}" if k in by_size else "–"
            for k in sizes
        ]
        seeds = max(len(v) for v in by_size.values())
        rows.append([f"{src} → {tgt}", method, seeds, f"{bound:.3f}", *cells])
    header = ["pair", "method", "seeds", "bound nDCG@10", *[f"K={k:,}" for k in sizes]]
    lines += _table(header, rows)
    return [*lines, "![fidelity learning curve](fidelity_learning_curve.png)", ""]


def plot_learning_curve(lc: dict[str, Any]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    means = _curve_means(lc)
    pairs = list(dict.fromkeys((s, t) for s, t, _ in means))
    for (src, tgt, method), by_size in means.items():
        ks = sorted(by_size)
        color = f"C{pairs.index((src, tgt)) % 10}"
        style = "-o" if method == "ridge" else "--s" if method == "procrustes" else ":^"
        ax.plot(
            ks, [np.mean(by_size[k]) for k in ks], style, color=color, label=f"{src}→{tgt} {method}"
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="in-domain pairs K", ylabel="doc-side nDCG@10 / bound")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results_dir() / "fidelity_learning_curve.png", dpi=110)
    plt.close(fig)


def _bundled_variant(stitch_id: str, method: str) -> str | None:
    """The variant the bundled stitch ``stitch_id`` is (plain, or calibrated when it holds
    an output scale), or None when it was not fitted with ``method``."""
    path = REPO / "models" / stitch_id / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    if config.get("fit", {}).get("method") != method:
        return None
    return "calibrated" if config.get("output_scale") or config.get("expert_scales") else "plain"


def progressive(rows: list[dict[str, Any]]) -> list[str]:
    fractions = rows[0]["fractions"] if rows else []
    lines = [
        "### Progressive migration: a fraction f re-embedded natively, the rest translated",
        "",
        "Cross-fitted translations (the method of the bundled stitch, or the method named; "
        "SciFact documents only), native target queries over the mixed corpus; random order "
        f"(mean over {rows[0]['random_seeds'] if rows else 0} seeds), without and with the "
        "variance-restoring output scale (`fit_stitch(..., calibrate_variance=True)`). "
        "nDCG@10 over the bound; *ok* when f = 0.2 and f = 0.5 retrieve at least as well as "
        "f = 0. *(bundled)* marks the variant of the bundled stitch.",
        "",
    ]
    table = []
    for r in rows:
        b = r["bound_ndcg_at_10_score"]
        bundled = _bundled_variant(r["stitch"], r["method"])
        for variant in ("plain", "calibrated"):
            curve = r[variant]["random"]
            ok = all(r[variant]["never_below_f0"].values())
            scale = f" (scale {np.mean(r['output_scales']):.2f})" if variant == "calibrated" else ""
            scale += " *(bundled)*" if variant == bundled else ""
            table.append(
                [
                    r["stitch"],
                    r["method"],
                    variant + scale,
                    *[f"{v / b:.3f}" for v in curve],
                    "ok" if ok else "**worse**",
                ]
            )
            conf = r[variant].get("confidence_80pct_fit")
            if conf:
                table.append(
                    [
                        r["stitch"],
                        r["method"],
                        f"{variant}, lowest confidence first (80 % fits)",
                        *[f"{v / b:.3f}" for v in conf["lowest_confidence_first"]],
                        "",
                    ]
                )
    lines += _table(
        ["stitch", "method", "variant", *[f"f={f:g}" for f in fractions], "f=0.2, 0.5 ≥ f=0"],
        table,
    )
    notes = sorted({r["confidence_note"] for r in rows})
    lines += [f"Confidence order: {'; '.join(notes)}.", ""]
    return [*lines, "![progressive migration](fidelity_progressive.png)", ""]


def plot_progressive(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    stitches = list(dict.fromkeys(r["stitch"] for r in rows))
    fig, axes = plt.subplots(1, len(stitches), figsize=(3.6 * len(stitches), 3.6), squeeze=False)
    for r in rows:
        ax = axes[0][stitches.index(r["stitch"])]
        b = r["bound_ndcg_at_10_score"]
        methods = list(dict.fromkeys(x["method"] for x in rows if x["stitch"] == r["stitch"]))
        color = f"C{methods.index(r['method']) % 10}"
        for variant, style in (("plain", "--o"), ("calibrated", "-s")):
            ys = [v / b for v in r[variant]["random"]]
            ax.plot(r["fractions"], ys, style, color=color, label=f"{r['method']} {variant}")
        ax.set(title=r["stitch"], xlabel="fraction re-embedded f", ylabel="nDCG@10 / bound")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(results_dir() / "fidelity_progressive.png", dpi=110)
    plt.close(fig)


def out_of_domain(ood: dict[str, Any]) -> list[str]:
    lines = [
        "### Out of domain (a proxy: no gold similarity labels)",
        "",
        f"Gold labels: {ood['gold_labels']}. Sampled STS-B sentences, each paired with its "
        "nearest neighbours and random sentences in target space; Spearman of the mixed-space "
        "cosine cos(stitch(src_a), tgt_b) with the target model's own cos(tgt_a, tgt_b). "
        "The stitch is fitted on SciFact documents only (no STS-B sentence in its fit); the "
        "source model's own cos(src_a, src_b) is what keeping the old model gives; the "
        "bundled stitch saw every STS-B sentence (in domain, for reference).",
        "",
    ]
    rows = [
        [
            r["stitch"],
            r["method"],
            r["pairs"],
            f"{r['mixed_spearman_similarity']:.3f}",
            f"{r['mixed_calibrated_spearman_similarity']:.3f}",
            f"{r['source_model_spearman_similarity']:.3f}",
            f"{r['mixed_spearman_similarity'] / r['source_model_spearman_similarity']:.3f}",
            f"{r['bundled_stitch_mixed_spearman_similarity']:.3f}",
        ]
        for r in ood["rows"]
    ]
    header = [
        "stitch",
        "method (SciFact-only fit)",
        "sentence pairs",
        "mixed Spearman",
        "mixed, calibrated",
        "source model",
        "mixed / source model",
        "bundled stitch (saw STS-B)",
    ]
    return [*lines, *_table(header, rows)]


def section(fid: dict[str, Any]) -> list[str]:
    """The fidelity section of ``SUMMARY.md``; writes its two plots."""
    lines = ["## Fidelity to the information bound", ""]
    lines.append(
        "Bound = min(source-native, target-native) nDCG@10 (SciFact, 300 test queries): "
        + ", ".join(
            f"{pair} {b['bound_ndcg_at_10_score']:.3f}" for pair, b in sorted(fid["bounds"].items())
        )
        + "."
    )
    lines.append("")
    if fid["learning_curve"]["rows"]:
        plot_learning_curve(fid["learning_curve"])
        lines += learning_curve(fid["learning_curve"], fid["bounds"])
    if fid["progressive"]:
        plot_progressive(fid["progressive"])
        lines += progressive(fid["progressive"])
    if fid["out_of_domain"]["rows"]:
        lines += out_of_domain(fid["out_of_domain"])
    return lines
