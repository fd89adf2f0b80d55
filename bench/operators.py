"""Torch operators per single-vector translate request: a cost that machine noise leaves alone.

On the CPU a lone vector's forward is mostly the dispatch of small operators (about 1-5
µs each, by machine) around two matrix products, so their number tracks its latency while
timings on a shared machine swing by tens of percent between runs. This counts the
top-level operators (``torch.profiler``: those not called by another) that the service
runs for one ``POST /v1/translate`` of one vector, through the app in-process: the
handler's own work (the unit-length check, the answer's ``rescaled_inputs``) included.
``bench.latency`` runs it for each server it measures::

    PYTHONPATH=<checkout> .venv/bin/python -m bench.operators models/minilm-to-mpnet query

prints the count (the mean over 10 requests after 20 warm-up ones).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
from torch.profiler import ProfilerActivity, profile

WARMUP = 20
REQUESTS = 10


async def _count(stitch_dir: Path, body: bytes) -> float:
    from service.app import create_app  # the checkout's, from PYTHONPATH
    from service.settings import Settings

    settings = Settings(
        stitches=[str(stitch_dir)], device="cpu", load_in_background=False, enable_jobs=False
    )
    app = create_app(settings)
    headers = {"content-type": "application/json"}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://lead") as client:
            for _ in range(WARMUP):
                response = await client.post("/v1/translate", content=body, headers=headers)
                assert response.status_code == 200, response.text
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                for _ in range(REQUESTS):
                    await client.post("/v1/translate", content=body, headers=headers)
    return sum(event.cpu_parent is None for event in profiler.events()) / REQUESTS


def operators_per_request(stitch_dir: Path, vector: str) -> float:
    """Top-level torch operators per single-vector request to ``stitch_dir``'s stitch,
    with the code that ``service`` and ``lead`` import as (``PYTHONPATH``)."""
    from bench.latency import _body

    return asyncio.run(_count(stitch_dir, _body(stitch_dir.name, vector)))


if __name__ == "__main__":
    print(operators_per_request(Path(sys.argv[1]).resolve(), sys.argv[2]))
