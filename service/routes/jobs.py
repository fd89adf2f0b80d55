"""Training jobs: ``POST /v1/jobs``, ``GET /v1/jobs``, ``GET /v1/jobs/{id}``,
``POST /v1/jobs/{id}/cancel``.

A job fits a stitch from paired embeddings (an uploaded dataset or inline pairs) in a
separate process, scores it on a held-out split, saves it and serves it at once. The
handlers are plain functions: FastAPI runs them in its thread pool, off the event loop; the
body too is parsed there (:mod:`service.json_body`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Response

from service.deps import one_idempotency_key, require_json
from service.jobs.deps import JobsDep, get_jobs
from service.jobs.schemas import JobCreate, JobList, JobOut, job_error_responses
from service.json_body import json_body, json_request_body

__all__ = ["router"]

# the feature first: a translation-only replica answers 503, not a check of the body
router = APIRouter(tags=["jobs"], dependencies=[Depends(get_jobs)])

Status = Literal["queued", "running", "succeeded", "failed", "cancelling", "cancelled"]


@router.post(
    "/v1/jobs",
    status_code=202,
    response_model=JobOut,
    responses=job_error_responses(400, 404, 408, 409, 413, 415, 422, 503, 507),
    dependencies=[Depends(require_json), Depends(one_idempotency_key)],
    openapi_extra=json_request_body(JobCreate),
    summary="Train a stitch (asynchronous)",
)
def create_job(
    body: Annotated[JobCreate, Depends(json_body(JobCreate))],
    jobs: JobsDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="Retrying with the same key and body returns the same job; the same "
            "key with another body is refused (422).",
        ),
    ] = None,
) -> JobOut:
    """Queue a job; answers 202 with the job and its ``Location``.

    Poll ``GET /v1/jobs/{id}`` until ``status`` is ``succeeded`` (``result.stitch_id`` is
    then served by ``POST /v1/translate``), ``failed`` (see ``error``) or ``cancelled``.
    """
    job, created = jobs.create_job(body, idempotency_key=idempotency_key)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return JobOut.from_record(job)


@router.get("/v1/jobs", response_model=JobList, responses=job_error_responses(404))
def list_jobs(
    jobs: JobsDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Jobs per page.")] = 20,
    after: Annotated[
        str | None, Query(description="A job id: list the jobs created before it.")
    ] = None,
    status: Annotated[Status | None, Query(description="Only jobs with this status.")] = None,
) -> JobList:
    """Jobs, newest first, ``limit`` at a time (pass ``after=<last_id>`` for the next page)."""
    records, has_more = jobs.store.list_jobs(limit=limit, after=after, status=status)
    data = [JobOut.from_record(r) for r in records]
    return JobList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get("/v1/jobs/{job_id}", response_model=JobOut, responses=job_error_responses(404))
def get_job(job_id: str, jobs: JobsDep) -> JobOut:
    """One job: status, progress, timestamps, scorecard, result or error."""
    return JobOut.from_record(jobs.store.get_job(job_id))


@router.post(
    "/v1/jobs/{job_id}/cancel", response_model=JobOut, responses=job_error_responses(404, 409)
)
def cancel_job(job_id: str, jobs: JobsDep) -> JobOut:
    """Cancel a queued job at once, or stop a running one (``cancelling``, then
    ``cancelled``); 409 when the job has already finished."""
    return JobOut.from_record(jobs.cancel_job(job_id))
