"""Query-time latency: single-vector translate requests, one client and 64 at once.

Standalone (no ``../shared`` needed; the bundled stitches, default limits, jobs off)::

    .venv/bin/python -m bench.latency                  # this checkout only
    .venv/bin/python -m bench.latency --baseline 5359b85   # and a git revision, side by side
    .venv/bin/python -m bench.latency --quick      # a smoke run into bench/results/quick/

With ``--baseline`` the revision's ``service/`` and ``lead/`` are exported (``git
archive``) and both servers are measured in alternating rounds in one run, so that the
ratios hold on a shared, noisy machine. Each round, against a fresh uvicorn process:

* **one client**, back to back, base64 single vectors of ``minilm-to-mpnet`` (the bundled
  gated stitch; ``--stitch FOLDER``, repeatable, serves others side by side), a real SciFact
  test query (``--vector gaussian``: an out-of-distribution one instead): p50 / p99
  and requests/s, with a lean keep-alive socket client (what a compiled client adds:
  microseconds) and with ``httpx.Client`` (what a Python client adds: ~0.3-0.4 ms per
  call); for the socket client also the server process's CPU time per request (from
  ``/proc``), which moves less than latency when other work shares the machine;
* **torch operators per request** (:mod:`bench.operators`, once per server): what a lone
  vector's forward mostly costs on the CPU, and a count that machine noise leaves alone;
* **64 concurrent clients** (one asyncio process, a keep-alive connection each, each
  sending its next request when the previous answered): total requests/s, p50 / p99, the
  statuses (429s counted: the default admission limits apply), and the ratio of their
  total throughput to one client's in the same round.

Every answer is checked: status 200, and (first request of each client kind) the bytes
equal to an in-process translation when the server is this checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from safetensors.numpy import load_file

from bench.common import QUICK_RESULTS, log, use_results_dir, write_result
from bench.data import REPO
from bench.server import cpu_seconds

STITCH = "minilm-to-mpnet"
WARMUP = 200


def _vector(kind: str) -> np.ndarray:
    """The 384-d unit vector every request sends: a real all-MiniLM-L6-v2 SciFact test
    query (``query``: not in any bundled stitch's training data, what a retrieval system
    sends) or a seeded Gaussian one (``gaussian``: out of distribution, so a gated stitch
    runs its memory search and its MLP)."""
    if kind == "query":
        queries = load_file(str(REPO / "tests" / "fixtures" / "scifact_small.safetensors"))
        vector = queries["minilm_queries"][0].astype("<f4")
    else:
        vector = np.random.default_rng(0).standard_normal(384).astype("<f4")
    return vector / np.linalg.norm(vector)


def _body(stitch: str = STITCH, kind: str = "query") -> bytes:
    vector = _vector(kind)
    payload = {"stitch": stitch, "input": [base64.b64encode(vector.tobytes()).decode()]}
    return orjson.dumps({**payload, "encoding_format": "base64"})


def request_bytes(body: bytes) -> bytes:
    """A whole ``POST /v1/translate`` HTTP/1.1 request (JSON ``body``), ready for a socket."""
    head = (
        "POST /v1/translate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _split_response(buffer: bytes) -> tuple[int, bytes, bytes] | None:
    """(status, body, rest) of the first whole response in ``buffer``, else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end].split(b"\r\n")
    length = next(int(h.split(b":")[1]) for h in head if h.lower().startswith(b"content-length"))
    if len(buffer) < end + 4 + length:
        return None
    body = buffer[end + 4 : end + 4 + length]
    return int(head[0].split(b" ")[1]), body, buffer[end + 4 + length :]


