"""Helpers shared by the service tests (wire encodings, no-network guard)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
