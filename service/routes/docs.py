"""``GET /openapi.json``, ``GET /docs`` (Swagger UI), ``GET /redoc``: behind the API keys.

The app is created without FastAPI's own documentation routes (which no dependency
protects); these serve the same pages as a protected router.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

__all__ = ["OPENAPI_URL", "router"]

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False)


@router.get(OPENAPI_URL)
async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def _schema_url(request: Request) -> str:
    root_path: str = request.scope.get("root_path", "")
    return root_path.rstrip("/") + OPENAPI_URL


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=_schema_url(request), title=f"{request.app.title} - Swagger UI"
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_schema_url(request), title=f"{request.app.title} - ReDoc")
