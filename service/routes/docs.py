"""``GET /openapi.json``, ``GET /docs`` (Swagger UI), ``GET /redoc``: open, and offline.

The pages load their JavaScript, CSS and favicon from this server (``/docs-assets/``, the
files shipped by the ``fastapi-offline`` package: Swagger UI 5 and ReDoc 2), never from a
CDN, so that they work on a machine without internet access. They and the schema hold no
secrets and are served without an API key; Swagger UI's "Authorize" button takes the key
(the schema declares the bearer scheme) for "Try it out".

The app is created without FastAPI's own documentation routes; these replace them.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "OPENAPI_URL", "mount_assets", "router"]

OPENAPI_URL = "/openapi.json"
#: Where the pages' JavaScript, CSS and favicon are served.
ASSETS_URL = "/docs-assets"

router = APIRouter(include_in_schema=False)


def _assets_dir() -> Path:
    """The folder of ``swagger-ui-bundle.js``, ``swagger-ui.css``, ``redoc.standalone.js``
    and ``favicon.png`` in the installed ``fastapi-offline`` package."""
    return Path(str(files("fastapi_offline").joinpath("static")))


def mount_assets(app: FastAPI) -> None:
    """Serve the documentation pages' static files under :data:`ASSETS_URL` (no key)."""
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")


def _root(request: Request) -> str:
    root_path: str = request.scope.get("root_path", "")
    return root_path.rstrip("/")


@router.get(OPENAPI_URL)
async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=root + OPENAPI_URL,
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_redoc_html(
        openapi_url=root + OPENAPI_URL,
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )
