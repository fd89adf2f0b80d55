"""HTTP routes, one module per resource, all included by :func:`include_routers`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI

from service.auth import require_api_key
from service.routes import align, datasets, docs, health, info, jobs, stitches, translate

__all__ = ["OPEN_ROUTERS", "PROTECTED_ROUTERS", "include_routers"]

#: Routers served without API keys (the documentation holds no secrets).
OPEN_ROUTERS: tuple[APIRouter, ...] = (health.router, docs.router)
#: Routers behind API keys (when keys are configured). Add new resources here.
PROTECTED_ROUTERS: tuple[APIRouter, ...] = (
    info.router,
    stitches.router,
    translate.router,
    jobs.router,
    datasets.router,
    align.router,
)


def include_routers(app: FastAPI) -> None:
    """Include every router, with API-key checks on the protected ones, and the
    documentation pages' static files."""
    docs.mount_assets(app)
    for router in OPEN_ROUTERS:
        app.include_router(router)
    for router in PROTECTED_ROUTERS:
        app.include_router(router, dependencies=[Depends(require_api_key)])
