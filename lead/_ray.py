"""One check before ``ray.init`` joins a cluster: is anything listening at the address?

``ray.init(address=...)`` retries an unreachable head for minutes (deaf to SIGTERM while it
does), so both the service (``LEAD_RAY_ADDRESS``) and ``lead migrate --engine ray
--ray-address`` open one TCP connection to the head's port first.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from lead.errors import StoreError

__all__ = ["CONNECT_TIMEOUT_S", "check_ray_reachable"]

#: Seconds one connection to the Ray head may take.
CONNECT_TIMEOUT_S = 10.0


def check_ray_reachable(
    address: str, *, setting: str = "LEAD_RAY_ADDRESS", timeout: float = CONNECT_TIMEOUT_S
) -> None:
    """Fail fast when a ``host:port`` or ``ray://host:port`` address does not answer.

    ``auto`` and ``local`` are left to Ray (it fails at once when no cluster runs on this
    machine).

    Parameters
    ----------
    address : str
        What ``ray.init(address=...)`` will be given.
    setting : str, default "LEAD_RAY_ADDRESS"
        The setting or option the address came from, for the message.
    timeout : float
        Seconds the connection may take.

    Raises
    ------
    StoreError
        If the address has no port or nothing accepts a connection there within ``timeout``
        seconds (the message names the address and the reason).
    """
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        host, port = None, None
    if not host or port is None:
        raise StoreError(f"{setting} {address!r} is not auto, host:port or ray://host:port")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise StoreError(
            f"cannot reach the Ray cluster at {address} ({setting}): {reason}; is the "
            "Ray head running there?"
        ) from None
