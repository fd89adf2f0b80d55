"""End-to-end cost of float JSON against base64 on ``POST /v1/translate`` at one batch size.

Starts a real uvicorn process on loopback serving a ridge stitch fitted from the shipped
SciFact fixture (minilm 384 → mpnet 768), then times, per call: building the request body
on the client, the HTTP round trip, and decoding the response into an ``(n, 768)`` float32
array. Usage::

    .venv/bin/python scripts/bench_encoding.py [--batch 1024] [--calls 20]

Calls of the three kinds are interleaved so that they see the same machine load; the
service's own time per call comes from its Prometheus latency histogram.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pybase64
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


def _base64_call(http: httpx.Client, x: np.ndarray, codec: Any = base64) -> np.ndarray:
    """``codec``: the standard library's ``base64`` or ``pybase64`` (same API, SIMD)."""
    text = codec.b64encode(x.astype("<f4").tobytes()).decode("ascii")  # 1536 bytes a row
    step = len(text) // len(x)
    rows = [text[i : i + step] for i in range(0, len(text), step)]
    body = orjson.dumps({"stitch": "bench", "input": rows, "encoding_format": "base64"})
    r = http.post("/v1/translate", content=body, headers={"content-type": "application/json"})
    r.raise_for_status()
    data = orjson.loads(r.content)["data"]
    # 768 float32 = 3072 bytes, a multiple of 3: the strings have no padding, so their
    # concatenation decodes in one call
    raw = codec.b64decode("".join(d["embedding"] for d in data))
    return np.frombuffer(raw, dtype="<f4").reshape(len(data), -1)


def _server_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_HISTOGRAM = re.compile(
    r'lead_http_request_duration_seconds_(sum|count)\{method="POST",route="/v1/translate"\} (\S+)'
)


def _server_seconds(http: httpx.Client) -> tuple[float, float]:
    """(total seconds, requests) of /v1/translate from the service's latency histogram."""
    found = dict(_HISTOGRAM.findall(http.get("/metrics").text))
    return float(found.get("sum", 0)), float(found.get("count", 0))


@dataclass
class Measure:
    wall: list[float]  # seconds of each call, end to end
    cpu: float = 0.0  # CPU seconds per call, client + server processes
    server: float = 0.0  # seconds per call inside the service (its latency histogram)


def _measure(
    calls: dict[str, Callable[[], Any]], repeats: int, http: httpx.Client, pid: int
) -> dict[str, Measure]:
    """Time the calls interleaved (a, b, a, b, ...) so that both see the same machine load."""
    results = {name: Measure([]) for name in calls}
    for call in calls.values():
        for _ in range(3):
            call()
    for _ in range(repeats):
        for name, call in calls.items():
            server_start = _server_seconds(http)
            cpu_start = time.process_time() + _server_cpu_seconds(pid)
            start = time.perf_counter()
            call()
            results[name].wall.append(time.perf_counter() - start)
            cpu = time.process_time() + _server_cpu_seconds(pid) - cpu_start
            results[name].cpu += cpu / repeats
            results[name].server += (_server_seconds(http)[0] - server_start[0]) / repeats
    return results


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
            [
                sys.executable,
                "-m",
                "uvicorn",
                "service.app:create_app",
                "--factory",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
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
                calls = {
                    "float": lambda: _float_call(http, x),
                    "base64": lambda: _base64_call(http, x),
                    "base64+": lambda: _base64_call(http, x, pybase64),
                }
                results = _measure(calls, args.calls, http, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    medians = {name: statistics.median(m.wall) for name, m in results.items()}
    for name, m in results.items():
        sys.stdout.write(
            f"{name:>6}: median {medians[name] * 1e3:6.1f} ms/call end to end "
            f"(min {min(m.wall) * 1e3:6.1f}; {args.batch / medians[name]:6.0f} vectors/s), "
            f"in the service {m.server * 1e3:6.1f} ms, CPU {m.cpu * 1e3:6.1f} ms "
            f"(client + server)\n"
        )
    float_ = results["float"]
    for name in ("base64", "base64+"):
        b64 = results[name]
        pair_ratio = statistics.median(f / b for f, b in zip(float_.wall, b64.wall, strict=True))
        sys.stdout.write(
            f"{name}: {medians['float'] / medians[name]:.1f}x faster end to end than float "
            f"(median of per-pair ratios {pair_ratio:.1f}x), "
            f"{float_.server / b64.server:.1f}x faster in the service, "
            f"{float_.cpu / b64.cpu:.1f}x less CPU\n"
        )
    sys.stdout.write(
        f"(batch {args.batch}, {args.calls} interleaved rounds; base64 = client with the "
        "standard library's base64, base64+ = client with pybase64)\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
