"""``POST /v1/align``: how well two embedding spaces align, from paired vectors.

Synchronous (no job): the body is parsed (:mod:`service.json_body`) and
:func:`lead.alignment.alignment_scores` runs in the thread pool, on
at most ``LEAD_MAX_ALIGN_PAIRS`` pairs (a seeded subset of a larger dataset). At most
``LEAD_MAX_CONCURRENT_ALIGN`` run at once (each holds n × n matrices); one more is refused
at once with 429 and ``Retry-After``, never queued.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from service.deps import AlignLimiterDep, SettingsDep, require_json
from service.jobs.deps import JobsDep, get_jobs
from service.jobs.schemas import AlignRequest, AlignResponse, job_error_responses
from service.json_body import json_body, json_request_body

__all__ = ["router"]

# the feature first: a translation-only replica answers 503, not a check of the body
router = APIRouter(tags=["align"], dependencies=[Depends(get_jobs)])


@router.post(
    "/v1/align",
    response_model=AlignResponse,
    responses=job_error_responses(400, 401, 404, 408, 413, 415, 422, 429, 503),
    dependencies=[Depends(require_json)],
    openapi_extra=json_request_body(AlignRequest),
    summary="Score the alignment of two paired embedding sets",
)
async def align(
    body: Annotated[AlignRequest, Depends(json_body(AlignRequest))],
    jobs: JobsDep,
    limiter: AlignLimiterDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Representation similarity (linear and unbiased CKA, mutual k-NN, CKNNA, cycle k-NN,
    SVCCA, PWCCA) and cross-validated ridge R² ("alignability") of the pairs.
    At most `LEAD_MAX_CONCURRENT_ALIGN` requests are computed at once; beyond it 429 with
    `Retry-After`."""
    async with limiter.slot(settings.retry_after_seconds):
        result: dict[str, Any] = await run_in_threadpool(jobs.align, body)
    return result
