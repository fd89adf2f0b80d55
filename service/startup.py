"""A start-up that fails on a setting says so in one line, not a traceback.

Starlette reports an exception raised in the lifespan with its whole traceback (uvicorn
logs it, then ``Application startup failed. Exiting.``). For a :class:`lead.errors.LeadError`
(the job database cannot be reached, the Ray cluster cannot be joined, a bad stitch store)
the operator needs the sentence, not the stack: :class:`StartupErrorMiddleware` replaces the
report with ``LEAD cannot start: <message>``. Messages of these errors never hold a password
(see :mod:`service.jobs.db`). Other exceptions keep their traceback.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead.errors import LeadError

__all__ = ["StartupErrorMiddleware"]


class StartupErrorMiddleware:
    """Pure ASGI middleware that touches only the ``lifespan`` scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent below, once the exception says what failed
                return
            await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except BaseException as exc:
            if held:
                if isinstance(exc, LeadError):
                    held[0] = {**held[0], "message": f"LEAD cannot start: {exc.message}"}
                await send(held[0])
            raise
        for message in held:
            await send(message)
