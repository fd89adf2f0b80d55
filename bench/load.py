"""Load test: 64 concurrent clients, 60 s of mixed traffic against the real service.

``python -m bench.load [--clients 64] [--seconds 60]`` (from the repository root) starts
the service on the bundled stitches in ``models/`` (uvicorn in a subprocess on loopback,
the default limits, jobs enabled with one worker) and runs ``--clients`` asyncio clients,
each with its own keep-alive connection, for ``--seconds``. Every client draws one request
at a time from a fixed mix (weights in :data:`MIX`):

- ``single``: one real all-MiniLM-L6-v2 vector → all-mpnet-base-v2 (float JSON), the
  retrieval-query case;
- ``batch``: 1,024 vectors as base64 (compact JSON), the bulk case;
- ``chain``: by model names with no direct stitch (e5 → mpnet goes e5 → MiniLM → mpnet);
- ``bad``: a rotating set of bad inputs (NaN, wrong dimension, bad base64, unknown stitch,
  malformed JSON, wrong content type, a job option beyond the float range, 50,000 objects
  where align vectors belong), each of which must be a 4xx;
- ``job``: a small inline ridge job (200 real pairs);
- ``read``: ``GET /v1/stitches``.

The vectors are the real embeddings in ``tests/fixtures/everyday_sentences.safetensors``
(80 sentences, tiled for the batch). Reported per kind: requests, status counts, p50 /
p99 latency; overall: 5xx count, dropped connections (transport errors) and any 4xx
that a good request got. Written to ``bench/results/load.json``. 429 answers (the
admission limit at work: 128 MiB of translate bodies in flight by default) are counted, not
errors; the
client then waits the ``Retry-After`` seconds, and the latencies leave them out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import time
from collections import Counter, defaultdict
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import load_file

from bench.common import log, machine, percentile_ms, write_result
from bench.data import REPO
from bench.server import BenchServer

#: Relative weights of the request kinds.
MIX: dict[str, int] = {"single": 50, "batch": 6, "chain": 14, "bad": 20, "job": 2, "read": 8}
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
E5 = "intfloat/multilingual-e5-small"


def _b64(rows: np.ndarray) -> list[str]:
    return [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in rows]


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def build_requests() -> dict[str, list[tuple[str, str, bytes | None, dict[str, str], bool]]]:
    """Per kind, the requests to cycle through: (method, path, body, headers, good)."""
    fx = load_file(str(REPO / "tests/fixtures/everyday_sentences.safetensors"))
    minilm, mpnet, e5 = fx["minilm"], fx["mpnet"], fx["e5"]
    js = {"Content-Type": "application/json"}
    single = [
        ("POST", "/v1/translate", _compact({"stitch": "minilm-to-mpnet", "input": [row.tolist()]}))
        for row in minilm[:16]
    ]
    tiled = np.tile(minilm, (13, 1))[:1024]
    batch = _compact(
        {"stitch": "minilm-to-mpnet", "input": _b64(tiled), "encoding_format": "base64"}
    )
    chain = _compact({"source_model": E5, "target_model": MPNET, "input": e5[:8].tolist()})
    pairs_x = np.tile(minilm, (3, 1))[:200] + np.float32(0.01) * np.random.default_rng(
        0
    ).standard_normal((200, 384)).astype(np.float32)
    pairs_y = np.tile(mpnet, (3, 1))[:200]
    job = _compact(
        {
            "source_model": MINILM,
            "target_model": MPNET,
            "source": _b64(pairs_x),
            "target": _b64(pairs_y),
            "method": "ridge",
        }
    )
    nan_row = minilm[0].tolist()
    nan_row[3] = float("nan")  # json.dumps writes the NaN token
    bad: list[tuple[str, str, bytes | None, dict[str, str], bool]] = [
        (
            "POST",
            "/v1/translate",
            _compact({"stitch": "minilm-to-mpnet", "input": [nan_row]}),
            js,
            False,
        ),
        (
            "POST",
            "/v1/translate",
            _compact({"stitch": "minilm-to-mpnet", "input": [mpnet[0].tolist()]}),
            js,
            False,
        ),
        (
            "POST",
            "/v1/translate",
            _compact({"stitch": "minilm-to-mpnet", "input": ["%%%"], "encoding_format": "base64"}),
            js,
            False,
        ),
        (
            "POST",
            "/v1/translate",
            _compact({"stitch": "no-such-stitch", "input": [minilm[0].tolist()]}),
            js,
            False,
        ),
        ("POST", "/v1/translate", b'{"stitch": "minilm-to-mpnet", "input": [[0.1, 0.2', js, False),
        ("POST", "/v1/translate", b"stitch=minilm-to-mpnet", {"Content-Type": "text/plain"}, False),
        ("POST", "/v1/translate", _compact({"stitch": "minilm-to-mpnet", "input": []}), js, False),
        # an option beyond the float range (was a 500 that dropped the connection)
        (
            "POST",
            "/v1/jobs",
            _compact({**json.loads(job), "options": {"alpha": 10**400}}),
            js,
            False,
        ),
        # 50,000 objects where vectors belong (was parsed whole before any check)
        (
            "POST",
            "/v1/align",
            b'{"target":[[1.0]],"source":[' + b",".join([b"{}"] * 50_000) + b"]}",
            js,
            False,
        ),
    ]
    return {
        "single": [(m, p, b, js, True) for m, p, b in single],
        "batch": [("POST", "/v1/translate", batch, js, True)],
        "chain": [("POST", "/v1/translate", chain, js, True)],
        "bad": bad,
        "job": [("POST", "/v1/jobs", job, js, True)],
        "read": [("GET", "/v1/stitches", None, {}, True)],
    }


async def _client(
    url: str,
    requests: dict[str, list[tuple[str, str, bytes | None, dict[str, str], bool]]],
    deadline: float,
    seed: int,
    out: dict[str, Any],
) -> None:
    rng = random.Random(seed)
    kinds, weights = list(MIX), list(MIX.values())
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            method, path, body, headers, good = rng.choice(requests[kind])
            start = time.perf_counter()
            try:
                r = await client.request(method, path, content=body, headers=headers)
            except httpx.TransportError as error:
                out["dropped"].append(f"{kind}: {type(error).__name__}: {error}")
                continue
            elapsed = time.perf_counter() - start
            out["status"][kind][r.status_code] += 1
            if r.status_code == 429:  # admission control: back off as told, as clients should
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                continue
            out["latency"][kind].append(elapsed)
            if r.status_code >= 500:
                out["server_errors"].append(f"{kind} {r.status_code}: {r.text[:300]}")
            elif good and 400 <= r.status_code < 500 and r.status_code != 429:
                out["unexpected_4xx"].append(f"{kind} {r.status_code}: {r.text[:300]}")
            elif not good and r.status_code < 400:
                out["bad_accepted"].append(f"{kind} {r.status_code}")


async def run_load(url: str, clients: int, seconds: float) -> dict[str, Any]:
    requests = build_requests()
    out: dict[str, Any] = {
        "latency": defaultdict(list),
        "status": defaultdict(Counter),
        "dropped": [],
        "server_errors": [],
        "unexpected_4xx": [],
        "bad_accepted": [],
    }
    deadline = time.monotonic() + seconds
    started = time.perf_counter()
    await asyncio.gather(*(_client(url, requests, deadline, i, out) for i in range(clients)))
    wall = time.perf_counter() - started
    kinds = {
        kind: {
            "requests": sum(out["status"][kind].values()),
            "status": {str(k): v for k, v in sorted(out["status"][kind].items())},
            "p50_ms": round(percentile_ms(out["latency"][kind], 50), 1),
            "p99_ms": round(percentile_ms(out["latency"][kind], 99), 1),
        }
        for kind in MIX
    }
    total = sum(k["requests"] for k in kinds.values())
    return {
        "clients": clients,
        "seconds": round(wall, 1),
        "requests": total,
        "requests_per_second": round(total / wall, 1),
        "server_errors": len(out["server_errors"]),
        "dropped_connections": len(out["dropped"]),
        "unexpected_4xx": len(out["unexpected_4xx"]),
        "bad_accepted": len(out["bad_accepted"]),
        "kinds": kinds,
        "examples": {
            key: out[key][:5]
            for key in ("server_errors", "dropped", "unexpected_4xx", "bad_accepted")
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    stitches = sorted(p for p in (REPO / "models").iterdir() if (p / "config.json").exists())
    # the default admission limit (the bench server raises it otherwise)
    env = {"LEAD_ENABLE_JOBS": "true", "LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT": str(128 << 20)}
    with BenchServer(stitches, max_vectors=2048, env=env) as server:
        result = asyncio.run(run_load(server.url, args.clients, args.seconds))
        health = httpx.get(f"{server.url}/healthz", timeout=5).status_code
    result["healthz_after"] = health
    result["machine"] = machine()
    path = write_result("load", result)
    log(
        f"load: {result['requests']} requests in {result['seconds']} s "
        f"({result['requests_per_second']}/s), 5xx {result['server_errors']}, dropped "
        f"{result['dropped_connections']}, good-but-4xx {result['unexpected_4xx']} → {path}"
    )
    for kind, figures in result["kinds"].items():
        log(
            f"  {kind:7s} n={figures['requests']:6d} p50 {figures['p50_ms']:8.1f} ms "
            f"p99 {figures['p99_ms']:8.1f} ms {figures['status']}"
        )
    failed = result["server_errors"] or result["dropped_connections"] or result["unexpected_4xx"]
    return 1 if failed or result["bad_accepted"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
