"""The path a request names within the app, as the router matches it.

Behind a proxy that strips a prefix (``uvicorn --root-path /api``) or when the app is
mounted inside another ASGI app, ``scope["path"]`` holds the full path (``/api/v1/translate``)
and ``scope["root_path"]`` the prefix; the router matches the rest. Middlewares that look
at paths (the API-key gate, the body limits) must look at that same rest: comparing the full
path let a request without a key reach ``POST /v1/translate`` under a root path (an
adversarial pass).
"""

from __future__ import annotations

from starlette.types import Scope

__all__ = ["route_path"]


def route_path(scope: Scope) -> str:
    """``scope["path"]`` without ``scope["root_path"]`` when it starts with it (at a ``/``
    or its end), else the path itself: the rule of Starlette's router."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        rest = path[len(root) :]
        if not rest or rest.startswith("/"):
            return rest
    return path
