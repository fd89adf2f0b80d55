"""``bench/results/SUMMARY.md`` and the PNG plots, from the JSON results of the sections."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench import fidelity_report
from bench.common import read_result, results_dir
from bench.data import MODELS

QUICK_NOTE = "**quick smoke run** (small sizes; figures not meaningful)"
THRESHOLDS = {"http_fraction": 0.30, "speedup": 100.0, "retention": 0.85}


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


# ---------------------------------------------------------------- acceptance
def acceptance(tp: Any, mig: Any, qual: Any) -> tuple[list[str], dict[str, Any]]:
    out: dict[str, Any] = {}
    rows = []
    if tp:
        acc = tp["acceptance"]
        rounds = tp.get("acceptance_rounds") or {}
        kinds = acc.get("kind") or {}
        out["http_fraction"] = acc["worst"]
        out["http_fraction_by_kind"] = acc.get("worst_by_kind")
        for kind, what in (
            ("bundled", "the bundled stitches (the service's defaults), worst"),
            ("ridge", "ridge stitches (a single matrix product: the worst case), worst"),
        ):
            stitches = [k for k in acc["per_stitch"] if kinds.get(k, "ridge") == kind]
            if not stitches:
                continue
            worst = min(acc["per_stitch"][k] for k in stitches)
            per = ", ".join(f"{k} {acc['per_stitch'][k]:.3f}" for k in stitches)
            if rounds:
                per += "; median of alternating rounds, each: " + "; ".join(
                    f"{k} " + " / ".join(f"{f:.3f}" for f in rounds[k]["fractions"])
                    for k in stitches
                    if k in rounds
                )
            ok = worst >= THRESHOLDS["http_fraction"]
            if kind == "bundled":
                verdict = _verdict(ok)
            else:
                verdict = ("above" if ok else "below") + " (the worst case; reported, not judged)"
            rows.append(
                [
                    f"HTTP base64, batch 1024: throughput as a fraction of in-process — {what}",
                    f"{_f(worst)} ({per})",
                    "≥ 0.30",
                    verdict,
                ]
            )
    if mig:
        speed = {t: r["reembed"]["speedup"] for t, r in mig["targets"].items()}
        worst = min(speed.values())
        out["speedup"] = speed
        rows.append(
            [
                "Translate vs re-embed the SciFact corpus: speed-up (worst target)",
                ", ".join(f"{t} {s:,.0f}×" for t, s in speed.items()),
                "≥ 100×",
                _verdict(worst >= THRESHOLDS["speedup"]),
            ]
        )
    if qual:
        by_method = {
            r["method"]: r["crossfit"]["document_side"]["ndcg_at_10_ratio"]
            for r in qual["rows"]
            if r["source"] == "minilm" and r["target"] == "mpnet" and r["crossfit"]
        }
        ridge = by_method.get("ridge")
        out["retention"] = by_method
        rows.append(
            [
                "minilm → mpnet cross-fitted document-side nDCG@10 retention (ridge, "
                "the default method)",
                f"{_f(ridge)} (" + ", ".join(f"{m} {v:.3f}" for m, v in by_method.items()) + ")",
                "≥ 0.85",
                _verdict(None if ridge is None else ridge >= THRESHOLDS["retention"]),
            ]
        )
    return _table(["Acceptance figure", "Measured", "Threshold", "Result"], rows), out


def cpu_budget(tp: Any, prof: Any, cores: int, batch: int = 1024) -> list[str]:
    """Why the acceptance figure is what it is: CPU per request against the in-process time."""
    serial = {
        s["stitch"]: s["total_ms"]
        for s in (prof or {}).get("serial_stages") or []
        if s["encoding"] == "base64" and s["batch"] == batch
    }
    rows = []
    for r in tp["rows"]:
        if r["batch"] != batch or r["encoding"] != "base64":
            continue
        h, local = r["http"], r["in_process"]
        cpu = h["server_cpu_ms_per_request"] + h["client_cpu_ms_per_request"]
        ceiling = cores * batch * 1000 / cpu
        rows.append(
            [
                r["stitch"],
                _f(1000 * batch / local["vectors_per_s"], 1),
                _f(h["server_cpu_ms_per_request"], 1),
                _f(serial.get(r["stitch"]), 1),
                _f(h["client_cpu_ms_per_request"], 1),
                _n(ceiling),
                _f(ceiling / local["vectors_per_s"]),
                _f(r["fraction_of_in_process"]),
            ]
        )
    if not rows:
        return []
    lines = [
        f"**CPU budget of the acceptance configuration** (base64, batch {batch:,}; sweep "
        "figures). In-process, one request's worth of vectors costs the forward alone; over "
        "HTTP the server spends its CPU time per request (measured from `/proc`, all threads) "
        "and the httpx clients, on the same cores, theirs. With both cores busy, throughput "
        f"cannot exceed {cores} cores × {batch:,} vectors ÷ (server + client CPU per request), "
        "whatever the concurrency:",
        "",
    ]
    lines += _table(
        [
            "stitch",
            "in-process ms / 1,024 vectors",
            "server CPU ms / request",
            "of which the serial hot path (ms)",
            "client CPU ms / request",
            f"{cores}-core ceiling vec/s",
            "ceiling ÷ in-process",
            "measured fraction",
        ],
        rows,
    )
    return lines


# ---------------------------------------------------------------- throughput
def throughput_section(tp: Any) -> list[str]:
    lines = ["## Translate throughput and latency", ""]
    lines.append(
        f"{tp['concurrency']} concurrent httpx clients (threads) against a real uvicorn "
        "process on loopback (one worker, CPU, float32), each client posting the same "
        "pre-serialised body back to back for ≥ "
        f"{tp['http_min_time_s']} s (and at least one request each); in-process is "
        "`stitch(x)` under `torch.inference_mode()` — the faster of torch's default thread "
        "count and one thread. Two kinds of stitch: the bundled ones (`models/`, gated: a "
        "local stitch with its memory search and a residual MLP, what the service serves by "
        "default) and ridge ones "
        "(a single matrix product, the cheapest forward, on which the service's own cost "
        "weighs most). Clients and server share the machine's 2 cores; response "
        "bodies are read in full (streamed, not kept) but not parsed in the timed loop (the "
        "first answer of each "
        "configuration is parsed and matched against the in-process output: max |Δ| "
        f"{max(r['http']['max_abs_diff_vs_in_process'] for r in tp['rows']):.1e}). "
        "'fraction' = HTTP vectors/s ÷ in-process vectors/s from the same run. Latency under "
        "4 concurrent clients includes queueing. The acceptance figure (base64, batch 1,024) "
        "is measured again after the sweep in alternating in-process / HTTP rounds per "
        "stitch; the median fraction of those rounds is the one judged."
    )
    if tp.get("arrow_batch"):
        medians = ", ".join(
            f"{stitch} {r['median_fraction']:.2f}"
            for stitch, r in (tp.get("arrow_rounds") or {}).items()
        )
        lines[-1] += (
            " Arrow: an Arrow IPC stream both ways (`application/vnd.apache.arrow.stream`, raw "
            f"float32), at batch {tp['arrow_batch']} for the ridge 384→384 stitch and the "
            "bundled ones"
            + (f"; median fraction of alternating rounds: {medians}." if medians else ".")
        )
    lines.append("")
    rows = []
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    for r in tp["rows"]:
        by_key.setdefault((r["stitch"], r["batch"]), {"in": r["in_process"], "d": r})[
            r["encoding"]
        ] = r
    for (stitch, batch), g in by_key.items():
        d = g["d"]
        cells = [
            f"{stitch} ({d['d_src']}→{d['d_tgt']})",
            batch,
            f"{_n(g['in']['vectors_per_s'])} ({_f(g['in']['p50_ms'], 2)} / "
            f"{_f(g['in']['p99_ms'], 2)})",
        ]
        for enc in ("float", "base64", "arrow"):
            if enc in g:
                h = g[enc]["http"]
                cells += [
                    f"{_n(h['vectors_per_s'])} ({_f(h['p50_ms'], 1)} / {_f(h['p99_ms'], 1)})",
                    _f(g[enc]["fraction_of_in_process"]),
                ]
            else:
                cells += ["–", "–"]
        rows.append(cells)
    lines += _table(
        [
            "stitch",
            "batch",
            "in-process vec/s (p50 / p99 ms)",
            "HTTP float vec/s (p50 / p99 ms)",
            "fraction",
            "HTTP base64 vec/s (p50 / p99 ms)",
            "fraction",
            "HTTP Arrow vec/s (p50 / p99 ms)",
            "fraction",
        ],
        rows,
    )
    cpu = [
        [
            r["stitch"],
            r["batch"],
            r["encoding"],
            _f(r["http"]["server_cpu_ms_per_request"], 1),
            _f(r["http"]["client_cpu_ms_per_request"], 1),
            _n(r["http"]["request_bytes"]),
            _n(r["http"]["response_bytes"]),
            r["http"]["requests"],
        ]
        for r in tp["rows"]
    ]
    lines += ["<details><summary>CPU per request and payload sizes</summary>", ""]
    lines += _table(
        [
            "stitch",
            "batch",
            "encoding",
            "server CPU ms/req",
            "client CPU ms/req",
            "request bytes",
            "response bytes",
            "requests timed",
        ],
        cpu,
    )
    lines += ["</details>", "", "![throughput](throughput.png)", ""]
    return lines


def plot_throughput(tp: Any) -> None:
    stitches = list(dict.fromkeys(r["stitch"] for r in tp["rows"]))
    fig, axes = plt.subplots(1, len(stitches), figsize=(6 * len(stitches), 4.2), squeeze=False)
    for ax, stitch in zip(axes[0], stitches, strict=True):
        rows = [r for r in tp["rows"] if r["stitch"] == stitch]
        batches = sorted({r["batch"] for r in rows})
        local = [
            next(r for r in rows if r["batch"] == b)["in_process"]["vectors_per_s"] for b in batches
        ]
        ax.plot(batches, local, "k-o", label="in-process stitch(x)")
        for enc, style in (("float", "C0-s"), ("base64", "C1-^"), ("arrow", "C2-D")):
            points = sorted(
                (r["batch"], r["http"]["vectors_per_s"]) for r in rows if r["encoding"] == enc
            )
            if points:  # Arrow: batch 8,192 only
                ax.plot(*zip(*points, strict=True), style, label=f"HTTP {enc}")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="vectors per request",
            ylabel="vectors / s",
            title=f"{stitch} ({rows[0]['d_src']}→{rows[0]['d_tgt']})",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(results_dir() / "throughput.png", dpi=110)
    plt.close(fig)


def serial_stages(prof: Any) -> list[str]:
    stages = prof.get("serial_stages") if prof else None
    if not stages:
        return []
    names = list(dict.fromkeys(n for s in stages for n in s["stage_ms"]))
    lines = [
        "Serial cost of each hot-path stage for one batch-1024 request, in this process with "
        "the service's own code (`service.translate_body`: the typed msgspec decode, then "
        "`service.encoding` for the vectors; median ms; torch threads "
        f"{stages[0]['torch_threads']}); the forward includes the output finiteness check "
        "and the conversion to NumPy, as `Route.translate` does:",
        "",
    ]
    rows = [
        [
            f"{s['stitch']} {s['encoding']}",
            *(_f(s["stage_ms"].get(n), 1) for n in names),
            _f(s["total_ms"], 1),
            _n(s["vectors_per_s_if_serial"]),
        ]
        for s in stages
    ]
    return lines + _table(["request", *names, "total ms", "vec/s if serial"], rows)


def _pyspy(p: Any) -> list[str]:
    if "error" in p:
        return [f"py-spy failed: `{p['error'][-300:]}`", ""]
    lines = [
        f"py-spy sampled the uvicorn process at 200 Hz for {p['seconds']:.0f} s while "
        f"{p['concurrency']} client{'s' if p['concurrency'] != 1 else ''} sent {p['stitch']} "
        f"batch {p['batch']} {p['encoding']} "
        f"({_n(p['vectors_per_s'])} vectors/s, {p['requests']} requests during profiling). "
        f"Shares of {p['samples']} busy samples ({p['idle_samples_excluded']} samples of "
        "waiting threads left out); each sample goes to the innermost hot-path stage on its "
        f"stack. Raw stacks: `{p['raw_stacks']}` (git-ignored).",
        "",
    ]
    stages = [[s["function"], f"{s['share']:.1%}"] for s in p["stages"]]
    own = [[f"`{s['function']}`", f"{s['share']:.1%}"] for s in p["self"][:10]]
    return (
        lines
        + _table(["stage", "share of busy samples"], stages)
        + _table(["function (self time)", "share"], own)
    )


def profile_section(prof: Any) -> list[str]:
    if not prof:
        return []
    lines = ["## Where the service's time goes", ""]
    if prof.get("profile"):
        lines += ["### Batch 1024, base64 (the acceptance configuration)", ""]
        lines += _pyspy(prof["profile"])
    lines += serial_stages(prof)
    if prof.get("profile_batch_1"):
        lines += ["### Batch 1, base64 (the fixed cost of a request)", ""]
        lines += _pyspy(prof["profile_batch_1"])
    return lines


# ---------------------------------------------------------------- migration
def migration_section(mig: Any) -> list[str]:
    lines = ["## Migration cost: translate vs re-embed", ""]
    lines.append(
        f"Translate: all {_n(mig['corpus_docs'])} SciFact source-model vectors through the "
        "running service (base64, batches of 1,024, 4 concurrent clients; client-side "
        "encoding and decoding included; median of the repeats). Re-embed: the target model "
        f"embeds a seeded random sample of {mig['sample_docs']} documents (title + ' ' + text) "
        "from text with `../shared/data/tools/embedders.py` in `.venv-embed` on the same "
        "machine (model load and a 2-document warm-up excluded, shown apart), extrapolated "
        "linearly to the corpus."
    )
    lines.append("")
    rows = []
    for target, r in mig["targets"].items():
        e, t = r["reembed"], r["translate"]
        rows.append(
            [
                target,
                t["stitch"],
                _f(t["seconds"], 2),
                f"{e['docs_per_s']:.2f}",
                f"{e['extrapolated_corpus_s']:,.0f} s ({e['extrapolated_corpus_s'] / 3600:.2f} h)",
                f"{e['load_and_warmup_s']:.1f}",
                f"**{e['speedup']:,.0f}×**",
            ]
        )
    lines += _table(
        [
            "target model",
            "stitch",
            "translate corpus (s)",
            "re-embed docs/s",
            "re-embed corpus (extrapolated)",
            "model load (s)",
            "speed-up",
        ],
        rows,
    )
    return [*lines, "![migration](migration.png)", ""]


def plot_migration(mig: Any) -> None:
    targets = list(mig["targets"])
    re = [mig["targets"][t]["reembed"]["extrapolated_corpus_s"] for t in targets]
    tr = [mig["targets"][t]["translate"]["seconds"] for t in targets]
    x = np.arange(len(targets))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(x - 0.2, re, 0.4, label="re-embed from text (extrapolated)")
    ax.bar(x + 0.2, tr, 0.4, label="translate via service")
    ax.set(
        yscale="log",
        ylabel="seconds for the SciFact corpus",
        xticks=x,
        xticklabels=[f"→ {t}" for t in targets],
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(results_dir() / "migration.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- fitting cost
def fitcost_section(fc: Any) -> list[str]:
    lines = ["## Fitting cost", ""]
    lines.append(
        f"{fc['source']} → {fc['target']} ({fc['d_src']} → {fc['d_tgt']}), "
        f"{fc.get('torch_threads', 'default')} torch thread(s) (on 2 shared cores two OpenMP "
        "threads slow down 5–20× whenever another process takes a core; one thread gives "
        "comparable figures, at most ~2× slower than two on a quiet machine). Each figure is "
        "a fresh subprocess: one untimed 200-pair warm-up fit of the same method, then the "
        "timed fit (ridge and Procrustes: the fastest of 3, the MLP: once); memory is the peak "
        "resident set during the fit (the kernel's `VmHWM`, reset just before the fit; torch "
        "allocations included) and its rise over the resident set just before. Pairs: the "
        "2,560 SciFact documents both models have, then the "
        f"12,935 STS-B sentences (all real, {_n(fc['real_pairs_available'])} in all); the "
        "20,000-pair set reuses real pairs with small Gaussian noise (σ = "
        f"{fc['noise_sigma_times_sqrt_d']}/√d per coordinate, rows re-normalised) for the "
        "pairs beyond those. Methods run with their defaults except where options are shown."
    )
    lines.append("")
    rows = [
        [
            r["method"] + (f" {r['options']}" if r["options"] else ""),
            _n(r["pairs"]),
            _n(r["noisy_pairs"]),
            _f(r["seconds"], 2)
            + (f" (first {r['all_seconds'][0]:.2f})" if len(r.get("all_seconds", [])) > 1 else ""),
            _n(r["peak_rss_mib"]),
            _n(r["fit_rss_increase_mib"]),
            r["fit_info"].get("epochs", "–"),
        ]
        for r in fc["rows"]
    ]
    lines += _table(
        [
            "method",
            "pairs",
            "of which noisy",
            "fit seconds (fastest; first run)",
            "peak RSS MiB",
            "rise during fit MiB",
            "epochs",
        ],
        rows,
    )
    return [*lines, "![fitting cost](fitcost.png)", ""]


def plot_fitcost(fc: Any) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method in dict.fromkeys(r["method"] for r in fc["rows"]):
        rows = [r for r in fc["rows"] if r["method"] == method]
        n = [r["pairs"] for r in rows]
        axes[0].plot(n, [r["seconds"] for r in rows], "-o", label=method)
        axes[1].plot(n, [r["peak_rss_mib"] for r in rows], "-o", label=method)
    axes[0].set(xscale="log", yscale="log", xlabel="pairs", ylabel="fit seconds")
    axes[1].set(xscale="log", xlabel="pairs", ylabel="peak RSS (MiB)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(results_dir() / "fitcost.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- quality
def _bound_ratio(cf: Any, side: str) -> str:
    """A side's nDCG@10 over the bound ("–" for results written before the bound existed)."""
    figures = cf.get(side) if cf else None
    return _f(figures.get("ndcg_at_10_bound_ratio")) if figures else "–"


