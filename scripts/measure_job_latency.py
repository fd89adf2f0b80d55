"""Translate latency while an MLP job trains, against idle; and the headline job check.

Starts a real uvicorn server on loopback with a temporary LEAD_DATA_DIR, uploads the SciFact
minilm → e5 corpus pairs (5,183, with queries and test qrels) as a dataset, and then

1. headline: runs a ridge job, translates with its stitch in the very next request, and
   checks the job's scorecard against ``lead score`` on the same held-out split (a
   subprocess) and against lead's Python API (split, fit, score, retrieval included);
2. latency: times sequential ``POST /v1/translate`` calls (a batch of query vectors) with
   no job, then while an MLP job trains in the worker process, in ``--blocks`` alternations
   (drifting machine load hits both sides), and reports p50 / p99 and their ratios.

Usage: ``.venv/bin/python scripts/measure_job_latency.py [--requests 300] [--blocks 3]``.
Prints a JSON report (also written to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import REPO, Server, dataset_file, scifact_pairs, wait_job

from lead.client import encode_base64


def _max_diff(a: Any, b: Any, path: str = "") -> tuple[float, str]:
    """Largest absolute difference between two scorecards (same keys required)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        diffs = [_max_diff(a[k], b[k], f"{path}.{k}") for k in a]
        return max(diffs, default=(0.0, path))
    if isinstance(a, float | int) and not isinstance(a, bool):
        return abs(float(a) - float(b)), path
    assert a == b, (path, a, b)
    return 0.0, path


