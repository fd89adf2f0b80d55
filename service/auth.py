"""Optional API keys with scopes: ``Authorization: Bearer <key>``, compared in constant time.

Each protected router is included with ``Security(require_api_key, scopes=[scope])``
(:mod:`service.routes`), so the scope a route needs is written once per router and shows in
the OpenAPI schema as the operation's security requirement (``HTTPBearer: [admin]``). A
missing, malformed or unknown key is a 401 (:class:`~lead.errors.AuthenticationError`); a
known key without the scope is a 403 (:class:`~lead.errors.PermissionDeniedError`).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer, SecurityScopes
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from lead.errors import AuthenticationError, PermissionDeniedError
from service.deps import SettingsDep
from service.errors import lead_error_response
from service.settings import ApiKey

__all__ = ["ApiKeyGate", "find_key", "refusal", "require_api_key"]

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
    if credentials is None or not credentials.credentials:
        raise _missing_or_malformed(request.headers.get("authorization", ""))
    key = find_key(credentials.credentials, settings.api_keys)
    if key is None:
        raise AuthenticationError("invalid API key", param="Authorization")
    for scope in security_scopes.scopes:
        if not key.grants(scope):
            raise PermissionDeniedError(
                f"this API key has the scope {key.scope!r}; {request.method} "
                f"{request.url.path[:200]} needs a key with the scope {scope!r}",
                required=scope,
                param="Authorization",
            )


def refusal(header: str | None, keys: list[ApiKey]) -> AuthenticationError | None:
    """Why a request with this ``Authorization`` header (None: none) is refused, when
    ``keys`` are configured; None when it carries one of them (scopes are the routes')."""
    if not keys:
        return None
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return _missing_or_malformed(header or "")
    if find_key(token, keys) is None:
        return AuthenticationError("invalid API key", param="Authorization")
    return None


class ApiKeyGate:
    """Answer 401 to a request under ``prefix`` without a configured API key before any of
    its body is read, decompressed or counted (:class:`~service.limits.BodyLimitMiddleware`
    sits inside): clients without a key got 413, 415 or 422 instead, and their compressed
    bodies took the decompression slots of everyone else's (an adversarial pass). The
    routes' :func:`require_api_key` still checks the key's scope (403) and documents it.
    The answer closes the connection when a body was announced (none of it is read)."""

    def __init__(self, app: ASGIApp, keys: list[ApiKey], prefix: str = "/v1/") -> None:
        self.app = app
        self.keys = keys
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        error = refusal(headers.get("authorization"), self.keys)
        if error is None:
            await self.app(scope, receive, send)
            return
        response = lead_error_response(error, scope)
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            response.headers["Connection"] = "close"
        await response(scope, receive, send)
