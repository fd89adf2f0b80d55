"""A bulk translate answer that holds its share of the byte budget until the client takes it.

An answer sits in the server's memory until the client has read it. Sent whole, it went into
the transport's write buffer at once, the route's share of
``LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT`` was freed as the forward ended, and clients that never
read their answers could fill the memory past any limit (8 unread answers of 65,536 vectors:
+1.9 GB, while other requests were still admitted). :class:`HeldAnswer` sends the answer in
pieces of :data:`PIECE_BYTES`: uvicorn's flow control makes each send wait while the
transport's buffer is full (the client is not reading), so the share is held until the last
piece has been handed over. A client that takes no piece within ``timeout_s`` (the body
timeout) loses its connection and frees the share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["PIECE_BYTES", "HeldAnswer"]

logger = logging.getLogger("lead.service")

#: Bytes per send. The transport pauses the sender past its high-water mark (64 KiB), so an
#: unread answer leaves at most about one piece in the transport's buffer.
PIECE_BYTES = 1 << 20


class HeldAnswer(Response):
    """``content`` sent in pieces, each within ``timeout_s``; then ``release()``.

    Parameters
    ----------
    content : bytes or memoryview
        The whole answer.
    media_type : str
    release : callable
        Frees the request's share of the budget; called exactly once: after the last piece,
        when the client is gone, when a piece timed out, or when sending failed.
    timeout_s : float
        Seconds each piece may wait for the client to read (``LEAD_BODY_TIMEOUT_SECONDS``).
    """

    def __init__(
        self,
        content: bytes | memoryview,
        media_type: str,
        *,
        release: Callable[[], None],
        timeout_s: float,
    ) -> None:
        super().__init__(content, media_type=media_type)
        self._release: Callable[[], None] | None = release
        self._timeout_s = timeout_s

    def free(self) -> None:
        """Release the share (once; later calls do nothing)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = memoryview(self.body)
        sent = 0
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            while True:
                piece = bytes(body[sent : sent + PIECE_BYTES])
                more = sent + len(piece) < len(body)
                with anyio.fail_after(self._timeout_s):
                    await send({"type": "http.response.body", "body": piece, "more_body": more})
                sent += len(piece)
                if not more:
                    return
        except TimeoutError:
            # returning unfinished makes uvicorn close the connection
            logger.warning(
                "gave up an answer of %d bytes after %d: its client read nothing for %g s",
                len(body),
                sent,
                self._timeout_s,
            )
        finally:
            self.free()
