"""The files ``verify`` writes: ``report.json``, ``report.md``, ``cosine.png`` and JUnit XML.

Every file is written to a temporary name beside its final one, fsynced and renamed, so a
reader (a CI step) sees the old file or the new one, never half of one. The JUnit file has
one ``testcase`` per threshold, with a ``failure`` whose message holds the figures when the
threshold is not met (the format Jenkins, GitLab and GitHub test reporters read).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lead._durable import atomic_write
from lead.migrate.quality import Check

__all__ = [
    "MIN_HISTOGRAM_SPAN",
    "ONE_BAR_WIDTH",
    "histogram_bins",
    "junit_xml",
    "markdown_report",
    "plot_cosines",
    "write_json",
    "write_text",
]


def write_text(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def write_json(path: Path, value: Any) -> Path:
    """Write ``value`` as indented JSON (no NaN) to ``path`` atomically."""
    return write_text(path, json.dumps(value, indent=2, allow_nan=False) + "\n")


#: Narrowest range of cosines drawn in several bins: cosines that all but agree (a target
#: holding the native vectors themselves) would otherwise ask for bins narrower than float64
#: resolves.
MIN_HISTOGRAM_SPAN = 1e-3
#: Width of the one bar that narrower cosines are drawn as, wide enough to see.
ONE_BAR_WIDTH = 1e-2


def histogram_bins(cosines: np.ndarray) -> tuple[int, tuple[float, float]]:
    """The bins of the cosine histogram: their count and the range they cover.

    Parameters
    ----------
    cosines : ndarray of shape (n,), n >= 1
        Finite.

    Returns
    -------
    bins : int
        ``n // 10`` clipped to [10, 50]; 1 when the cosines span less than
        :data:`MIN_HISTOGRAM_SPAN` (constant or near-constant cosines).
    range : (float, float)
        The cosines' range; for one bin, :data:`ONE_BAR_WIDTH` about its middle.
    """
    lo, hi = float(np.min(cosines)), float(np.max(cosines))
    if hi - lo >= MIN_HISTOGRAM_SPAN:
        return min(50, max(10, len(cosines) // 10)), (lo, hi)
    middle = (lo + hi) / 2
    return 1, (middle - ONE_BAR_WIDTH / 2, middle + ONE_BAR_WIDTH / 2)


#: Why a report has no cosine histogram.
NO_PLOT = "no cosine.png: matplotlib is not installed (pip install 'lead-stitch[migrate]')"


def plot_cosines(path: Path, cosines: np.ndarray, *, threshold: float | None = None) -> Path | None:
    """A histogram of per-vector cosines (translated against native), as PNG.

    Parameters
    ----------
    cosines : ndarray of shape (n,)
        In [-1, 1]; constant ones (every cosine 1.0) are drawn in one bar.
    threshold : float, optional
        Drawn as a vertical line (the mean-cosine threshold).

    Returns
    -------
    Path or None
        ``path``; None when matplotlib is not installed (``pip install
        'lead-stitch[migrate]'``): the report goes without a plot.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(figure)  # no pyplot: no global state, no display
    axes = figure.add_subplot()
    bins, span = histogram_bins(cosines)
    axes.hist(cosines, bins=bins, range=span, color="#4c72b0")
    mean = float(np.mean(cosines))
    p5 = float(np.percentile(cosines, 5))
    axes.axvline(mean, color="black", label=f"mean {mean:.3f}")
    axes.axvline(p5, color="black", linestyle="--", label=f"5th percentile {p5:.3f}")
    if threshold is not None:
        axes.axvline(threshold, color="#c44e52", label=f"threshold {threshold:.3f}")
    axes.set_xlabel("cosine(translated, native)")
    axes.set_ylabel("vectors")
    axes.set_title(f"{len(cosines)} sampled vectors")
    axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    return atomic_write(path, lambda handle: figure.savefig(handle, format="png"))