def quality_section(q: Any) -> list[str]:
    lines = ["## Quality on real data (SciFact)", ""]
    lines.append(
        "Every ordered pair of models over the documents both have (mpnet: 2,560 documents, "
        "every test query's relevant documents among them; the others: all 5,183). "
        "Scorecard (`lead.scorecard.score_stitch`) on a seeded 20 % hold-out of those "
        "documents (R², mean cosine, top-1 among all held-out targets). Retrieval "
        "(`lead.crossfit.crossfit_retrieval`, 5 folds, all "
        f"{q['test_queries']} test queries): **doc-side** = native target-model queries over "
        "the corpus translated fold by fold (no document translated by a stitch that saw "
        "it), **query-side** = translated source-model queries over the native target "
        "corpus; both as a fraction of all-native target retrieval over the same documents "
        "(/ target) and of the **bound** min(source-native, target-native) nDCG@10 "
        "(/ bound: what keeping the old model gives; a translated vector cannot carry more "
        "than the source model captured). "
        "Baselines: the mean estimator (R² = 0 by construction; its top-1 is chance) and, "
        "where dimensions match, the identity map (source vectors used as they are)."
    )
    lines.append("")
    rows = []
    order = {m: i for i, m in enumerate(("ridge", "procrustes", "mlp"))}
    pairs = [(a, b) for a in MODELS for b in MODELS if a != b]
    ordered = sorted(
        q["rows"],
        key=lambda r: (pairs.index((r["source"], r["target"])), order.get(r["method"], 9)),
    )
    for r in ordered:
        c, cf = r["scorecard"], r["crossfit"]
        ident = c["baselines"].get("identity")
        idr = q["identity_retrieval"].get(f"{r['source']}->{r['target']}")
        rows.append(
            [
                f"{r['source']} → {r['target']}",
                r["docs"],
                r["method"],
                _f(c["r2_score"]),
                _f(c["mean_cosine_similarity"]),
                _f(c["top1_accuracy_score"]),
                _f(cf["document_side"]["ndcg_at_10_ratio"]) if cf else "–",
                _bound_ratio(cf, "document_side"),
                _f(cf["document_side"]["recall_at_10_ratio"]) if cf else "–",
                _f(cf["query_side"]["ndcg_at_10_ratio"]) if cf and cf["query_side"] else "–",
                _bound_ratio(cf, "query_side"),
                _f(cf["native_ndcg_at_10_score"]) if cf else "–",
                _f(cf.get("bound_ndcg_at_10_score")) if cf else "–",
                _f(c["baselines"]["mean_estimator"]["top1_accuracy_score"]),
                "–"
                if ident is None
                else f"{ident['r2_score']:.2f} / {ident['top1_accuracy_score']:.2f}",
                "–"
                if idr is None
                else f"{idr['document_side_ndcg_at_10_ratio']:.2f} / "
                f"{idr['query_side_ndcg_at_10_ratio']:.2f}",
            ]
        )
    lines += _table(
        [
            "pair",
            "docs",
            "method",
            "R²",
            "cos",
            "top-1",
            "doc-side nDCG@10 / target",
            "doc-side nDCG@10 / bound",
            "doc-side R@10 / target",
            "query-side nDCG@10 / target",
            "query-side nDCG@10 / bound",
            "native nDCG@10",
            "bound nDCG@10",
            "mean-est. top-1",
            "identity R² / top-1",
            "identity doc / query nDCG ratio",
        ],
        rows,
    )
    native = q["native_full_corpus"]
    lines += [
        "All-native nDCG@10 over each model's whole corpus (mpnet: its 2,560 documents): "
        + ", ".join(f"{k} {v['ndcg_at_10_score']:.3f}" for k, v in native.items())
        + ".",
        "",
        "![retention](quality_retention.png)",
        "",
    ]
    return lines


