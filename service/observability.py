"""Request ids and Prometheus metrics, on a per-app :class:`CollectorRegistry`.

:class:`RequestContextMiddleware` is a pure ASGI middleware: it gives every HTTP request
an id (an incoming ``X-Request-ID`` when it looks sane, else a fresh one), echoes it in
the response headers, and records the request count and latency by route template
(``/v1/stitches/{stitch_id:path}``, never the raw path, so label sets stay bounded).

With several server processes (``uvicorn --workers``), each keeps its own counters. When
``PROMETHEUS_MULTIPROC_DIR`` names a folder (``scripts/serve.sh`` makes a fresh one for
``LEAD_WORKERS`` > 1), prometheus_client's multiprocess mode is on: every process writes its
values to files there, and :meth:`Metrics.exposition` aggregates all of them, whichever
process answers the scrape. The variable must be set before the process starts (the client
picks its value store when it is imported), and the folder must be emptied between runs.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric
from starlette.datastructures import MutableHeaders
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import REQUEST_ID_SCOPE_KEY

__all__ = [
    "Metrics",
    "RequestContextMiddleware",
    "configure_logging",
    "multiprocess_dir",
    "new_request_id",
]

_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> Path | None:
    """The folder of prometheus_client's multiprocess mode, or None when it is off.

    Returns
    -------
    Path or None
        ``PROMETHEUS_MULTIPROC_DIR`` when set, else None.

    Raises
    ------
    RuntimeError
        When the variable is empty or names no existing folder, or was set after
        prometheus_client was imported (its values would stay in memory, invisible to the
        other processes).
    """
    value = os.environ.get(_MULTIPROC_ENV)
    if value is None:
        return None
    folder = Path(value)
    if not value or not folder.is_dir():  # prometheus_client would write to the CWD for ""
        raise RuntimeError(f"{_MULTIPROC_ENV}={value!r} is not a folder: create it (empty) first")
    if values.ValueClass is values.MutexValue:
        raise RuntimeError(
            f"{_MULTIPROC_ENV} was set after prometheus_client was imported: set it in the "
            "environment of the server process (as scripts/serve.sh does), not from Python"
        )
    return folder


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by uvicorn, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # not Linux, or gone since
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _forget_dead_processes(folder: Path) -> None:
    """Drop the ``live*`` gauge files of processes that are gone (a worker that crashed or
    that uvicorn replaced), as a server's child-exit hook would: uvicorn has none."""
    for path in folder.glob("gauge_live*_*.db"):
        pid = path.stem.rsplit("_", 1)[1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), str(folder))  # type: ignore[no-untyped-call]


class _WorkerFiles:
    """prometheus_client's multiprocess merge of the worker files in ``folder``, less a
    file that a worker has created but not yet sized (0 bytes for a moment, for good if the
    worker died then) or that is gone: either made the merge raise, a 500 on ``/metrics``
    (prometheus/client_python#1199, open; seen once in CI as ``struct.error``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        merge = multiprocess.MultiProcessCollector.merge
        for attempt in range(3):
            files = [str(path) for path in sorted(self.folder.glob("*.db")) if _has_data(path)]
            try:
                merged: Iterable[Metric] = merge(files)  # type: ignore[no-untyped-call]
                return merged
            except FileNotFoundError:  # a dead worker's gauges, removed by another worker
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _has_data(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


@dataclass
class Metrics:
    """The service's Prometheus metrics, registered on their own registry.

    In multiprocess mode (see :func:`multiprocess_dir`) the values also go to the shared
    folder, and :meth:`exposition` reads every process's files instead of ``registry``.
    """

    registry: CollectorRegistry = field(
        default_factory=lambda: CollectorRegistry(auto_describe=True)
    )
    multiprocess_dir: Path | None = field(default_factory=multiprocess_dir)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "lead_http_requests_total",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.latency = Histogram(
            "lead_http_request_duration_seconds",
            "Time from receiving a request to sending its last byte.",
            ("route", "method"),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        #: Requests being handled now, as a plain number (read by the event loop's poll).
        self.active = 0
        self.in_flight = Gauge(
            "lead_http_requests_in_flight",
            "HTTP requests being handled.",
            registry=self.registry,
            multiprocess_mode="livesum",  # the sum over the processes alive
        )
        self.vectors = Counter(
            "lead_vectors_translated_total",
            "Vectors translated, by stitch id (each stitch of a chain counts).",
            ("stitch",),
            registry=self.registry,
        )
        self.batch_vectors = Histogram(
            "lead_microbatch_vectors",
            "Vectors per forward run by the micro-batcher (small requests; one larger than "
            "batch_max_vectors runs as its own forward).",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "lead_microbatch_requests",
            "Requests sharing one forward of the micro-batcher.",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.stitches = Gauge(
            "lead_stitches",
            "Configured stitches by state.",
            ("state",),
            registry=self.registry,
            # set at each scrape by the process answering: its view, the freshest one
            multiprocess_mode="livemostrecent",
        )

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format: this registry's, or in multiprocess mode
        the sum over every process that wrote to the folder (counters and histograms of
        processes that have exited included; gauges of live processes only).

        Returns
        -------
        bytes
            The text exposition format (``prometheus_client.CONTENT_TYPE_LATEST``).
        """
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        _forget_dead_processes(self.multiprocess_dir)
        registry = CollectorRegistry()
        registry.register(_WorkerFiles(self.multiprocess_dir))
        return generate_latest(registry)


def new_request_id() -> str:
    return uuid.uuid4().hex


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _SANE_REQUEST_ID.match(text) else None
    return None


def _match_route(routes: Any, scope: Scope) -> Any:
    """The route that routing would pick for ``scope`` (a full match, else a method-only
    mismatch), looking into included routers (FastAPI keeps them as nested routers)."""
    partial = None
    for candidate in routes:
        nested = getattr(candidate, "original_router", None)
        if nested is not None:
            found = _match_route(nested.routes, scope)
        elif isinstance(getattr(candidate, "path", None), str):
            match, _ = candidate.matches(scope)
            found = candidate if match != Match.NONE else None
            if match == Match.PARTIAL:
                partial, found = partial or candidate, None
        else:
            found = None
        if found is not None:
            return found
    return partial


def _route_label(scope: Scope) -> str:
    """The route template of the request; matched here when a middleware answered before
    routing (a 413 on ``Content-Length``), so that a route's errors share one label."""
    route = scope.get("route")
    if route is None:
        router = getattr(scope.get("app"), "router", None)
        route = _match_route(getattr(router, "routes", ()), scope)
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestContextMiddleware:
    """Request id + request metrics for every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_request_id(scope) or new_request_id()
        scope[REQUEST_ID_SCOPE_KEY] = request_id
        status = 500
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("X-Request-ID", request_id)
            await send(message)

        self.metrics.in_flight.inc()
        self.metrics.active += 1
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.active -= 1
            self.metrics.in_flight.dec()
            route = _route_label(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.latency.labels(route, method).observe(time.perf_counter() - start)


def configure_logging(level: str) -> None:
    """Set the ``lead`` loggers' level; give them a stderr handler when nothing else logs.

    Uvicorn configures only its own loggers, so without this the start-up report (which
    stitches loaded, which failed) would show warnings and errors only.
    """
    logger = logging.getLogger("lead")
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s - %(message)s"))
        logger.addHandler(handler)
