"""FastAPI dependency of the jobs, datasets and align routes: the app's :class:`JobManager`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from lead.errors import FeatureDisabledError, NotReadyError
from service.jobs.manager import JobManager

__all__ = ["JobsDep", "get_jobs"]


async def get_jobs(request: Request) -> JobManager:
    """The job manager started by the lifespan (503 when jobs are off or not started)."""
    jobs: JobManager | None = getattr(request.app.state, "jobs", None)
    if jobs is None:
        settings = getattr(request.app.state, "settings", None)
        if settings is not None and not settings.enable_jobs:
            raise FeatureDisabledError(
                "training jobs, datasets and alignment are off on this server "
                "(LEAD_ENABLE_JOBS=false): send these requests to a replica that runs jobs"
            )
        raise NotReadyError("the job runner is starting")
    return jobs


JobsDep = Annotated[JobManager, Depends(get_jobs)]
