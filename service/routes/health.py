"""Liveness, readiness and Prometheus metrics (never behind API keys)."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from service.deps import MetricsDep, SettingsDep
from service.jobs.metrics import job_metrics
from service.registry import LoadFailure, StitchRegistry
from service.schemas import HealthOut, LoadFailureOut, ReadinessOut

__all__ = ["router"]

logger = logging.getLogger("lead.service")

router = APIRouter(tags=["health"])

_NOT_READY_RETRY_AFTER = "5"


@router.get("/healthz", response_model=HealthOut, summary="Liveness")
async def healthz() -> HealthOut:
    """200 while the process serves HTTP."""
    return HealthOut()


@router.get(
    "/readyz",
    response_model=ReadinessOut,
    summary="Readiness",
    responses={503: {"model": ReadinessOut, "description": "Loading, or a stitch failed."}},
)
async def readyz(request: Request) -> JSONResponse:
    """200 once every configured stitch is loaded and has passed its test vector, and
    every stitch trained by a job and published before start-up has had its first try
    (one that failed it is tried again while the server is ready, answering 503 meanwhile).

    Otherwise 503, listing the stitches still pending and those that failed (a failed
    stitch keeps the service unready until the configuration is fixed), with
    ``Retry-After`` while stitches are still loading.
    """
    registry: StitchRegistry | None = getattr(request.app.state, "registry", None)
    if registry is None:
        body = ReadinessOut(status="loading", ready=[], pending=[], failed=[])
        return JSONResponse(
            body.model_dump(), status_code=503, headers={"Retry-After": _NOT_READY_RETRY_AFTER}
        )
    state = registry.readiness()
    status: Literal["ready", "loading", "failed"] = (
        "ready" if state.is_ready else "failed" if state.failed else "loading"
    )
    body = ReadinessOut(
        status=status,
        ready=state.ready,
        pending=state.pending,
        failed=_failures_out(state.failed),
        retrying=_failures_out(state.retrying),
    )
    if state.is_ready:
        return JSONResponse(body.model_dump())
    # a stitch that failed stays failed until the configuration changes: no Retry-After
    # unless something is still loading
    final = bool(state.failed) and not state.pending and not state.loading
    headers = {} if final else {"Retry-After": _NOT_READY_RETRY_AFTER}
    return JSONResponse(body.model_dump(), status_code=503, headers=headers)


def _failures_out(failures: list[LoadFailure]) -> list[LoadFailureOut]:
    return [LoadFailureOut(id=f.id, error=f.error, message=f.message) for f in failures]


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
)
async def metrics(request: Request, metrics: MetricsDep, settings: SettingsDep) -> Response:
    """Request counts by route and status, latency histograms, vectors translated.

    With several server processes in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), the
    counts of all of them, whichever answers. Where jobs run, ``lead_jobs{status}`` and
    ``lead_jobs_restarted`` count every job of the (shared) job store.
    """
    registry: StitchRegistry | None = getattr(request.app.state, "registry", None)
    if registry is not None:
        state = registry.readiness()
        metrics.stitches.labels("ready").set(len(state.ready))
        metrics.stitches.labels("pending").set(len(state.pending))
        metrics.stitches.labels("failed").set(len(state.failed))
    body = metrics.exposition()
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is not None:
        try:
            body += job_metrics(*await run_in_threadpool(jobs.store.job_counts))
        except Exception:  # the job store unreachable: the other metrics still count
            logger.warning("/metrics: could not read the job store", exc_info=True)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
