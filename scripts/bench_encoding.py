"""End-to-end cost of float JSON against base64 on ``POST /v1/translate`` at one batch size.

Starts a real uvicorn process on loopback serving a ridge stitch fitted from the shipped
SciFact fixture (minilm 384 → mpnet 768), then times, per call: building the request body
on the client, the HTTP round trip, and decoding the response into an ``(n, 768)`` float32
array. Usage::

    .venv/bin/python scripts/bench_encoding.py [--batch 1024] [--calls 20]
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "scifact_small.safetensors"


def _fit_stitch(folder: Path) -> None:
    from lead.artifacts import save_stitch
    from lead.fitting import fit_stitch
    from lead.stitches import StitchInfo

    data = load_file(FIXTURE)
    info = StitchInfo(source_model="minilm", target_model="mpnet")
    stitch = fit_stitch(data["minilm_corpus"], data["mpnet_corpus"], "ridge", info=info, alpha=1e-2)
    save_stitch(stitch, folder)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _float_call(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    body = orjson.dumps(
        {"stitch": "bench", "input": x, "encoding_format": "float"},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    r = http.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    r.raise_for_status()
    data = orjson.loads(r.content)["data"]
    return np.asarray([d["embedding"] for d in data], dtype=np.float32)


def _base64_call(http: httpx.Client, x: np.ndarray) -> np.ndarray:
    rows = [base64.b64encode(row.tobytes()).decode("ascii") for row in x.astype("<f4")]
    body = orjson.dumps({"stitch": "bench", "input": rows, "encoding_format": "base64"})
    r = http.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    r.raise_for_status()
    data = orjson.loads(r.content)["data"]
    raw = b"".join(base64.b64decode(d["embedding"]) for d in data)
    return np.frombuffer(raw, dtype="<f4").reshape(len(data), -1)


def _time(call: Callable[[], Any], calls: int) -> list[float]:
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    queries = load_file(FIXTURE)["minilm_queries"]
    x = np.ascontiguousarray(np.resize(queries, (args.batch, queries.shape[1])), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bench"
        _fit_stitch(folder)
        port = _free_port()
        env = {
            **os.environ,
            "LEAD_STITCHES": str(folder),
            "LEAD_DEVICE": os.environ.get("LEAD_DEVICE", "auto"),
            "LEAD_LOAD_IN_BACKGROUND": "false",
            "LEAD_MAX_VECTORS": str(max(args.batch, 2048)),
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory",
             "--port", str(port), "--log-level", "warning", "--no-access-log"],
            cwd=REPO,
            env=env,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                deadline = time.monotonic() + 120
                while True:
                    try:
                        if http.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("server did not become ready")
                    time.sleep(0.2)
                y_float = _float_call(http, x)
                y_b64 = _base64_call(http, x)
                np.testing.assert_array_equal(y_float, y_b64)
                results = {
                    "float": _time(lambda: _float_call(http, x), args.calls),
                    "base64": _time(lambda: _base64_call(http, x), args.calls),
                }
        finally:
            server.terminate()
            server.wait(timeout=30)
    medians = {name: statistics.median(t) for name, t in results.items()}
    for name, median in medians.items():
        sys.stdout.write(
            f"{name:>6}: median {median * 1e3:8.1f} ms/call, "
            f"min {min(results[name]) * 1e3:8.1f} ms, "
            f"{args.batch / median:10.0f} vectors/s (batch {args.batch}, {args.calls} calls)\n"
        )
    sys.stdout.write(f"base64 is {medians['float'] / medians['base64']:.1f}x faster end to end\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
