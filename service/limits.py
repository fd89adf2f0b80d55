"""Request limits: body bytes (a pure ASGI middleware) and requests in flight.

The body limit is enforced twice: on ``Content-Length`` before the app runs (413 at once),
and while the body streams in (a chunked or lying client): the wrapped ``receive`` raises
:class:`~lead.errors.PayloadTooLargeError` as soon as the running total passes the limit,
which the error handlers turn into a 413.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead.errors import OverloadedError, PayloadTooLargeError
from service.errors import lead_error_response

__all__ = ["BodyLimitMiddleware", "ConcurrencyLimiter"]


def _too_large(limit: int, got: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"request body is {got} bytes or more; the limit is {limit} bytes",
        limit=limit,
        got=got,
        param="body",
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_body_bytes`` with 413.

    ``path_limits`` maps exact paths to their own limit (dataset uploads are larger than
    translate requests).
    """

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, path_limits: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope.get("path", ""), self.max_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            response = lead_error_response(_too_large(limit, declared), scope)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit, received)
            return message

        await self.app(scope, limited_receive, send)


class ConcurrencyLimiter:
    """At most ``limit`` holders at once; one more is refused at once, never queued.

    Single event loop only (the counter is not locked: it is changed between awaits).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def try_acquire(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        self.in_flight -= 1

    @asynccontextmanager
    async def slot(self, retry_after: int = 1) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``; raise OverloadedError when full."""
        if not self.try_acquire():
            raise OverloadedError(
                f"too many requests in flight (limit {self.limit}); retry shortly",
                retry_after=retry_after,
            )
        try:
            yield
        finally:
            self.release()