def headline(
    client: httpx.Client, server: Server, pairs: dict[str, Any], ds: str
) -> dict[str, Any]:
    from lead.artifacts import load_stitch
    from lead.fitting import fit_stitch
    from lead.scorecard import RetrievalData, score_stitch
    from lead.splits import holdout_split
    from lead.stitches import StitchInfo

    t0 = time.perf_counter()
    job = client.post(
        "/v1/jobs",
        json={
            "source_model": pairs["source_model"],
            "target_model": pairs["target_model"],
            "dataset": ds,
        },
    ).json()
    job = wait_job(client, job["id"])
    elapsed = time.perf_counter() - t0
    assert job["status"] == "succeeded", job
    x = pairs["source_queries"][:16]
    r = client.post("/v1/translate", json={"stitch": job["stitch_id"], "input": encode_base64(x)})
    folder = server.data_dir / "stitches" / job["stitch_id"]
    card = job["scorecard"]

    # `lead score` with the job's stitch on the same split (it has no retrieval part)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "pairs.safetensors"
        data.write_bytes(dataset_file(pairs, retrieval=False))
        out = subprocess.run(
            [
                str(REPO / ".venv" / "bin" / "lead"),
                "score",
                str(folder),
                "--source",
                f"{data}:source",
                "--target",
                f"{data}:target",
                "--holdout",
                "0.2",
                "--seed",
                "0",
            ],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
    cli_card = json.loads(out.stdout)
    vs_cli = _max_diff(
        {k: v for k, v in card.items() if k != "retrieval"},
        {k: v for k, v in cli_card.items() if k != "retrieval"},
    )

    # lead's Python API from scratch: split, fit on the training rows, score with retrieval
    X, Y = pairs["source"], pairs["target"]
    train, test = holdout_split(len(X), 0.2, 0)
    info = StitchInfo(source_model=pairs["source_model"], target_model=pairs["target_model"])
    refit = fit_stitch(X[train], Y[train], "ridge", info=info, seed=0)
    retrieval = RetrievalData(
        target_queries=pairs["target_queries"],
        source_queries=pairs["source_queries"],
        query_ids=pairs["query_ids"],
        corpus_ids=[pairs["corpus_ids"][i] for i in test],
        qrels=pairs["qrels"],
    )
    lead_card = score_stitch(
        refit, X[test], Y[test], target_train_mean=Y[train].mean(axis=0), retrieval=retrieval
    ).to_dict()
    vs_api = _max_diff(card, lead_card)
    saved = load_stitch(folder)
    return {
        "job_id": job["id"],
        "status": job["status"],
        "pairs": job["pairs"],
        "job_seconds": round(elapsed, 2),
        "stitch_id": job["stitch_id"],
        "translate_right_after": {"status": r.status_code, "vectors": len(r.json()["data"])},
        "scorecard": card,
        "max_abs_diff_vs_lead_score_cli": vs_cli,
        "max_abs_diff_vs_lead_api_refit": vs_api,
        "saved_config_scorecard_equals_job": saved.info.scorecard == card,
    }


def measure(client: httpx.Client, body: dict[str, Any], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v1/translate", json=body)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
    return times


def latency(
    client: httpx.Client, body: dict[str, Any], pairs: dict[str, Any], ds: str, args: Any
) -> dict[str, Any]:
    """Alternate blocks: idle, then while an MLP job trains (cancelled after each block), so
    that drifting load on the machine affects both sides alike."""
    options = {"hidden_dim": 512, "max_epochs": 1000, "patience": 1000}
    idle: list[float] = []
    during: list[float] = []
    blocks = []
    for block in range(args.blocks):
        idle_ms = measure(client, body, args.requests)
        job = client.post(
            "/v1/jobs",
            json={
                "source_model": pairs["source_model"],
                "target_model": pairs["target_model"],
                "dataset": ds,
                "method": "mlp",
                "options": options,
                "stitch_id": f"latency-mlp-{block}",
            },
        ).json()
        wait_job(client, job["id"], until=lambda j: j["progress"]["stage"] == "train")
        during_ms = measure(client, body, args.requests)
        after = client.get(f"/v1/jobs/{job['id']}").json()
        client.post(f"/v1/jobs/{job['id']}/cancel")
        cancelled = wait_job(client, job["id"])
        blocks.append(
            {
                "idle": summary(idle_ms),
                "during_mlp_training": summary(during_ms),
                "job_trained_throughout": after["status"] == "running",
                "epochs_while_measuring": after["progress"]["step"],
                "job_after_cancel": cancelled["status"],
            }
        )
        idle += idle_ms
        during += during_ms
    pooled = {"idle": summary(idle), "during_mlp_training": summary(during)}
    return {
        "batch": args.batch,
        **pooled,
        "ratio_p50": round(pooled["during_mlp_training"]["p50_ms"] / pooled["idle"]["p50_ms"], 3),
        "ratio_p99": round(pooled["during_mlp_training"]["p99_ms"] / pooled["idle"]["p99_ms"], 3),
        "blocks": blocks,
    }


def summary(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {
        "requests": len(ms),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "mean_ms": round(float(a.mean()), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="translate calls per block")
    parser.add_argument("--batch", type=int, default=32, help="vectors per translate call")
    parser.add_argument("--blocks", type=int, default=3, help="idle / training alternations")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pairs = scifact_pairs("minilm", "e5")
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "data").start()
        report: dict[str, Any] = {"server": server.url}
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                blob = dataset_file(pairs)
                t0 = time.perf_counter()
                r = client.post(
                    "/v1/datasets",
                    content=blob,
                    headers={"content-type": "application/octet-stream"},
                )
                assert r.status_code == 201, r.text
                report["upload"] = {
                    "bytes": len(blob),
                    "seconds": round(time.perf_counter() - t0, 2),
                    "dataset": r.json(),
                }
                ds = r.json()["id"]
                report["headline"] = head = headline(client, server, pairs, ds)

                body = {
                    "stitch": head["stitch_id"],
                    "input": encode_base64(pairs["source_queries"][: args.batch]),
                }
                measure(client, body, 30)  # warm-up
                report["latency"] = latency(client, body, pairs, ds, args)
        finally:
            server.stop()
    text = json.dumps(report, indent=2)
    sys.stdout.write(text + "\n")
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
