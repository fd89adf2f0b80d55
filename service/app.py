"""The app factory: ``uvicorn service.app:create_app --factory``.

Everything is built per app (no import-time globals): settings, Prometheus registry,
concurrency limiters (translate, align) here; the stitch registry in the lifespan, which
loads the configured stitches onto the configured device (in a background thread unless
``LEAD_LOAD_IN_BACKGROUND=false``) while ``/readyz`` answers 503.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import torch
from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

import lead
from service.allocator import tune_malloc
from service.arrow_io import ARROW_STREAM
from service.auth import ApiKeyGate
from service.batcher import MicroBatcher
from service.deps import refuse_repeated_query
from service.errors import InternalErrorMiddleware, install_error_handlers
from service.event_loop import watch_requests
from service.jobs.manager import JobManager, follows_jobs
from service.limits import BodyLimitMiddleware, ConcurrencyLimiter, VectorLimit
from service.loader import configured_refs, load_stitches, resolve_device
from service.observability import Metrics, RequestContextMiddleware, configure_logging
from service.openapi import build_openapi
from service.registry import StitchRegistry
from service.routes import include_routers, route_scopes
from service.routes.translate import OPENAPI_MODELS
from service.settings import Settings
from service.startup import StartupErrorMiddleware

__all__ = ["MAX_INT_DIGITS", "create_app"]

#: The longest integer literal the service converts (CPython's smallest allowed limit).
MAX_INT_DIGITS = 640

logger = logging.getLogger("lead.service")

#: Room for multipart boundaries and headers around an uploaded dataset file.
_MULTIPART_OVERHEAD = 64 * 1024

_DESCRIPTION = """\
Translate embedding vectors from one model's space into another's through trained
stitches. Responses follow the OpenAI embeddings conventions; every error has the body
`{"error": {"type", "code", "message", "param", "request_id"}}` and every response an
`X-Request-ID` header. When API keys are configured, every route except `/healthz`,
`/readyz`, `/metrics` and the documentation (`/docs`, `/redoc`, `/openapi.json`) needs
`Authorization: Bearer <key>` (401 without a known key; "Authorize" on `/docs` takes it),
and the key's scope must cover the route (403 otherwise): `translate` keys may read (info,
stitches and their files), translate and score alignment; `admin` keys may also manage
datasets and jobs and delete stitches. Each operation names its scope in its security
requirement. On any route, a request line and headers beyond `LEAD_MAX_HEADER_BYTES` (64 KiB
by default) get 431 `headers_too_large`, ones that take longer than
`LEAD_HEADER_TIMEOUT_SECONDS` (30 s) to arrive 408 `request_timeout`, bytes that are not
an HTTP/1.1 request 400 `invalid_http`, a request with a body that asks to switch protocols
(`Connection: Upgrade`) 400 `upgrade_not_supported`, and a `Transfer-Encoding` other than
`chunked` alone 501 `unsupported_transfer_coding`; each closes the connection.
"""


def _upload_hint(settings: Settings) -> str:
    """What to do when inline pairs are over the body limit: upload them as a dataset."""
    return (
        "inline vectors this large belong in a dataset: upload the pairs first with POST "
        f"/v1/datasets (`lead datasets upload FILE`; up to {settings.max_dataset_bytes} bytes "
        f'and {settings.max_dataset_rows} pairs) and send its id as "dataset" (the body '
        "limit is LEAD_MAX_BODY_BYTES)"
    )


#: Seconds a shutdown waits for the stitch being loaded in the background.
_LOADER_JOIN_S = 30


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service.

    Parameters
    ----------
    settings : Settings, optional
        Defaults to ``Settings()``, read from ``LEAD_*`` environment variables.

    Raises
    ------
    RuntimeError
        If ``settings.device`` asks for CUDA and none is available.
    """
    settings = settings if settings is not None else Settings()
    configure_logging(settings.log_level)
    device = resolve_device(settings.device)
    dtype: torch.dtype = getattr(torch, settings.dtype)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        torch.set_num_threads(settings.torch_threads)  # process-wide: this is the server
        # Integer literals of more digits are refused as they are parsed: a 56 MB body of
        # 4,290-digit integers held the event loop for 1.3 s building them (CPython's
        # default limit is 4,300; no number of a request needs more than 40 digits)
        sys.set_int_max_str_digits(MAX_INT_DIGITS)
        if settings.tune_malloc:
            tune_malloc()  # process-wide too (service.allocator)
        metrics = app.state.metrics
        watch_requests(lambda: metrics.active)  # the loop polls only when none is in flight
        registry = StitchRegistry(device, dtype)
        refs = configured_refs(settings)
        registry.expect([ref.id for ref in refs])
        app.state.registry = registry
        logger.info("serving %d configured stitch(es) on %s (%s)", len(refs), device, dtype)
        if not refs:
            logger.warning("no stitches to serve: set LEAD_STITCHES or put stitches in models/")
        loader: threading.Thread | None = None
        if settings.load_in_background:
            loader = threading.Thread(
                target=load_stitches, args=(registry, refs), name="lead-loader", daemon=True
            )
            loader.start()
        else:
            await run_in_threadpool(load_stitches, registry, refs)
        jobs = JobManager(settings, registry) if follows_jobs(settings) else None
        if jobs is not None:
            # a translation-only replica serves what the others train, and runs no job
            await run_in_threadpool(partial(jobs.start, run_jobs=settings.enable_jobs))
            if settings.enable_jobs:
                app.state.jobs = jobs
        gc.freeze()  # the start-up's objects (see service.loader): the collector skips them
        try:
            yield
        finally:
            registry.closed.set()
            if loader is not None:
                # the stitch being loaded, then it stops: a process that exited under it
                # aborted in torch ("terminate called without an active exception")
                await run_in_threadpool(loader.join, _LOADER_JOIN_S)
                if loader.is_alive():
                    logger.warning("still loading a stitch after %d s; exiting", _LOADER_JOIN_S)
            app.state.batcher.close()
            if jobs is not None:
                await run_in_threadpool(jobs.stop)

    app = FastAPI(
        dependencies=[Depends(refuse_repeated_query)],
        title="LEAD translation service",
        version=lead.__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        # FastAPI's own /docs and /redoc load their assets from a CDN:
        # service/routes/docs.py serves them with local assets.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # /v1/jobs/ is a 404 in the error envelope, not a bare 307 to a Location built
        # from the request's Host header
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    # Small (query-time) and bulk translate requests have their own shares of the byte
    # budget, so that neither kind starves the other.
    small_share = max(1, settings.max_translate_bytes_in_flight // 8)
    budget = "LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT"  # the refusals name the setting they share
    app.state.small_limiter = ConcurrencyLimiter(
        small_share, "small translate", f"body bytes, 1/8 of {budget}"
    )
    app.state.limiter = ConcurrencyLimiter(
        max(1, settings.max_translate_bytes_in_flight - small_share),
        "translate",
        f"body bytes, 7/8 of {budget}",
    )
    app.state.batcher = MicroBatcher(
        max_vectors=settings.batch_max_vectors,
        max_wait_s=settings.batch_wait_ms / 1000,
        torch_threads=settings.torch_threads,
        metrics=app.state.metrics,
    )
    app.state.align_limiter = ConcurrencyLimiter(settings.max_concurrent_align, "align")
    install_error_handlers(app)
    include_routers(app)
    # add_middleware puts each one outermost: the request id wraps the body limit.
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_limits={"/v1/datasets": settings.max_dataset_bytes + _MULTIPART_OVERHEAD},
        body_timeout_s=settings.body_timeout_seconds,
        path_hints=dict.fromkeys(("/v1/jobs", "/v1/align"), _upload_hint(settings)),
        media_limits={("/v1/translate", ARROW_STREAM): settings.max_body_bytes_arrow},
        path_vectors={  # translate's typed decoder bounds its vectors (service.translate_body)
            "/v1/align": VectorLimit(
                2 * settings.max_align_pairs, "source", "in source and target together"
            ),
            "/v1/jobs": VectorLimit(
                2 * settings.max_inline_pairs, "source", "in source and target together"
            ),
        },
    )
    # outside the body limit: a request without a key is refused before its body is read
    app.add_middleware(ApiKeyGate, keys=settings.api_keys, routes=route_scopes())
    app.add_middleware(InternalErrorMiddleware)  # inside the request id: a 500 carries it
    app.add_middleware(RequestContextMiddleware, metrics=app.state.metrics)
    app.add_middleware(StartupErrorMiddleware)  # lifespan only: a failed start in one line
    app.openapi = lambda: build_openapi(app, OPENAPI_MODELS)  # type: ignore[method-assign]
    return app