def junit_xml(
    path: Path, checks: Sequence[Check], *, suite: str, properties: dict[str, Any]
) -> Path:
    """One ``testcase`` per check; a failed one holds a ``failure`` with its figures."""
    failures = sum(not c.passed for c in checks)
    root = ET.Element("testsuites", tests=str(len(checks)), failures=str(failures))
    node = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures), errors="0"
    )
    props = ET.SubElement(node, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", name=key, value=str(value))
    for check in checks:
        case = ET.SubElement(node, "testcase", classname=suite, name=check.name)
        if not check.passed:
            failure = ET.SubElement(case, "failure", message=check.message(), type="threshold")
            failure.text = json.dumps(check.as_dict())
    tree = ET.ElementTree(root)
    return atomic_write(
        path, lambda handle: tree.write(handle, encoding="utf-8", xml_declaration=True)
    )


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _num(value: Any) -> str:
    return "–" if value is None else f"{float(value):.4f}"


def _figure(value: Any) -> str:
    """A count as an integer, any other figure as :func:`_num`."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else _num(value)


def markdown_report(report: dict[str, Any]) -> str:
    """``report.md``: the verdict, the checks, the figures, retrieval and the worst ids."""
    verdict = "PASSED" if report["passed"] else "FAILED"
    sample = report["sample"]
    lines = [
        f"# LEAD migration verify: {verdict}",
        "",
        f"- translated: `{report['target']}`",
        f"- native: `{report['native']}`",
        *([f"- source: `{report['source']}`"] if report.get("source") else []),
        f"- sample: {sample['pairs']} ids (seed {sample['seed']}), {sample['judged']} of them "
        f"judged documents; {sample['excluded']} excluded ids never sampled",
        "",
        "## Checks",
        "",
        _row(["check", "figure", "value", "operator", "threshold", "origin", "result"]),
        _row(["---"] * 7),
    ]
    for c in report["checks"]:
        lines.append(
            _row(
                [
                    f"`{c['name']}`",
                    c["metric"],
                    _figure(c["value"]),
                    c["operator"],
                    _figure(c["threshold"]),
                    c["origin"],
                    "pass" if c["passed"] else "**FAIL**",
                ]
            )
        )
    baseline = report["baselines"]["mean_estimator"]
    lines += ["", "## Figures", "", _row(["metric", "translated", "mean estimator"])]
    lines.append(_row(["---"] * 3))
    for key, value in report["scores"].items():
        lines.append(_row([key, _num(value), _num(baseline.get(key))]))
    cos = report["cosine"]
    lines += [
        "",
        f"Per-vector cosine: mean {_num(cos['mean'])}, 5th percentile {_num(cos['p5'])}, "
        f"median {_num(cos['p50'])}, min {_num(cos['min'])}.",
    ]
    reference = report.get("r2_reference")
    if reference is not None:
        lines += [
            "",
            "R² is measured against the mean of the native vectors the stitch was fitted "
            "towards (as calibrate measures it)."
            if reference == "target_train_mean"
            else "R² is measured against the sample's own mean (the mean estimator scores 0); "
            "`--stitch` measures it against the stitch's training mean, as calibrate does.",
        ]
    if report["files"].get("plot"):
        lines += ["", f"![cosine histogram]({report['files']['plot']})"]
    elif report["files"].get("plot_missing"):
        lines += ["", f"({report['files']['plot_missing']})"]
    retrieval = report.get("retrieval")
    if retrieval is not None:
        lines += _retrieval_lines(retrieval)
    if report.get("consistency"):
        lines += _consistency_lines(report["consistency"])
    lines += ["", "## Worst rows", "", _row(["id", "cosine"]), _row(["---"] * 2)]
    lines += [_row([f"`{w['id']}`", _num(w["cosine"])]) for w in cos["worst"]]
    return "\n".join(lines) + "\n"


def _consistency_lines(consistency: dict[str, Any]) -> list[str]:
    """The target against the source: ids that differ, rows that no longer match."""
    lines = ["", "## Target against source", ""]
    ids = consistency.get("ids")
    if ids is not None:
        lines.append(
            f"- ids of the source missing from the target: {ids['missing']}"
            + (
                f" (first: {', '.join(f'`{i}`' for i in ids['missing_ids'])})"
                if ids["missing"]
                else ""
            )
        )
        lines.append(
            f"- ids of the target the source lacks: {ids['extra']}"
            + (f" (first: {', '.join(f'`{i}`' for i in ids['extra_ids'])})" if ids["extra"] else "")
        )
    match = consistency.get("source_match")
    if match is not None:
        lines.append(
            f"- source rows translated again with `{match['stitch']}` and compared: "
            f"{match['sampled']}, not matching the target: {match['not_matching']}"
            + "".join(
                f"\n  - `{row['id']}`: cosine {_num(row['cosine'])}"
                for row in match["not_matching_ids"]
            )
        )
    return lines


def _retrieval_lines(retrieval: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## Retrieval ({retrieval['queries']} queries over {retrieval['documents']} documents)",
        "",
        _row(["", "recall@10", "nDCG@10"]),
        _row(["---"] * 3),
    ]
    for name in ("translated", "target_native", "source_native"):
        found = retrieval.get(name)
        if found is not None:
            lines.append(
                _row([name, _num(found["recall_at_10_score"]), _num(found["ndcg_at_10_score"])])
            )
    bound = retrieval["bound"]
    lines.append(
        _row(
            [
                f"bound ({retrieval['bound_from']})",
                _num(bound["recall_at_10_score"]),
                _num(bound["ndcg_at_10_score"]),
            ]
        )
    )
    lines.append(
        _row(
            [
                "retention (translated / bound)",
                _num(retrieval["recall_at_10_retention"]),
                _num(retrieval["ndcg_at_10_retention"]),
            ]
        )
    )
    return lines
