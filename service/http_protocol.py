"""The server's HTTP/1.1 protocol: uvicorn's httptools one, with a bound on a request's head.

uvicorn's httptools protocol (what ``uvicorn[standard]`` runs) keeps a request's line and
headers in memory until they are complete, whatever their size: a request with a 200 MB
``Authorization`` header raised the server's peak memory by 460 MB and was then answered
as usual, so a few such requests at once could take the whole machine's memory and the
service with it. :class:`BoundedHttpToolsProtocol` counts the bytes of each request's head
as they arrive and, beyond ``LEAD_MAX_HEADER_BYTES`` (64 KiB by default; nginx allows
4 × 8 KiB, Node.js 16 KiB), answers 431 ``headers_too_large`` in the error envelope and
closes the connection. The body has its own limits (``LEAD_MAX_BODY_BYTES``, checked by
the app).

Used through uvicorn's ``--http service.http_protocol:BoundedHttpToolsProtocol``
(``scripts/serve.sh``, the Docker image).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import error_response

__all__ = ["BoundedHttpToolsProtocol", "headers_too_large"]

logger = logging.getLogger("lead.service")


@functools.cache
def _max_header_bytes() -> int:
    """``LEAD_MAX_HEADER_BYTES``, read once per process (every connection needs it).

    Raises
    ------
    pydantic.ValidationError
        If a ``LEAD_*`` setting is invalid (``service.settings_check`` reports it first).
    """
    from service.settings import Settings

    return Settings().max_header_bytes


def headers_too_large(limit: int) -> bytes:
    """The whole HTTP response refusing a request whose head exceeds ``limit`` bytes: 431
    with the error envelope, and the connection closed."""
    message = (
        f"the request line and headers exceed {limit} bytes (LEAD_MAX_HEADER_BYTES); send "
        "large data in the body"
    )
    response = error_response(431, "invalid_request_error", "headers_too_large", message)
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(response.body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + bytes(response.body)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`, refusing
    a request whose line and headers exceed :attr:`max_header_bytes` (431, connection
    closed) before the parser holds them.

    Between the end of a request and the end of the next one's head, each read is counted
    up to the blank line that ends the head (``\\r\\n\\r\\n``, found across reads too)
    before the parser sees it; a read that would pass the limit is refused unparsed.
    Requests pipelined within one read are counted only when they span several, so a head
    in memory is at most the limit plus one read (up to 256 KiB).
    """

    #: The blank line that ends a request's head.
    END = b"\r\n\r\n"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The most bytes a request's line and headers may have.
        self.max_header_bytes = _max_header_bytes()
        self._in_head = True  # a connection starts with a request's head
        self._head_bytes = 0
        self._tail = b""  # the last bytes of the head so far: an end split between reads

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            if self.transport.is_closing():  # refused: nothing more is parsed
                return
            seen = self._tail + data
            end = seen.find(self.END)
            self._head_bytes += len(data) if end < 0 else end + len(self.END) - len(self._tail)
            self._tail = seen[-(len(self.END) - 1) :]
            if self._head_bytes > self.max_header_bytes:
                self._refuse()
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes, self._tail = True, 0, b""

    def _refuse(self) -> None:
        logger.warning(
            "refused a request from %s: its head exceeded %d bytes",
            self.client,
            self.max_header_bytes,
        )
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # no answer of an earlier request due
            self.transport.write(headers_too_large(self.max_header_bytes))
        self.transport.close()
