"""HTTP routes, one module per resource, all included by :func:`include_routers`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Security
from fastapi.routing import APIRoute

from service.auth import RouteScope, require_api_key
from service.routes import align, datasets, docs, health, info, jobs, stitches, translate
from service.schemas import error_responses
from service.settings import Scope

__all__ = ["OPEN_ROUTERS", "PROTECTED_ROUTERS", "include_routers", "route_scopes"]

#: Routers served without API keys (the documentation holds no secrets).
OPEN_ROUTERS: tuple[APIRouter, ...] = (health.router, docs.router)
#: Routers behind API keys (when keys are configured), by the scope a key needs; an
#: ``admin`` key holds every scope. Add new resources here.
PROTECTED_ROUTERS: dict[Scope, tuple[APIRouter, ...]] = {
    "translate": (info.router, stitches.router, translate.router, align.router),
    "admin": (stitches.admin_router, jobs.router, datasets.router),
}


def route_scopes() -> list[RouteScope]:
    """Each protected route's path pattern, methods and the scope a key needs for it (for
    :class:`~service.auth.ApiKeyGate`, which refuses before the body is read)."""
    return [
        (route.path_regex, frozenset(route.methods or ()), scope)
        for scope, routers in PROTECTED_ROUTERS.items()
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute)
    ]


def include_routers(app: FastAPI) -> None:
    """Include every router, with API-key and scope checks on the protected ones, and
    the documentation pages' static files; ``POST /v1/translate`` is served ahead of them
    all by :func:`service.routes.translate.fast_route` (the query-time hot path)."""
    app.router.routes.append(translate.fast_route())
    docs.mount_assets(app)
    for router in OPEN_ROUTERS:
        app.include_router(router)
    for scope, routers in PROTECTED_ROUTERS.items():
        for router in routers:
            app.include_router(
                router,
                dependencies=[Security(require_api_key, scopes=[scope])],
                responses=error_responses(401, 403),
            )