def _matrix(q: Any, method: str, key: str) -> np.ndarray:
    m = np.full((len(MODELS), len(MODELS)), np.nan)
    for r in q["rows"]:
        if r["method"] == method and r["crossfit"] and r["crossfit"].get(key):
            m[MODELS.index(r["source"]), MODELS.index(r["target"])] = r["crossfit"][key][
                "ndcg_at_10_ratio"
            ]
    return m


def _heat(ax: Any, m: np.ndarray, title: str, vmin: float = 0.0, vmax: float = 1.0) -> None:
    ax.imshow(np.ma.masked_invalid(m), vmin=vmin, vmax=vmax, cmap="viridis")
    ax.set(
        xticks=range(len(MODELS)),
        yticks=range(len(MODELS)),
        xticklabels=MODELS,
        yticklabels=MODELS,
        title=title,
        xlabel="target",
        ylabel="source",
    )
    for (i, j), v in np.ndenumerate(m):
        if np.isfinite(v):
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                color="white" if v < (vmin + vmax) / 2 else "black",
                fontsize=8,
            )


def plot_quality(q: Any) -> None:
    present = {r["method"] for r in q["rows"] if r["crossfit"]}
    methods = [m for m in ("ridge", "procrustes", "mlp") if m in present]
    methods += sorted(present - set(methods))
    fig, axes = plt.subplots(2, len(methods), figsize=(4.2 * len(methods), 8), squeeze=False)
    for j, method in enumerate(methods):
        _heat(axes[0][j], _matrix(q, method, "document_side"), f"{method}: doc-side nDCG ratio")
        _heat(axes[1][j], _matrix(q, method, "query_side"), f"{method}: query-side nDCG ratio")
    fig.tight_layout()
    fig.savefig(results_dir() / "quality_retention.png", dpi=110)
    plt.close(fig)


