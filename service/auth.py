"""Optional API keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lead.errors import AuthenticationError
from service.deps import SettingsDep

__all__ = ["require_api_key"]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from LEAD_API_KEYS (only when keys are configured).",
)


def _key_matches(presented: str, keys: list[bytes]) -> bool:
    """Compare against every key, without stopping early, in constant time per key."""
    candidate = presented.encode("utf-8")
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(candidate, key)
    return matched


async def require_api_key(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Pass when no keys are configured, or the request carries one of them.

    Raises
    ------
    AuthenticationError
        If keys are configured and the bearer token is missing or wrong.
    """
    if not settings.api_keys:
        return
    if credentials is None or not credentials.credentials:
        raise AuthenticationError(
            "missing API key: send the header `Authorization: Bearer <key>`",
            param="Authorization",
        )
    keys = [key.get_secret_value().encode("utf-8") for key in settings.api_keys]
    if not _key_matches(credentials.credentials, keys):
        raise AuthenticationError("invalid API key", param="Authorization")
