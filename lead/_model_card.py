"""The ``README.md`` model card of a stitch artifact (private; used by :mod:`lead.artifacts`).

YAML front matter (``library_name: lead``, tags, ``base_model`` naming both models and a
``model-index`` with the held-out scores), then prose: what the stitch maps, how to use it,
how it was fitted, and its scorecard. Strings are written as JSON strings, which YAML reads
back unchanged.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lead._confidence_head import current_report

__all__ = ["model_card"]


def _q(text: Any) -> str:
    return json.dumps(str(text), ensure_ascii=False)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _metrics(scorecard: dict[str, Any] | None) -> list[tuple[str, float]]:
    """Flat ``(name, value)`` list of a scorecard's scores, retrieval ones prefixed."""
    if not scorecard:
        return []
    rows = []
    for key, value in scorecard.items():
        number = _number(value)
        if number is not None and key not in {"pairs", "pool_size"}:
            rows.append((key, number))
    retrieval = scorecard.get("retrieval")
    if isinstance(retrieval, dict):
        for key, value in retrieval.items():
            number = _number(value)
            if number is not None and key not in {"k", "queries"}:
                rows.append((f"retrieval.{key}", number))
    round_trip = scorecard.get("round_trip")
    if isinstance(round_trip, dict):
        rows += [(k, n) for k, v in round_trip.items() if (n := _number(v)) is not None]
    return rows


def _front_matter(config: dict[str, Any], name: str, metrics: list[tuple[str, float]]) -> str:
    source, target = config["source"]["model"], config["target"]["model"]
    lines = [
        "---",
        "library_name: lead",
        "tags:",
        "- lead",
        "- embedding-stitch",
        f"- {config['architecture']}",
        "base_model:",
        f"- {_q(source)}",
        f"- {_q(target)}",
    ]
    if metrics:
        pairs = (config.get("scorecard") or {}).get("pairs", "?")
        lines += [
            "model-index:",
            f"- name: {_q(name)}",
            "  results:",
            "  - task:",
            "      type: feature-extraction",
            f"      name: {_q('Embedding translation ' + source + ' -> ' + target)}",
            "    dataset:",
            "      type: held-out-pairs",
            f"      name: {_q(f'held-out paired embeddings ({pairs} pairs)')}",
            "    metrics:",
        ]
        for key, value in metrics:
            lines += [f"    - type: {_q(key)}", f"      value: {value!r}", f"      name: {_q(key)}"]
    lines.append("---")
    return "\n".join(lines)


def _scorecard_table(scorecard: dict[str, Any] | None) -> str:
    metrics = _metrics(scorecard)
    if not metrics or scorecard is None:
        return "No held-out scorecard was recorded for this stitch."
    baselines = scorecard.get("baselines") or {}
    mean_estimator = baselines.get("mean_estimator") or {}
    lines = [
        f"Held-out pairs: {scorecard.get('pairs', '?')} "
        f"(retrieval pool: {scorecard.get('pool_size', '?')}).",
        "",
        "| metric | stitch | mean-estimator baseline |",
        "|---|---|---|",
    ]
    for key, value in metrics:
        baseline = _number(mean_estimator.get(key))
        shown = f"{baseline:.4f}" if baseline is not None else "–"
        lines.append(f"| `{key}` | {value:.4f} | {shown} |")
    return "\n".join(lines)


def _norm_range_text(report: dict[str, Any]) -> str:
    """``, or a length outside [low, high]`` for a head that flags lengths (version 4)."""
    bounds = report.get("input_norm_range")
    if not isinstance(bounds, list) or len(bounds) != 2:
        return ""
    low, high = (_number(v) for v in bounds)
    if low is None or high is None:
        return ""
    return f", or an L2 norm outside [{low:.4g}, {high:.4g}]"