def curve_section(lc: Any) -> list[str]:
    lines = ["## Learning curve", ""]
    lines.append(
        "Hold-out quality against the number of training pairs: nested seeded subsets of the "
        "80 % training documents, scored on the same 20 % held-out documents (nDCG ratio: "
        "native target queries over the translated held-out documents ÷ over the native "
        "ones). minilm → mpnet has only 2,048 training documents, so it stops at 2,000."
    )
    lines.append("")
    rows = [
        [
            f"{r['source']} → {r['target']}",
            r["method"],
            _n(r["train_pairs"]),
            _f(r["r2_score"]),
            _f(r["top1_accuracy_score"]),
            _f(r["ndcg_at_10_ratio"]),
        ]
        for r in lc["rows"]
    ]
    lines += _table(["pair", "method", "training pairs", "R²", "top-1", "nDCG@10 ratio"], rows)
    return [*lines, "![learning curve](learning_curve.png)", ""]


def plot_curve(lc: Any) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    keys = dict.fromkeys((r["source"], r["target"], r["method"]) for r in lc["rows"])
    for i, (s, t, m) in enumerate(keys):
        rows = [r for r in lc["rows"] if (r["source"], r["target"], r["method"]) == (s, t, m)]
        n = [r["train_pairs"] for r in rows]
        style = "-o" if m == "ridge" else "--s"
        color = f"C{list(dict.fromkeys((k[0], k[1]) for k in keys)).index((s, t)) % 10}"
        axes[0].plot(n, [r["r2_score"] for r in rows], style, color=color, label=f"{s}→{t} {m}")
        axes[1].plot(n, [r["ndcg_at_10_ratio"] for r in rows], style, color=color)
        del i
    axes[0].set(xscale="log", xlabel="training pairs", ylabel="held-out R²")
    axes[1].set(xscale="log", xlabel="training pairs", ylabel="held-out nDCG@10 ratio")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results_dir() / "learning_curve.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- alignment
