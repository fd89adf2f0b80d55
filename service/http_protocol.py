"""The server's HTTP/1.1 protocol: uvicorn's httptools one, with a bound on a request's head.

uvicorn's httptools protocol (what ``uvicorn[standard]`` runs) keeps a request's line and
headers in memory until they are complete, whatever their size: a request with a 200 MB
``Authorization`` header raised the server's peak memory by 460 MB and was then answered
as usual, so a few such requests at once could take the whole machine's memory and the
service with it (and so could the trailer fields after a chunked body, which it holds the
same way). :class:`BoundedHttpToolsProtocol` counts those bytes as they arrive and, beyond
``LEAD_MAX_HEADER_BYTES`` (64 KiB by default; nginx allows 4 × 8 KiB, Node.js 16 KiB),
answers 431 ``headers_too_large`` in the error envelope and closes the connection. The
body has its own limits (``LEAD_MAX_BODY_BYTES``, checked by the app).

It also gives a request's head a deadline. uvicorn's protocol waits for a head as long as
its client keeps the connection open (its keep-alive timeout covers only idle connections
between requests): ten connections that had sent half a header line were all still open
100 s later, and enough of them fill the process's open files and lock every client out
(slowloris, found by an adversarial pass). Beyond ``LEAD_HEADER_TIMEOUT_SECONDS`` (30 s)
the client gets 408 ``request_timeout`` (or, having sent no request, just the close); the
time counts for a connection's first request from the connection's start, for a later one
from its first byte (or, when the server was still busy with earlier requests, from when
it is done), and blank lines between requests start it too. What follows a refused
request in the same read never reaches the app. And where the
request is not valid HTTP/1.1 (a negative ``Content-Length``, two of them, bad chunk
sizes), the 400 that uvicorn answers in plain text is the error envelope too; a
``Transfer-Encoding`` other than ``chunked`` alone, which the parser would frame as chunked
and pass on without its other codings (``gzip, chunked``: a compressed body read as
plain), gets 501 ``unsupported_transfer_coding``.

Used through uvicorn's ``--http service.http_protocol:BoundedHttpToolsProtocol``
(``scripts/serve.sh``, the Docker image).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import error_response
from service.headers import header_list

__all__ = [
    "BoundedHttpToolsProtocol",
    "head_timed_out",
    "headers_too_large",
    "invalid_http",
    "transfer_coding_not_implemented",
    "upgrade_with_body",
]

logger = logging.getLogger("lead.service")

#: How long a refused connection is drained after its 431, at most (seconds).
LINGER_S = 2.0


@functools.cache
def _head_limits() -> tuple[int, float]:
    """``LEAD_MAX_HEADER_BYTES`` and ``LEAD_HEADER_TIMEOUT_SECONDS``, read once per process
    (every connection needs them).

    Raises
    ------
    pydantic.ValidationError
        If a ``LEAD_*`` setting is invalid (``service.settings_check`` reports it first).
    """
    from service.settings import Settings

    settings = Settings()
    return settings.max_header_bytes, settings.header_timeout_seconds


def _closing_response(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole HTTP response with the error envelope that closes the connection."""
    response = error_response(status, "invalid_request_error", code, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(response.body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + bytes(response.body)


def headers_too_large(limit: int) -> bytes:
    """The whole HTTP response refusing a request whose head exceeds ``limit`` bytes: 431
    with the error envelope, and the connection closed."""
    message = (
        f"the request line and headers (or a chunked body's trailers) exceed {limit} bytes "
        "(LEAD_MAX_HEADER_BYTES); send large data in the body"
    )
    return _closing_response(431, "Request Header Fields Too Large", "headers_too_large", message)


def head_timed_out(seconds: float) -> bytes:
    """The whole HTTP response to a request whose head did not arrive within ``seconds``:
    408 with the error envelope, and the connection closed."""
    message = (
        f"the request line and headers did not arrive within {seconds:g} s "
        "(LEAD_HEADER_TIMEOUT_SECONDS)"
    )
    return _closing_response(408, "Request Timeout", "request_timeout", message)


def transfer_coding_not_implemented(codings: list[str]) -> bytes:
    """The whole HTTP response to a request whose ``Transfer-Encoding`` is not ``chunked``
    alone: 501 with the error envelope (RFC 9112, section 6.1), and the connection closed."""
    message = (
        f"Transfer-Encoding {', '.join(codings)} is not supported: send the body as it is "
        "(with Content-Length) or chunked alone; compress it with Content-Encoding gzip"
    )
    return _closing_response(501, "Not Implemented", "unsupported_transfer_coding", message)


def upgrade_with_body() -> bytes:
    """The whole HTTP response to a request that asks to upgrade the connection and has a
    body, which the parser hands over as the new protocol's bytes: 400 with the error
    envelope, and the connection closed."""
    message = (
        "this service does not switch protocols (Connection: Upgrade, Upgrade: websocket or "
        "h2c), and a request that asks to carries its body past the parser: send it without "
        "those headers (curl: --http1.1)"
    )
    return _closing_response(400, "Bad Request", "upgrade_not_supported", message)


def invalid_http() -> bytes:
    """The whole HTTP response to bytes that are not an HTTP/1.1 request: 400 with the
    error envelope, and the connection closed (what follows cannot be framed)."""
    message = (
        "the request is not valid HTTP/1.1: check its request line, its headers, its "
        "Content-Length (one, a non-negative integer) and its chunked framing"
    )
    return _closing_response(400, "Bad Request", "invalid_http", message)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's :class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`, refusing
    a request whose line and headers (or chunked trailers) exceed :attr:`max_header_bytes`
    (431, connection closed) before the parser holds them.

    What is counted is what the parser keeps outside the body:

    * the head: from the end of a request to the blank line (``\\r\\n\\r\\n``, found
      across reads too) that ends the next one's head, each read counted before the parser
      sees it, and a read that would pass the limit refused unparsed;
    * in the body: the reads that bring no body bytes (chunk framing, and after the last
      chunk the trailer fields, which the parser holds like headers), counted from the
      last body bytes.

    Requests pipelined within one read, and bytes after a body's end in the same read, are
    not counted, so what the parser holds is at most the limit plus one read (up to 256
    KiB). A refused request that follows answers still being sent waits for them: the
    connection closes after them, not in the middle of one, and only once the client has
    had the 431 (a lingering close).
    """

    #: The blank line that ends a request's head.
    END = b"\r\n\r\n"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The most bytes a request's line and headers may have, and the most seconds.
        self.max_header_bytes, self.header_timeout = _head_limits()
        self._in_head = True  # a connection starts with a request's head
        self._held = 0  # bytes counted against the limit
        self._tail = b""  # the last bytes of the head so far: an end split between reads
        self._last = b""  # the last bytes of the read being parsed
        self._body_in_read = False
        self._refused = False
        self._refusal = b""  # the response that refuses the request being read
        self._deadline: asyncio.TimerHandle | None = None  # of the head being read
        self._running: Any = None  # the cycle of the request whose app runs (or ran) last
        self._head_begun = False  # the parser has seen the first byte of that head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _start_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _busy(self) -> bool:
        """Whether the server, not the client, holds the connection up: an earlier answer
        is still being computed or sent, or reading is paused behind queued requests. The
        next head's time starts when that is done (:meth:`on_response_complete`)."""
        return not self._answered() or self.flow.read_paused

    def _head_too_slow(self) -> None:
        """The head being read did not arrive in time: 408, or a plain close when the
        connection has sent no request at all (nothing, or only blank lines)."""
        self._deadline = None
        if self._refused or self.transport.is_closing() or self._busy():
            return
        if not self._head_begun:  # not a byte of a request came
            self.transport.close()
            return
        logger.warning(
            "refused a request from %s: its head did not arrive within %g s",
            self.client,
            self.header_timeout,
        )
        self._refuse(own=False, response=head_timed_out(self.header_timeout))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser cannot take, in the error envelope."""
        if self._refused:  # already answered
            return
        cycle = self.cycle
        # the failing bytes may be the body (or trailers) of the last request begun
        own = not self._in_head and cycle is not None and not cycle.response_complete
        queued = [entry for entry in self.pipeline if own and entry[0] is cycle]
        if queued:  # that request waits behind another: it never runs, the 400 follows
            self.pipeline.remove(queued[0])
            cycle.disconnected = True
            self.cycle, own = self._running, False
        self._refuse(own=own, response=invalid_http())

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def _should_upgrade(self) -> bool:
        """Never: the service has no WebSocket route. A request asking to upgrade is
        answered as plain HTTP (in the error envelope when it is wrong); before, the
        WebSocket handshake refused it in plain text."""
        return False

    def _unsupported_upgrade_warning(self) -> None:
        """The parser stops at an upgrade request's end: its answer closes the connection
        (what the client sends after it would never be read)."""
        if not self._refused and self.cycle is not None:
            self.cycle.keep_alive = False

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client closed its sending side (a half-close): the request it sent is still
        answered, then the connection closes; an idle connection closes now. Before, the
        transport closed at once, so such a request ran (a job was created) unanswered.
        A body cut short by the half-close gets its 408 when the body time is up."""
        cycle = self.cycle
        if self._refused or cycle is None or cycle.response_complete:
            return None  # asyncio closes the transport
        cycle.keep_alive = False
        return True  # kept open for the answer; the cycle closes it after

    def data_received(self, data: bytes) -> None:
        if self._refused:  # nothing more is parsed
            return
        keep = len(self.END) - 1
        self._last = data[-keep:]
        if self._in_head:
            self._held += self._head_part(data)
            self._tail = (self._tail + self._last)[-keep:]
            if self._held > self.max_header_bytes:
                self._refuse(own=False)
                return
            super().data_received(data)
            self._after_read()
            return
        self._body_in_read = False
        super().data_received(data)
        self._after_read()
        if not (self._in_head or self._body_in_read or self._refused):
            self._held += len(data)
            if self._held > self.max_header_bytes:
                self._refuse(own=True)

    def _after_read(self) -> None:
        """Bytes that begin no request between requests (blank lines, which the parser
        skips) still end the keep-alive timer (uvicorn cancels it on every read): they
        start the head's deadline instead, or a client could hold the connection with a
        CRLF now and then."""
        idle = self.timeout_keep_alive_task is None and not self._busy()
        if idle and self._in_head and not self._refused and not self.transport.is_closing():
            self._start_deadline()

    def _head_part(self, data: bytes) -> int:
        """How many bytes of ``data`` belong to the head being read: up to its blank line
        (which may have begun in :attr:`_tail`), or all of them. Searches the read itself
        (no copy of it: a read with the head may hold 256 KiB of body)."""
        joint = (self._tail + data[: len(self.END) - 1]).find(self.END)
        if joint >= 0:
            return joint + len(self.END) - len(self._tail)
        end = data.find(self.END)
        return len(data) if end < 0 else end + len(self.END)

    # Once a request is refused the parser may still be inside the same read: what follows
    # (more pipelined requests, their bodies) is dropped, never handed to the app.

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._head_begun = True
        self._start_deadline()  # a later request's head: from its first byte

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._stop_deadline()
        self._head_begun = False
        self._in_head, self._held = False, 0
        codings = header_list(self.headers, b"transfer-encoding")
        if codings and codings != ["chunked"]:
            # the parser frames the body as chunked and drops the other codings: a
            # gzip-coded body would reach the app as if it were plain
            self._refuse(own=False, response=transfer_coding_not_implemented(codings))
            return
        if self.parser.should_upgrade() and (
            codings or header_list(self.headers, b"content-length") not in ([], ["0"])
        ):
            self._refuse(own=False, response=upgrade_with_body())
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refused:  # the rest of a refused request's read
            return
        self._body_in_read, self._held = True, 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # the rest of the read (if any) starts the next request's head
        self._in_head, self._held = True, 0
        self._tail = self._last

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused and self._answered() and not self.transport.is_closing():
            self._close_refused()
        elif self._head_begun:
            if not self._busy():  # a head begun while the server was busy: from now
                self._stop_deadline()
                self._start_deadline()
        else:
            self._stop_deadline()  # idle: uvicorn's keep-alive timeout takes over

    def _answered(self) -> bool:
        """Whether every request before the refused one has its whole answer sent."""
        return self.cycle is None or self.cycle.response_complete

    def _refuse(self, *, own: bool, response: bytes | None = None) -> None:
        """Refuse the request being read with ``response`` (431 by default): ``own`` when
        its head is complete (its trailers are too large, its body cannot be parsed) and
        its app runs, so that its cycle is :attr:`cycle`."""
        if response is None:
            logger.warning(
                "refused a request from %s: its head or trailers exceeded %d bytes",
                self.client,
                self.max_header_bytes,
            )
            response = headers_too_large(self.max_header_bytes)
        self._stop_deadline()
        self._refused, self._refusal = True, response
        if own:
            # its app is told the client is gone: nothing it sends follows the refusal
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            if self.cycle.response_started:  # the app answered before the body's end
                self.transport.close()
            else:
                self._close_refused()
        elif self._answered():
            self._close_refused()
        else:  # earlier answers are still being sent: the refusal follows them
            self.transport.pause_reading()

    def _close_refused(self) -> None:
        """Send the refusal (431, 408 or 400) and end the connection so that the client
        reads it (and any answer before it) whole: closing a socket with unread bytes
        sends a reset, which makes the client's kernel drop what it has not read yet. So
        the write side is shut (after the answer) and what the client still sends is read
        and dropped until it closes, for at most :data:`LINGER_S` seconds (nginx's
        lingering close)."""
        transport = self.transport
        transport.write(self._refusal)
        if not transport.can_write_eof():  # TLS
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()  # data_received drops it; the client's EOF closes
        self.loop.call_later(LINGER_S, transport.close)
