"""Translation throughput with 2 uvicorn workers against 1, side by side.

Standalone (no ``../shared`` needed; the bundled ``minilm-to-mpnet``, default limits, jobs
off)::

    .venv/bin/python -m bench.workers            # ~1.5 minutes
    .venv/bin/python -m bench.workers --quick    # a smoke run into bench/results/quick/

Each round starts a fresh ``uvicorn --workers 1`` and a fresh ``--workers 2`` (as
``scripts/serve.sh`` does: the 2-worker server with a fresh ``PROMETHEUS_MULTIPROC_DIR``, so
its ``/metrics`` sums both) and measures, one server at a time:

* **single vectors**: 64 concurrent keep-alive clients (one asyncio process, each sending its
  next request when the previous answered), base64 single vectors;
* **batches of 32**: 16 concurrent clients, 32 base64 vectors a request.

Reported: requests/s and vectors/s, p50 / p99, statuses (429s counted: the default admission
limits apply), the 2-worker / 1-worker ratio per round and its median, and whether the
2-worker server's ``/metrics`` counted every translate request the clients sent. The clients
share the machine with the servers, so on few cores they take CPU from the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.common import QUICK_RESULTS, log, machine, use_results_dir, write_result
from bench.data import REPO
from bench.latency import STITCH, concurrent_clients, request_bytes
from bench.server import _free_port as free_port
from bench.server import worker_pids

LOADS = {"single_vector": (1, 64), "batch_32": (32, 16)}  # name: (vectors a request, clients)
_TRANSLATED = re.compile(
    r'^lead_http_requests_total\{[^}]*route="/v1/translate"[^}]*\} (\S+)$', re.MULTILINE
)


def _body(vectors: int) -> bytes:
    x = np.random.default_rng(vectors).standard_normal((vectors, 384)).astype("<f4")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    encoded = [base64.b64encode(row.tobytes()).decode() for row in x]
    return orjson.dumps({"stitch": STITCH, "input": encoded, "encoding_format": "base64"})


def _serve(workers: int, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A fresh server with ``workers`` processes, once every one of them serves."""
    port = free_port()
    env = {
        **os.environ,
        "LEAD_STITCHES": orjson.dumps([str(REPO / "models" / STITCH)]).decode(),
        "LEAD_DEVICE": "cpu",
        "LEAD_ENABLE_JOBS": "false",
        "LEAD_LOAD_IN_BACKGROUND": "false",
        "LEAD_LOG_LEVEL": "WARNING",
        "LEAD_DATA_DIR": str(tmp / "data"),
        "LEAD_WORKERS": str(workers),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    metrics_dir = tmp / f"metrics-{port}"
    if workers > 1:  # as scripts/serve.sh
        metrics_dir.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    command = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
    command += ["--port", str(port), "--workers", str(workers)]
    command += ["--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(command, cwd=REPO, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            ready = False
        if ready and (workers == 1 or len(worker_pids(metrics_dir)) >= workers):
            return proc, port
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the {workers}-worker server was not ready in 120 s")


def _translated(port: int) -> float:
    """Translate requests counted by ``/metrics`` (every status)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in _TRANSLATED.finditer(text))


def _counted_by_metrics(port: int, expected: int) -> bool:
    """Whether ``/metrics`` reaches ``expected`` (each request is counted just after its
    answer is sent, so the last ones may take a moment) and stays there."""
    deadline = time.monotonic() + 5
    while (seen := _translated(port)) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return seen == expected


def measure(workers: int, seconds: float) -> dict[str, Any]:
    """One round against a fresh server with ``workers`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = _serve(workers, Path(tmp))
        try:
            result: dict[str, Any] = {}
            sent = 0
            for name, (vectors, clients) in LOADS.items():
                request = request_bytes(_body(vectors))
                warm = asyncio.run(concurrent_clients(port, request, clients, 1.0))
                run = asyncio.run(concurrent_clients(port, request, clients, seconds))
                sent += warm["requests"] + run["requests"]
                run["vectors_per_s"] = run["requests_per_s"] * vectors
                result[name] = run
            result["metrics_counted_every_request"] = _counted_by_metrics(port, sent)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="per load and server")
    parser.add_argument(
        "--quick", action="store_true", help="1 round of 2 s, into bench/results/quick/"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
        use_results_dir(QUICK_RESULTS)
    before = machine()
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        measured = {}
        for workers in (1, 2) if i % 2 == 0 else (2, 1):  # alternate who goes first
            log(f"workers round {i + 1}/{args.rounds}: {workers} worker(s)")
            measured[f"{workers}_workers"] = measure(workers, args.seconds)
        measured["ratio_2_to_1"] = {
            name: measured["2_workers"][name]["requests_per_s"]
            / measured["1_workers"][name]["requests_per_s"]
            for name in LOADS
        }
        rounds.append(measured)
    ratios = {name: float(np.median([r["ratio_2_to_1"][name] for r in rounds])) for name in LOADS}
    result = {
        "stitch": STITCH,
        "loads": {n: {"vectors_per_request": v, "clients": c} for n, (v, c) in LOADS.items()},
        "seconds": args.seconds,
        "median_ratio_2_to_1": ratios,
        "rounds": rounds,
        "machine_before": before,
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    log("median ratio 2 workers / 1 worker: " + orjson.dumps(ratios).decode())
    log(f"wrote {write_result('workers', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