#: Score key and panel title of each representation-similarity score (lead.metrics).
ALIGNMENT_SCORES = (
    ("linear_cka_score", "linear CKA"),
    ("unbiased_cka_score", "unbiased CKA"),
    ("mutual_knn_score", "mutual kNN (k=10)"),
    ("cknna_score", "CKNNA (k=10)"),
    ("cycle_knn_score", "cycle kNN (k=10), row → column"),
    ("svcca_score", "SVCCA (10 directions)"),
    ("pwcca_score", "PWCCA (row = A)"),
)
#: Scores that differ when the models are swapped; the rest are symmetric.
ASYMMETRIC = ("cycle_knn_score", "pwcca_score")


def _value(v: Any) -> float:
    return float("nan") if v is None else float(v)


def alignment_matrices(al: Any, q: Any) -> dict[str, np.ndarray]:
    """One (models × models) matrix per score, [i, j] = score(A = row, B = column); a model
    with itself is 1 (cycle kNN: not computed), a missing figure NaN."""
    k = len(MODELS)
    mats: dict[str, np.ndarray] = {}
    for key, title in ALIGNMENT_SCORES:
        m = np.full((k, k), np.nan) if key == "cycle_knn_score" else np.eye(k)
        for name in MODELS:
            if name not in al["models"]:
                m[MODELS.index(name), MODELS.index(name)] = np.nan
        for pair, v in al["pairs"].items():
            a, b = pair.split("|")
            i, j = MODELS.index(a), MODELS.index(b)
            m[i, j] = _value(v.get(key))  # results from before a score existed lack it
            back = v.get("reverse", {}) if key in ASYMMETRIC else v
            m[j, i] = _value(back.get(key))
        mats[title] = m
    r2 = np.full((k, k), np.nan)
    if q:
        for r in q["rows"]:
            i, j = MODELS.index(r["source"]), MODELS.index(r["target"])
            r2[i, j] = np.nanmax([r2[i, j], r["scorecard"]["r2_score"]])
    mats["best stitch hold-out R²"] = r2
    return mats


