"""Helpers shared by the service tests (wire encodings, no-network guard)."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest


def b64(rows: np.ndarray) -> list[str]:
    """Base64 strings of little-endian float32 rows."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]


def unb64(strings: list[str]) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in strings])


def embeddings(response_json: dict[str, Any]) -> np.ndarray:
    """The float embeddings of a translate response as an (n, d_tgt) float32 array."""
    return np.asarray([item["embedding"] for item in response_json["data"]], dtype=np.float32)


@contextmanager
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make every socket connect attempt fail loudly."""
    import socket

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"network access attempted: {args[1:]!r}")

    with monkeypatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        yield


def hold_one_request(
    app: Any,
    path: str,
    body: dict[str, Any],
    *,
    limiter: Any,
    release: threading.Event,
    while_held: Callable[[httpx.AsyncClient], Awaitable[None]] | None = None,
) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
    """Three POSTs of ``body`` to ``path`` on a live ``app``: the first is held in its
    slot of ``limiter`` (the test's patched handler waits for ``release``), the second is
    sent while it is held, then ``while_held(client)`` runs, ``release`` is set, and the
    third is sent once the first has answered (so it does not race the first's release).
    """

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                first = asyncio.create_task(http.post(path, json=body))
                for _ in range(500):
                    if limiter().in_flight == 1:
                        break
                    await asyncio.sleep(0.01)
                second = await http.post(path, json=body)
                if while_held is not None:
                    await while_held(http)
                release.set()
                first_response = await first
                third = await http.post(path, json=body)
                return first_response, second, third

    return asyncio.run(main())