def _summary(latencies: list[float], wall: float, statuses: dict[int, int]) -> dict[str, Any]:
    ms = np.asarray(latencies) * 1000
    return {
        "requests": len(ms),
        "requests_per_s": len(ms) / wall,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def one_client_socket(port: int, request: bytes, n: int) -> tuple[dict[str, Any], bytes]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer, latencies, statuses, first = b"", [], {}, b""
        start_all = 0.0
        for i in range(WARMUP + n):
            if i == WARMUP:
                start_all = time.perf_counter()
            start = time.perf_counter()
            sock.sendall(request)
            while (parsed := _split_response(buffer)) is None:
                buffer += sock.recv(1 << 16)
            status, body, buffer = parsed
            if i >= WARMUP:
                latencies.append(time.perf_counter() - start)
                statuses[status] = statuses.get(status, 0) + 1
            first = first or body
        return _summary(latencies, time.perf_counter() - start_all, statuses), first


def one_client_httpx(port: int, body: bytes, n: int) -> dict[str, Any]:
    latencies, statuses = [], {}
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for i in range(WARMUP + n):
            if i == WARMUP:
                start_all = time.perf_counter()
            start = time.perf_counter()
            status = client.post("/v1/translate", content=body, headers=headers).status_code
            if i >= WARMUP:
                latencies.append(time.perf_counter() - start)
                statuses[status] = statuses.get(status, 0) + 1
    return _summary(latencies, time.perf_counter() - start_all, statuses)


async def concurrent_clients(
    port: int, request: bytes, clients: int, seconds: float
) -> dict[str, Any]:
    """``clients`` keep-alive connections, each sending ``request`` again as soon as the
    previous one is answered, for ``seconds``: requests, requests/s, p50 / p99 ms, statuses."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    stop = time.perf_counter() + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        buffer = b""
        while time.perf_counter() < stop:
            start = time.perf_counter()
            writer.write(request)
            while (parsed := _split_response(buffer)) is None:
                buffer += await reader.read(1 << 16)
            status, _, buffer = parsed
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return _summary(latencies, time.perf_counter() - start, statuses)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(root: Path, data_dir: Path, stitch_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "LEAD_STITCHES": orjson.dumps([str(stitch_dir)]).decode(),
        "LEAD_DEVICE": "cpu",
        "LEAD_ENABLE_JOBS": "false",
        "LEAD_LOAD_IN_BACKGROUND": "false",
        "LEAD_LOG_LEVEL": "WARNING",
        "LEAD_DATA_DIR": str(data_dir),
    }
    command = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
    command += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    if (root / "service" / "event_loop.py").is_file():  # as scripts/serve.sh runs it
        command += ["--loop", "service.event_loop:new_event_loop"]
    if (root / "service" / "http_protocol.py").is_file():
        command += ["--http", "service.http_protocol:BoundedHttpToolsProtocol"]
    proc = subprocess.Popen(command, cwd=root, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server in {root} was not ready in 120 s")


def measure(
    root: Path,
    n: int,
    seconds: float,
    clients: int,
    stitch_dir: Path = REPO / "models" / STITCH,
    vector: str = "query",
) -> dict[str, Any]:
    """One round against a fresh server running the code under ``root`` and serving the
    stitch in ``stitch_dir`` (384-d inputs), every request sending ``vector``
    (:func:`_vector`)."""
    body = _body(stitch_dir.name, vector)
    request = request_bytes(body)
    with tempfile.TemporaryDirectory() as data_dir:
        proc, port = _serve(root, Path(data_dir), stitch_dir)
        try:
            cpu = cpu_seconds(proc.pid)
            socket_one, answer = one_client_socket(port, request, n)
            # the server's CPU per request: steadier than latency on a shared machine
            cpu = cpu_seconds(proc.pid) - cpu
            socket_one["server_cpu_ms_per_request"] = 1000 * cpu / (WARMUP + n)
            httpx_one = one_client_httpx(port, body, n)
            many = asyncio.run(concurrent_clients(port, request, clients, seconds))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    many["ratio_to_one_client"] = many["requests_per_s"] / socket_one["requests_per_s"]
    return {
        "one_client_socket": socket_one,
        "one_client_httpx": httpx_one,
        f"{clients}_clients": many,
        "answer": orjson.loads(answer)["data"][0]["embedding"],
    }


def operators(root: Path, stitch_dir: Path, vector: str) -> float:
    """Torch operators per single-vector request with the code under ``root``
    (:mod:`bench.operators`, in a fresh process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}
    command = [sys.executable, "-m", "bench.operators", str(stitch_dir), vector]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def _export(revision: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", revision, "service", "lead"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--baseline", help="a git revision to measure side by side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3000, help="per one-client run")
    parser.add_argument("--seconds", type=float, default=8.0, help="of the concurrent run")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--stitch",
        action="append",
        type=Path,
        metavar="FOLDER",
        help="a stitch folder of 384-d inputs to serve (repeatable: measured side by side in "
        "each round, by folder name); default: the bundled models/minilm-to-mpnet",
    )
    parser.add_argument(
        "--vector",
        choices=("query", "gaussian"),
        default="query",
        help="what each request sends: a real SciFact test query (default) or a Gaussian "
        "vector (out of distribution: a gated stitch's slow path)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round, 500 requests, 3 s, written to bench/results/quick/ (not committed)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.seconds = 1, 500, 3.0
        use_results_dir(QUICK_RESULTS)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"this checkout": REPO}
        if args.baseline:
            roots[f"baseline {args.baseline}"] = _export(args.baseline, Path(tmp))
        stitches = [p.resolve() for p in args.stitch or [REPO / "models" / STITCH]]
        runs = {
            name if len(stitches) == 1 else f"{name}: {folder.name}": (root, folder)
            for name, root in roots.items()
            for folder in stitches
        }
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
        counted = {
            name: operators(root, folder, args.vector) for name, (root, folder) in runs.items()
        }
        for i in range(args.rounds):
            for name, (root, folder) in runs.items():
                log(f"latency round {i + 1}/{args.rounds}: {name}")
                rounds[name].append(
                    measure(root, args.requests, args.seconds, args.clients, folder, args.vector)
                )
    result: dict[str, Any] = {
        "stitch": ", ".join(folder.name for folder in stitches),
        "vector": args.vector,
        "clients": args.clients,
        "servers": {},
    }
    for name, measured in rounds.items():
        answers = {m.pop("answer") for m in measured}
        summary = {
            kind: {
                key: float(np.median([m[kind][key] for m in measured]))
                for key in measured[0][kind]
                if key != "statuses"
            }
            | {"statuses": [m[kind]["statuses"] for m in measured]}
            for kind in measured[0]
        }
        result["servers"][name] = {"median_of_rounds": summary, "rounds": measured}
        result["servers"][name]["torch_operators_per_request"] = counted[name]
        result["servers"][name]["same_answer_every_round"] = len(answers) == 1
        log(f"{name}: " + orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    path = write_result("latency", result)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