def alignment_section(al: Any, q: Any) -> list[str]:
    mats = alignment_matrices(al, q)
    lines = ["## Alignment between the models", ""]
    lines.append(
        "Representation similarity of the native document vectors of each pair over the "
        "documents both have, by `lead.metrics`: linear and unbiased CKA, mutual kNN, CKNNA "
        "and cycle kNN (k = 10), SVCCA of the 10 leading singular directions and PWCCA of "
        "all directions (– where there are too few documents for CCA of that many "
        "directions). Cycle kNN (row → column) and PWCCA (row as A; the weights come from "
        "the model with fewer directions) are not symmetric. Best stitch R² = the highest "
        "hold-out R² of any method for source (row) → target (column), from the quality "
        "table."
    )
    lines.append("")
    for title, m in mats.items():
        rows = [
            [MODELS[i], *(_f(v, 2) if np.isfinite(v) else "–" for v in m[i])]
            for i in range(len(MODELS))
        ]
        lines += [f"**{title}**", "", *_table(["", *MODELS], rows)]
    return [*lines, "![alignment](alignment.png)", ""]


def plot_alignment(al: Any, q: Any) -> None:
    mats = alignment_matrices(al, q)
    cols = 4
    rows = -(-len(mats) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.3 * rows), squeeze=False)
    for ax, (title, m) in zip(axes.flat, mats.items(), strict=False):
        _heat(ax, m, title)
    for ax in list(axes.flat)[len(mats) :]:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(results_dir() / "alignment.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- summary
def write_summary() -> None:
    run = read_result("run") or {}
    tp, prof, mig = read_result("throughput"), read_result("profile"), read_result("migration")
    fc, q = read_result("fitcost"), read_result("quality")
    lc, al = read_result("learning_curve"), read_result("alignment")
    machine = run.get("machine", {})
    total = run.get("total_seconds")
    lines = ["# LEAD bench — summary", ""]
    lines.append(
        f"Run {machine.get('time', '?')} on {machine.get('cpu', '?')} ({machine.get('cores')} "
        f"cores, torch {machine.get('torch')} with {machine.get('torch_threads')} threads), "
        f"{QUICK_NOTE if run.get('quick') else 'full run'}. "
        f"Total runtime of `bash bench/run.sh`: **{(total or 0) / 60:.1f} min** "
        f"({total or 0:.0f} s, setup included)."
    )
    for rerun in run.get("partial_reruns", []):
        lines.append(
            f"Sections re-run afterwards on their own: {', '.join(rerun['sections'])} "
            f"({rerun['machine']['time']}, {rerun['seconds']:.0f} s)."
        )
    sections = run.get("sections", {})
    if sections:
        lines.append("")
        lines.append(
            "Section wall times (1-minute load average before → after; above ~2 means other "
            "work shared the 2 cores and the timings are pessimistic): "
            + "; ".join(
                f"{name} {s['seconds']:.0f} s ({s['loadavg_before']} → {s['loadavg_after']})"
                for name, s in sections.items()
            )
            + "."
        )
    lines.append("")
    table, _ = acceptance(tp, mig, q)
    lines += ["## Acceptance", "", *table]
    if tp:
        lines += cpu_budget(tp, prof, int(machine.get("cores") or 2))
    if tp:
        plot_throughput(tp)
        lines += throughput_section(tp)
    lines += profile_section(prof)
    if mig:
        plot_migration(mig)
        lines += migration_section(mig)
    if fc:
        plot_fitcost(fc)
        lines += fitcost_section(fc)
    if q:
        plot_quality(q)
        lines += quality_section(q)
    if lc and lc["rows"]:
        plot_curve(lc)
        lines += curve_section(lc)
    if al:
        plot_alignment(al, q)
        lines += alignment_section(al, q)
    fid = read_result("fidelity")
    if fid:
        lines += fidelity_report.section(fid)
    lines += budget_section(q, fc, mig)
    (results_dir() / "SUMMARY.md").write_text("\n".join(lines).rstrip() + "\n")


def budget_section(q: Any, fc: Any, mig: Any) -> list[str]:
    lines = ["## What was budgeted or skipped, and why", ""]
    items = [
        "The whole harness must finish in under 20 minutes on this 2-core machine.",
    ]
    if q:
        all_pairs = len(q.get("pairs", [])) or len({(r["source"], r["target"]) for r in q["rows"]})
        items.append(
            f"MLP: hold-out scorecard for {len(q['mlp_pairs'])} of {all_pairs} pairs with "
            f"options {q['methods'].get('mlp') or 'defaults'}, but cross-fitted retrieval "
            f"(6 MLP trainings per pair) only for {', '.join(q['mlp_crossfit_pairs'])}: the "
            "MLP for all 20 pairs × 6 fits would take longer than the whole budget; ridge and "
            "Procrustes run everywhere."
        )
        items.append(
            "Quality, learning curve and alignment run in two worker processes with one torch "
            "thread each (no timing is taken there; one thread per process avoids OpenMP "
            "oversubscription on 2 cores)."
        )
    if fc and any(r["options"] for r in fc["rows"]):
        opts = {r["method"]: r["options"] for r in fc["rows"] if r["options"]}
        items.append(f"Fitting cost runs the MLP with {opts} to bound its time at 20,000 pairs.")
    if mig:
        items.append(
            f"Re-embedding is timed on {mig['sample_docs']} documents per model and "
            "extrapolated (mpnet embeds about one SciFact abstract per second here, so the "
            "whole corpus would take more than an hour); e5 is not timed (minilm is the "
            "second target), because e5 embeds ~2 documents/s and would cost minutes more."
        )
    items.append(
        "Learning curve: minilm → mpnet stops at 2,000 training pairs (only 2,048 training "
        "documents); the other pairs reach 4,000."
    )
    return [*lines, *(f"- {i}" for i in items), ""]


if __name__ == "__main__":
    write_summary()
