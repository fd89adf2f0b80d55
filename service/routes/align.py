"""``POST /v1/align``: how well two embedding spaces align, from paired vectors.

Synchronous (no job): :func:`lead.alignment.alignment_scores` runs in the thread pool, on
at most ``LEAD_MAX_ALIGN_PAIRS`` pairs (a seeded subset of a larger dataset).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from service.deps import require_json
from service.jobs.deps import JobsDep
from service.jobs.schemas import AlignRequest, AlignResponse, job_error_responses

__all__ = ["router"]

router = APIRouter(tags=["align"])


@router.post(
    "/v1/align",
    response_model=AlignResponse,
    responses=job_error_responses(400, 404, 408, 413, 415, 422),
    dependencies=[Depends(require_json)],
    summary="Score the alignment of two paired embedding sets",
)
def align(body: AlignRequest, jobs: JobsDep) -> dict[str, Any]:
    """Representation similarity (linear and unbiased CKA, mutual k-NN, CKNNA, cycle k-NN,
    SVCCA, PWCCA) and cross-validated ridge R² ("alignability") of the pairs."""
    return jobs.align(body)