def _confidence_section(config: dict[str, Any]) -> str:
    block = config.get("confidence")
    report = _head_report(config)
    if not isinstance(block, dict) or report is None:
        return (
            "This stitch has no confidence head (it was fitted without held-out rows, or "
            "with `--no-confidence`)."
        )
    spearman = _number(report.get("in_domain_spearman_score"))
    shown = f"{spearman:.4f}" if spearman is not None else "?"
    threshold = _number(report.get("ood_threshold"))
    generic = _number(report.get("generic_spearman_score"))
    features = block.get("stitch_features")
    own = (
        f" (without the stitch's own {features} features: {generic:.4f})"
        if isinstance(features, int) and features > 0 and generic is not None
        else ""
    )
    general = _number(report.get("out_of_domain_spearman_score"))
    general_line = (
        f"- the same on {report.get('general_rows', '?')} general rows kept out of training "
        f"(text outside the held-out rows' domain), out of fold: **{general:.4f}**\n"
        if general is not None
        else ""
    )
    return (
        "Every translated vector can carry a confidence in [0, 1], a calibrated estimate of "
        "its cosine with the target model's own vector (`lead translate "
        "--confidence-output`, `lead.confidence.translate_with_confidence`), and a flag for "
        f"inputs far outside the training data (distance over {threshold or 0:.4g}"
        f"{_norm_range_text(report)}).\n\n"
        f"- method: `{block.get('method')}` version {block.get('version')}\n"
        f"- Spearman(confidence, true cosine) on {report.get('held_out_rows', '?')} held-out "
        f"rows, out of fold: **{shown}**{own}\n"
        f"{general_line}"
        f"- held-out rows flagged out of distribution: "
        f"{report.get('held_out_ood_fraction', '?')}"
    )


def _head_report(config: dict[str, Any]) -> dict[str, Any] | None:
    """The confidence head's report under the current key names, or None without a head."""
    block = config.get("confidence")
    report = block.get("report") if isinstance(block, dict) else None
    return current_report(report) if isinstance(report, dict) else None


def _confidence_metric(config: dict[str, Any]) -> list[tuple[str, float]]:
    report = _head_report(config)
    if report is None:
        return []
    value = _number(report.get("in_domain_spearman_score"))
    general = _number(report.get("out_of_domain_spearman_score"))
    metrics = [] if value is None else [("confidence_spearman_score", value)]
    if general is not None:
        metrics.append(("confidence_out_of_domain_spearman_score", general))
    return metrics


def model_card(config: dict[str, Any], name: str) -> str:
    """Render the model card of a stitch from its ``config.json`` dict."""
    source, target = config["source"], config["target"]
    fit = config.get("fit") or {}
    metrics = _metrics(config.get("scorecard")) + _confidence_metric(config)
    options = json.dumps(fit.get("options", {}), sort_keys=True)
    data = fit.get("data")
    data_line = f"- data: `{json.dumps(data)}`\n" if data else ""
    holdout = fit.get("holdout") or {}
    if holdout.get("ids"):
        data_line += (
            f"- held-out rows ({len(holdout['ids'])}, seed {holdout.get('seed')}), by id: "
            f"`{' '.join(holdout['ids'])}`\n"
        )
    return f"""{_front_matter(config, name, metrics)}

# {name}

A LEAD embedding stitch: it maps vectors of
**{source["model"]}** ({source["dim"]} dimensions) into the embedding space of
**{target["model"]}** ({target["dim"]} dimensions), so that documents already embedded with
the source model can be searched with, or compared to, target-model vectors without
re-embedding them. Architecture: `{config["architecture"]}`; outputs are
{"L2-normalised" if config.get("normalize_output") else "not normalised"}.

## Usage

```python
import torch
from lead import load_stitch

# a local folder, or "org/name@revision" on the Hub
stitch = load_stitch("{name}")
with torch.no_grad():
    # source_vectors: (n, {source["dim"]}) -> target_like: (n, {target["dim"]})
    target_like = stitch(torch.as_tensor(source_vectors))
```

Or from the command line: `lead translate {name} --input source.npy --output translated.npy`.

## How it was fitted

- method: `{fit.get("method", "unknown")}`, options: `{options}`
- pairs: {fit.get("pairs", "unknown")}, seed: {fit.get("seed", "unknown")}
{data_line}- lead version: {config.get("lead_version", "unknown")}

## Held-out scorecard

{_scorecard_table(config.get("scorecard"))}

## Per-vector confidence

{_confidence_section(config)}
"""
