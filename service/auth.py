"""Optional API keys with scopes: ``Authorization: Bearer <key>``, compared in constant time.

Each protected router is included with ``Security(require_api_key, scopes=[scope])``
(:mod:`service.routes`), so the scope a route needs is written once per router and shows in
the OpenAPI schema as the operation's security requirement (``HTTPBearer: [admin]``). A
missing, malformed or unknown key is a 401 (:class:`~lead.errors.AuthenticationError`); a
known key without the scope is a 403 (:class:`~lead.errors.PermissionDeniedError`).
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from lead.errors import AuthenticationError, PermissionDeniedError
from service.deps import SettingsDep
from service.errors import lead_error_response
from service.paths import route_path
from service.settings import ApiKey

__all__ = [
    "ApiKeyGate",
    "RouteScope",
    "authenticate",
    "check_scope",
    "find_key",
    "require_api_key",
]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from LEAD_API_KEYS (only when keys are configured). Keys with "
    "the scope `translate` may read and translate; `admin` keys may do everything.",
)


def find_key(presented: str, keys: list[ApiKey]) -> ApiKey | None:
    """The configured key equal to ``presented``, if any.

    Every key is compared, without stopping at a match, each in constant time.
    """
    candidate = presented.encode("utf-8")
    found = None
    for key in keys:
        if hmac.compare_digest(candidate, key.get_secret_value().encode("utf-8")):
            found = key
    return found


def _missing_or_malformed(header: str) -> AuthenticationError:
    """Why an ``Authorization`` header holds no bearer token: no header, another scheme, or
    no key."""
    header = header.strip()
    scheme = header.split(maxsplit=1)[0] if header else ""
    if not header:
        message = "missing API key: send the header `Authorization: Bearer <key>`"
    elif scheme.lower() == "bearer":
        message = "missing API key after `Bearer`: send `Authorization: Bearer <key>`"
    else:
        message = (
            "the Authorization header does not use the Bearer scheme: "
            "use `Authorization: Bearer <key>`"
        )
    return AuthenticationError(message, param="Authorization")


async def require_api_key(
    security_scopes: SecurityScopes,
    request: Request,
    settings: SettingsDep,
    # declares the bearer scheme in the OpenAPI schema; the header is read by authenticate,
    # the one parse that ApiKeyGate applies first
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Pass when no keys are configured, or the request carries a key with every scope the
    route needs (``security_scopes``).

    Raises
    ------
    AuthenticationError
        If keys are configured and the bearer token is missing, malformed or unknown.
    PermissionDeniedError
        If the key is known but lacks a scope the route needs.
    """
    if not settings.api_keys:
        return
    key = authenticate(request.headers.getlist("authorization"), settings.api_keys)
    for scope in security_scopes.scopes:
        check_scope(key, scope, request.method, request.url.path)


def check_scope(key: ApiKey, scope: str, method: str, path: str) -> None:
    """Refuse ``key`` for a route (``method`` ``path``) that needs ``scope``.

    Raises
    ------
    PermissionDeniedError
        If the key lacks the scope.
    """
    if not key.grants(scope):
        raise PermissionDeniedError(
            f"this API key has the scope {key.scope!r}; {method} {path[:200]} needs a key "
            f"with the scope {scope!r}",
            required=scope,
            param="Authorization",
        )


def authenticate(headers: list[str], keys: list[ApiKey]) -> ApiKey:
    """The configured key that the request's ``Authorization`` headers (its values, in
    order; none: an empty list) carry.

    Raises
    ------
    AuthenticationError
        A missing or malformed header, an unknown key, or more than one header: which one
        counts is ambiguous (the first won, and a proxy that reads the last would have
        authorised another key than this server checked).
    """
    if len(headers) > 1:
        raise AuthenticationError(
            f"{len(headers)} Authorization headers: send one, `Authorization: Bearer <key>`",
            param="Authorization",
        )
    header = headers[0] if headers else None
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _missing_or_malformed(header or "")
    key = find_key(token, keys)
    if key is None:
        raise AuthenticationError("invalid API key", param="Authorization")
    return key


#: A protected route: its path pattern, methods and the scope a key needs for it.
RouteScope = tuple[re.Pattern[str], frozenset[str], str]


class ApiKeyGate:
    """Answer 401 to a request under ``prefix`` without a configured API key, and 403 to one
    whose key lacks the scope of the route it names (``routes``), before any of its body is
    read, decompressed or counted (:class:`~service.limits.BodyLimitMiddleware` sits
    inside): clients without a key got 413, 415 or 422 instead, and compressed bodies sent
    without a key, or with a ``translate`` key to admin routes, took the decompression slots
    of everyone else's (two adversarial passes). Paths are compared as the router matches
    them (:func:`service.paths.route_path`: under a root path too). The routes'
    :func:`require_api_key` checks again and documents the scopes, except ``POST
    /v1/translate``, served without dependencies: this gate is its only check. The answer
    closes the connection when a body was announced (none of it is read)."""

    def __init__(
        self,
        app: ASGIApp,
        keys: list[ApiKey],
        routes: list[RouteScope] | None = None,
        prefix: str = "/v1/",
    ) -> None:
        self.app = app
        self.keys = keys
        self.routes = list(routes or [])
        self.prefix = prefix

    def _needed(self, method: str, path: str) -> str | None:
        for pattern, methods, needed in self.routes:
            if method in methods and pattern.match(path):
                return needed
        return None  # no such route: the router answers (404 or 405)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope) if scope["type"] == "http" else ""
        if scope["type"] != "http" or not self.keys or not path.startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            key = authenticate(headers.getlist("authorization"), self.keys)
            needed = self._needed(scope["method"], path)
            if needed is not None:
                check_scope(key, needed, scope["method"], path)
        except (AuthenticationError, PermissionDeniedError) as error:
            refused = error
        else:
            await self.app(scope, receive, send)
            return
        response = lead_error_response(refused, scope)
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            response.headers["Connection"] = "close"
        await response(scope, receive, send)
