"""HTTP routes, one module per resource, all included by :func:`include_routers`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Security
from fastapi.routing import APIRoute

from service.auth import RouteScope, require_api_key
from service.routes import align, datasets, docs, health, info, jobs, stitches, translate
from service.schemas import error_responses
from service.settings import Scope

__all__ = ["OPEN_ROUTERS", "PROTECTED_ROUTERS", "head_routes", "include_routers", "route_scopes"]

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
    :class:`~service.auth.ApiKeyGate`, which refuses before the body is read); a GET
    route's HEAD (:func:`head_routes`) needs the same."""
    return [
        (route.path_regex, frozenset(route.methods or ()) | _head_of(route), scope)
        for scope, routers in PROTECTED_ROUTERS.items()
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute)
    ]


def _head_of(route: APIRoute) -> frozenset[str]:
    return frozenset({"HEAD"}) if "GET" in (route.methods or ()) else frozenset()


def head_routes(router: APIRouter) -> APIRouter:
    """A router answering ``HEAD`` on each path where ``router`` answers ``GET`` and
    declares no ``HEAD`` of its own: the GET endpoint with its dependencies, whose body
    uvicorn does not send (RFC 9110, section 9.3.2: a server that answers GET must answer
    HEAD; load balancers and ``curl -I`` probe with it). Not in the OpenAPI schema, whose
    operations would repeat GET's."""
    routes = [route for route in router.routes if isinstance(route, APIRoute)]
    declared = {route.path for route in routes if "HEAD" in (route.methods or ())}
    heads = APIRouter()
    for route in routes:
        if _head_of(route) and route.path not in declared:
            heads.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                include_in_schema=False,
                dependencies=route.dependencies,
                response_model=route.response_model,
                response_class=route.response_class,
                status_code=route.status_code,
            )
    return heads


def include_routers(app: FastAPI) -> None:
    """Include every router, with API-key and scope checks on the protected ones, and
    the documentation pages' static files; ``POST /v1/translate`` is served ahead of them
    all by :func:`service.routes.translate.fast_route` (the query-time hot path)."""
    app.router.routes.append(translate.fast_route())
    docs.mount_assets(app)
    for router in OPEN_ROUTERS:
        app.include_router(router)
        app.include_router(head_routes(router))
    for scope, routers in PROTECTED_ROUTERS.items():
        for router in routers:
            for included in (router, head_routes(router)):
                app.include_router(
                    included,
                    dependencies=[Security(require_api_key, scopes=[scope])],
                    responses=error_responses(401, 403),
                )
