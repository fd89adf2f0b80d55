"""What idleness costs the next request: the service in process, after gaps of no work.

Standalone (no ``../shared`` needed; the bundled ``minilm-to-mpnet``, jobs off)::

    .venv/bin/python -m bench.idle            # ~1 min
    .venv/bin/python -m bench.idle --quick    # a smoke run into bench/results/quick/

The app (``service.app.create_app``) is called in process as an ASGI application, one
``http.request`` message in and the response messages collected (no socket, no second
process; ``httpx.ASGITransport`` added ~0.3 ms to ``/healthz`` and ~1.5 ms to a translate
request here), so what is measured is the server's own work. Each kind
of request is sent ``--requests`` times, each after the process slept ``gap`` ms (0: back
to back), for ``GET /healthz`` (almost no work), ``POST /v1/translate`` of one real
SciFact test query (base64, what ``bench.latency`` sends) and the stitch's bare forward
(``torch.inference_mode``, one row). Every round runs every kind at every gap, so the
ratios to gap 0 come from the same minutes of a shared, noisy machine. On a virtual
machine whose host lowers the clock or hands the core to others while it idles, the first
work after a gap runs slower, and a back-to-back benchmark does not see it: sparse traffic
does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from bench.common import QUICK_RESULTS, log, use_results_dir, write_result
from bench.data import REPO
from bench.latency import STITCH, _body, _vector

GAPS_MS = (0.0, 0.3, 1.0, 5.0)


async def _status(app: Any, method: str, path: str, body: bytes) -> int:
    """Call the ASGI ``app`` with one whole request; its response status."""
    headers = [(b"host", b"lead")]
    if body:
        headers += [(b"content-type", b"application/json")]
        headers += [(b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # no disconnect while the app answers
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(scope, receive, send)
    return status


async def _measure(gaps_ms: tuple[float, ...], n: int, rounds: int) -> dict[str, Any]:
    from lead.artifacts import load_stitch
    from service.app import create_app
    from service.settings import Settings

    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            stitches=[str(REPO / "models" / STITCH)],
            device="cpu",
            enable_jobs=False,
            load_in_background=False,
            log_level="WARNING",
            data_dir=Path(data_dir),
        )
        app = create_app(settings)
        stitch = load_stitch(REPO / "models" / STITCH).freeze()
        x = torch.from_numpy(_vector("query")[None, :].copy())
        body = _body()
        async with app.router.lifespan_context(app):

            async def healthz() -> None:
                assert await _status(app, "GET", "/healthz", b"") == 200

            async def translate() -> None:
                assert await _status(app, "POST", "/v1/translate", body) == 200

            async def forward() -> None:
                with torch.inference_mode():
                    stitch(x)

            kinds = {"healthz": healthz, "translate": translate, "forward": forward}
            times: dict[str, dict[float, list[float]]] = {
                kind: {gap: [] for gap in gaps_ms} for kind in kinds
            }
            for call in kinds.values():  # warm-up
                for _ in range(100):
                    await call()
            for i in range(rounds):
                log(f"idle round {i + 1}/{rounds}")
                for kind, call in kinds.items():
                    for gap in gaps_ms:
                        for _ in range(n):
                            if gap:
                                time.sleep(gap / 1000)  # the thread idles (not asyncio)
                            start = time.perf_counter()
                            await call()
                            times[kind][gap].append(time.perf_counter() - start)
    result: dict[str, Any] = {}
    for kind, by_gap in times.items():
        p50 = {gap: float(np.percentile(ts, 50)) * 1e6 for gap, ts in by_gap.items()}
        result[kind] = {
            f"gap_{gap:g}_ms": {
                "p50_us": p50[gap],
                "p99_us": float(np.percentile(by_gap[gap], 99)) * 1e6,
                "ratio_to_no_gap": p50[gap] / p50[gaps_ms[0]],
            }
            for gap in gaps_ms
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="per kind, gap and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help="1 round of 30, into bench/results/quick/"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests = 1, 30
        use_results_dir(QUICK_RESULTS)
    torch.set_num_threads(1)  # the service's default (LEAD_TORCH_THREADS)
    measured = asyncio.run(_measure(GAPS_MS, args.requests, args.rounds))
    result = {
        "stitch": STITCH,
        "requests_per_gap": args.requests * args.rounds,
        "cpu_count": os.cpu_count(),
        "kinds": measured,
    }
    log(orjson.dumps(measured, option=orjson.OPT_INDENT_2).decode())
    log(f"wrote {write_result('idle', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
