"""Concurrency limit: one request over the limit gets 429 with Retry-After at once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from service_helpers import b64

from service.app import create_app
from service.routing import Route
from service.settings import Settings


def test_over_the_concurrency_limit_is_429(
    fitted: Any, queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))],
        device="cpu",
        load_in_background=False,
        max_concurrent_requests=1,
        retry_after_seconds=2,
    )
    app = create_app(settings)
    release = threading.Event()
    original = Route.translate

    def slow_translate(self: Route, x: np.ndarray, *, normalize: bool = False) -> np.ndarray:
        assert release.wait(10), "the test never released the first request"
        return original(self, x, normalize=normalize)

    monkeypatch.setattr(Route, "translate", slow_translate)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:2])}

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                first = asyncio.create_task(http.post("/v1/translate", json=body))
                for _ in range(500):
                    if app.state.limiter.in_flight == 1:
                        break
                    await asyncio.sleep(0.01)
                second = await http.post("/v1/translate", json=body)
                health = await http.get("/healthz")  # the event loop is not blocked
                assert health.status_code == 200
                release.set()
                third = await http.post("/v1/translate", json=body)
                return await first, second, third

    first, second, third = asyncio.run(main())
    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    assert second.headers["retry-after"] == "2"
    assert second.json()["error"]["code"] == "overloaded"
    assert third.status_code == 200, third.text
    assert app.state.limiter.in_flight == 0
