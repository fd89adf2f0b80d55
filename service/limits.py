"""Request limits: body bytes and body time (a pure ASGI middleware), requests in flight.

The body limit is enforced twice: on ``Content-Length`` before the app runs (413 at once),
and while the body comes in (a chunked or lying client): 413 as soon as the running total
passes the limit.

Requests (except streamed uploads) are read whole before the app runs, in one timed loop:
a body that has not arrived within ``body_timeout_s`` (a slow-loris client, or one whose
``Content-Length`` promises more than it sends) gets a 408, and the app then receives the
body as one message (no per-piece timers, no join in the app: a 2 MB translate body comes
in dozens of pieces). A client that disconnects first is passed on to the app (499).

A path and media type may have their own limit for buffered bodies (translate with an
Arrow IPC body carries more vectors than its JSON body may): ``media_limits``.

Paths with their own byte limit (dataset uploads, which stream large files to disk) are
not buffered: a wrapped ``receive`` raises :class:`~lead.errors.PayloadTooLargeError` or
:class:`~lead.errors.RequestTimeoutError` (each piece within ``body_timeout_s``) into the
app, whose error handlers answer 413 / 408. Once the body is complete, ``receive`` is no
longer timed (the app may wait on it for a disconnect).

``Content-Encoding``: a buffered body in ``gzip`` or ``deflate`` is decompressed (in a
worker thread, stopping past the same byte limit: 413) and passed on without the header;
``identity`` is passed as it is; any other coding, or a coding on a streamed upload, is a
415 that names it; bytes that do not decompress are a 400.

Vector counts: on paths whose JSON body FastAPI parses before the route runs (align,
jobs), a buffered body that certainly holds more vectors than the path's limit is a 422
before anything parses it (:func:`refuse_too_many_vectors`): a JSON parser would build one
object per item first, and 20 million empty arrays or objects take seconds and gigabytes.
The translate route reads its body itself: its typed decoder stops at the first vector
beyond the limit, and only a body that decoder refused is counted, before the plain parse
that names its problem (:mod:`service.translate_body`).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead.errors import (
    DecodeError,
    InvalidJSONError,
    LimitExceededError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
)
from service.errors import lead_error_response
from service.headers import header_list
from service.paths import route_path

__all__ = [
    "BodyLimitMiddleware",
    "ConcurrencyLimiter",
    "VectorLimit",
    "refuse_too_many_numbers",
    "refuse_too_many_vectors",
    "refuse_unless_json",
]

#: Arrays / objects / strings a body may hold besides one per vector: the outer arrays,
#: the keys and string values of the other fields, job options (a handful; generous).
_SPARE_TOKENS = 64


@dataclass(frozen=True)
class VectorLimit:
    """The most vectors a path's JSON body may carry, and how to say it."""

    vectors: int
    param: str
    what: str  # e.g. "in one request" or "in source and target together"


def refuse_too_many_vectors(body: bytes, limit: VectorLimit, hint: str | None = None) -> None:
    """Refuse, before parsing, a JSON body that cannot hold ``limit.vectors`` or fewer.

    Every float vector opens a ``[`` and every base64 vector is a string (two ``"``);
    base64 holds neither character nor ``{``. So a body with more ``[`` and ``{`` (an
    object where a vector belongs is as costly to parse as one), or more quotes, than
    the vectors and the other fields can account for holds too many items, whatever its
    layout. Counting is a C scan (milliseconds for 60 MB). A body under both counts is
    parsed and checked exactly as before.

    Raises
    ------
    LimitExceededError
        When the body certainly holds more than ``limit.vectors`` vectors (with ``hint``,
        what to do instead, appended).
    """
    most = limit.vectors + _SPARE_TOKENS
    containers = body.count(b"[") + body.count(b"{")
    quotes = body.count(b'"')
    if containers > most or quotes > 2 * most:
        refuse_unless_json(body)
        at_least = max(containers, quotes // 2) - _SPARE_TOKENS
        raise LimitExceededError(
            f"too many vectors (or nested values): the limit is {limit.vectors} vectors "
            f"{limit.what}, and the body holds at least {at_least} arrays, objects or strings "
            "beyond its other fields" + (f"; {hint}" if hint else ""),
            limit=limit.vectors,
            got=at_least,
            param=limit.param,
        )


def refuse_too_many_numbers(body: bytes, limit: VectorLimit, dim: int) -> None:
    """Refuse, before parsing, a JSON body with more numbers than ``limit.vectors`` vectors
    of ``dim`` values can hold.

    A parser builds every number before any length is checked: a 54 KB gzip body of one
    vector of 14 million numbers held the event loop for a second before its 422 (found by
    an adversarial pass). Numbers in an array are separated by commas, so a body with more
    commas than the vectors, their values and the other fields account for holds too many.
    Bodies shorter than two bytes a number (``0,``) are not counted; larger ones take one C
    scan (~25 ms for 56 MB here, the parse that it spares ~1 s).

    Raises
    ------
    InvalidJSONError
        When the body would be refused and is not JSON at all.
    LimitExceededError
        When the body certainly holds too many vectors (:func:`refuse_too_many_vectors`),
        else too many numbers.
    """
    most = limit.vectors * (dim + 1) + _SPARE_TOKENS
    if len(body) <= 2 * most:
        return
    numbers = body.count(b",") + 1
    if numbers > most:
        refuse_too_many_vectors(body, limit)  # too many vectors is the first error to name
        refuse_unless_json(body)
        raise LimitExceededError(
            f"too many numbers: {limit.vectors} vectors {limit.what} of at most {dim} values "
            f"(the largest served dimension) hold fewer than {most}, and the body holds "
            f"about {numbers}",
            limit=most,
            got=numbers,
            param=limit.param,
        )


def refuse_unless_json(body: bytes) -> None:
    """Raise :class:`~lead.errors.InvalidJSONError` unless ``body`` is one JSON value (its
    syntax checked without building it, ``msgspec.Raw``): a body refused for its size is
    first refused for not being JSON, as the parse would have. A body whose first fault is
    a ``NaN`` or ``Infinity`` token passes (not JSON, but Python's ``json.dumps`` writes
    them and the plain parse of :mod:`service.translate_body` reads them); the same letters
    inside a string do not (random base64 holds "NaN" often)."""
    try:
        msgspec.json.decode(body, type=msgspec.Raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        fault = _FAULT_AT.search(str(exc))
        if fault is not None and body.startswith((b"NaN", b"Infinity"), int(fault.group(1))):
            return
        raise InvalidJSONError(f"request body is not valid JSON: {exc}", param="body") from None


#: Where msgspec found a JSON body malformed ("... invalid character (byte 74)").
_FAULT_AT = re.compile(r"\(byte (\d+)\)")


def _too_large(limit: int, got: int, hint: str | None = None) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"request body is {got} bytes or more; the limit is {limit} bytes"
        + (f"; {hint}" if hint else ""),
        limit=limit,
        got=got,
        param="body",
    )


def _media_type(scope: Scope) -> str:
    """The request's media type: its ``Content-Type`` without parameters, lower case."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return str(value.decode("latin-1")).split(";", 1)[0].strip().lower()
    return ""


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


#: Content codings a buffered body may come in → zlib ``wbits`` that decode them.
_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _content_coding(scope: Scope) -> str | None:
    """The request's ``Content-Encoding`` (lower case), or None for none or identity."""
    codings = [
        c  # identity: no coding
        for c in header_list(scope.get("headers", ()), b"content-encoding")
        if c != "identity"
    ]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in _CODINGS:
        raise UnsupportedMediaTypeError(
            f"Content-Encoding {', '.join(codings)!s} is not supported; send the body "
            f"uncompressed or as {' or '.join(c for c in _CODINGS if c != 'x-gzip')}",
            param="Content-Encoding",
        )
    return codings[0]


#: Compressed input is fed to zlib in pieces of this size (see :func:`_decompress`).
_INFLATE_PIECE = 1 << 16
#: The most gzip members a body may hold (RFC 1952 allows several: concatenated files).
MAX_GZIP_MEMBERS = 1000


def _decompress(body: bytes, coding: str, limit: int, hint: str | None = None) -> bytes:
    """``body`` decoded from ``coding``, at most ``limit`` bytes (else 413 with ``hint``).

    A gzip body may hold several members (RFC 1952, at most :data:`MAX_GZIP_MEMBERS`),
    decoded one after another; bytes after the last member, or after deflate data, are a
    400 (not silently dropped). The input goes to zlib in pieces of 64 KiB, so that the
    rest of the body is never copied per member (zlib hands back what follows a member as
    a copy: a body of many tiny members cost time quadratic in their number). The decoded
    bytes are released before an error is raised (the error may outlive the request).
    """
    out = bytearray()
    try:
        return _inflate(memoryview(body), coding, limit, hint, out)
    except (DecodeError, PayloadTooLargeError):
        out.clear()
        raise


def _inflate(view: memoryview, coding: str, limit: int, hint: str | None, out: bytearray) -> bytes:
    wbits = _CODINGS[coding]
    decoder = zlib.decompressobj(wbits)
    pos, carried, members, started = 0, b"", 0, False
    piece: bytes | memoryview
    while True:
        if carried:
            piece, carried = carried, b""
        elif pos < len(view):
            piece, pos = view[pos : pos + _INFLATE_PIECE], pos + _INFLATE_PIECE
        else:
            break
        started = True
        try:
            out += decoder.decompress(piece, limit + 1 - len(out))
        except zlib.error as error:
            raise DecodeError(
                f"the body is not valid {coding} data: {error}", param="Content-Encoding"
            ) from None
        if len(out) > limit or decoder.unconsumed_tail:
            raise _too_large(limit, len(out), hint)
        if decoder.eof:
            members += 1
            carried = decoder.unused_data  # at most one piece
            if not carried and pos >= len(view):
                return bytes(out)
            if coding == "deflate":
                rest = len(carried) + max(len(view) - pos, 0)
                raise DecodeError(f"{rest} bytes follow the deflate data", param="Content-Encoding")
            if members >= MAX_GZIP_MEMBERS:
                raise DecodeError(
                    f"the gzip body holds more than {MAX_GZIP_MEMBERS} members",
                    param="Content-Encoding",
                )
            decoder, started = zlib.decompressobj(wbits), False
    if members and not started:
        return bytes(out)
    raise DecodeError(f"the {coding} body is truncated", param="Content-Encoding")


def _without_coding(scope: Scope, size: int) -> Scope:
    """``scope`` for the decoded body: no Content-Encoding, Content-Length its size."""
    headers = [
        (name, value)
        for name, value in scope.get("headers", ())
        if name not in (b"content-encoding", b"content-length")
    ]
    return {**scope, "headers": [*headers, (b"content-length", str(size).encode())]}


def _timed_out(seconds: float, per_piece: bool) -> RequestTimeoutError:
    what = "the next piece of the request body" if per_piece else "the request body"
    return RequestTimeoutError(
        f"{what} did not arrive within {seconds:g} seconds; send the whole body promptly",
        param="body",
    )


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_body_bytes`` with 413, and slow ones with 408.

    ``path_limits`` maps exact paths to their own limit (dataset uploads are larger than
    translate requests); on those paths ``body_timeout_s`` limits the wait for each piece of
    the body, elsewhere the time for the whole body (``math.inf``: no limit).
    ``path_hints`` maps exact paths to a sentence added to their 413 message (what to do
    instead: inline pairs too large for a job can be uploaded as a dataset).
    ``path_vectors`` maps exact paths to the vectors their JSON body may carry
    (:func:`refuse_too_many_vectors`, 422 before the app parses it).
    ``media_limits`` maps (exact path, media type) to the limit of a buffered body of that
    type on that path (instead of ``max_body_bytes``). At most ``max_inflating`` compressed
    bodies are decompressed at once (the others wait their turn).
    """

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        path_limits: dict[str, int] | None = None,
        body_timeout_s: float = math.inf,
        path_hints: dict[str, str] | None = None,
        path_vectors: dict[str, VectorLimit] | None = None,
        media_limits: dict[tuple[str, str], int] | None = None,
        max_inflating: int = 2,
    ) -> None:
        self.app = app
        # Compressed bodies are inflated this many at a time: a few KB of gzip can stand for
        # the whole body limit, and each inflated body is held until the route admits or
        # refuses it, so memory would otherwise grow with the number of such clients.
        self._inflating = anyio.Semaphore(max_inflating)
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})
        self.body_timeout_s = body_timeout_s
        self.path_hints = dict(path_hints or {})
        self.path_vectors = dict(path_vectors or {})
        self.media_limits = dict(media_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        per_piece = path in self.path_limits
        limit = self.path_limits.get(path, self.max_body_bytes)
        if self.media_limits and not per_piece:
            limit = self.media_limits.get((path, _media_type(scope)), limit)
        declared = _content_length(scope)
        try:
            coding = _content_coding(scope)
            if coding is not None and per_piece:
                raise UnsupportedMediaTypeError(
                    f"Content-Encoding {coding} is not supported for uploads to {path}; send "
                    "the file uncompressed",
                    param="Content-Encoding",
                )
        except UnsupportedMediaTypeError as exc:
            await lead_error_response(exc, scope)(scope, receive, send)
            return
        hint = self.path_hints.get(path)
        if declared is not None and declared > limit:
            response = lead_error_response(_too_large(limit, declared, hint), scope)
            await response(scope, receive, send)  # closes the connection: the body is unread
            return
        if per_piece:
            await self.app(scope, self._streaming_receive(receive, limit), send)
            return
        try:
            messages = await self._read_body(receive, limit, hint)
            # an empty body is empty in any coding: a GET (a health probe) that names one
            # is served, where decoding nothing said "the gzip body is truncated"
            if coding is not None and messages[0]["type"] == "http.request" and messages[0]["body"]:
                async with self._inflating:
                    body = await anyio.to_thread.run_sync(
                        _decompress, messages[0]["body"], coding, limit, hint
                    )
                messages = [{"type": "http.request", "body": body, "more_body": False}]
                scope = _without_coding(scope, len(body))
            vectors = self.path_vectors.get(path)
            if vectors is not None and messages[0]["type"] == "http.request":
                refuse_too_many_vectors(messages[0]["body"], vectors, hint)
        except (
            PayloadTooLargeError,
            RequestTimeoutError,
            DecodeError,
            InvalidJSONError,
            LimitExceededError,
        ) as exc:
            await lead_error_response(exc, scope)(scope, receive, send)
            return

        async def replay() -> Message:
            return messages.pop() if messages else await receive()

        await self.app(scope, replay, send)

    async def _read_body(
        self, receive: Receive, limit: int, hint: str | None = None
    ) -> list[Message]:
        """The whole body as one ``http.request`` message (or the client's disconnect),
        read within ``body_timeout_s`` and at most ``limit`` bytes."""
        chunks: list[bytes] = []
        received = 0
        try:
            with anyio.fail_after(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # http.disconnect: the app sees it
                        return [message]
                    chunk = message.get("body", b"")
                    received += len(chunk)
                    if received > limit:
                        raise _too_large(limit, received, hint)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise _timed_out(self.body_timeout_s, per_piece=False) from None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return [{"type": "http.request", "body": body, "more_body": False}]

    def _streaming_receive(self, receive: Receive, limit: int) -> Receive:
        """``receive`` for a streamed upload: each piece within ``body_timeout_s``, at most
        ``limit`` bytes in all (raising into the app, whose error handlers answer)."""
        received = 0
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                with anyio.fail_after(self.body_timeout_s):
                    message = await receive()
            except TimeoutError:
                raise _timed_out(self.body_timeout_s, per_piece=True) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit, received)
                body_done = not message.get("more_body", False)
            else:  # http.disconnect
                body_done = True
            return message

        return limited_receive


class ConcurrencyLimiter:
    """Work in flight bounded by ``limit``; a request beyond it is refused at once, never
    queued.

    Each holder weighs ``weight`` units (1 by default: ``limit`` counts requests; the
    translate route weighs its body bytes). A request is always admitted when nothing is in
    flight, so one larger than ``limit`` is served alone rather than never. ``what`` names
    the requests in the refusal (``"translate"``, ``"align"``), ``unit`` the limit. Single
    event loop only (the counters are not locked: they change between awaits).
    """

    def __init__(self, limit: int, what: str = "", unit: str = "") -> None:
        self.limit = limit
        self.what = what
        self.unit = unit
        self.in_flight = 0  # holders
        self.held = 0  # their weight

    def try_acquire(self, weight: int = 1) -> bool:
        if self.in_flight and self.held + weight > self.limit:
            return False
        self.in_flight += 1
        self.held += weight
        return True

    def release(self, weight: int = 1) -> None:
        self.in_flight -= 1
        self.held -= weight

    def acquire(self, retry_after: int = 1, weight: int = 1) -> None:
        """Hold ``weight`` until :meth:`release`; raise OverloadedError when it does not fit."""
        if not self.try_acquire(weight):
            requests = f"{self.what} requests" if self.what else "requests"
            limit = f"{self.limit} {self.unit}".rstrip()
            raise OverloadedError(
                f"too many {requests} in flight (limit {limit}); retry shortly",
                retry_after=retry_after,
            )

    @asynccontextmanager
    async def slot(self, retry_after: int = 1, weight: int = 1) -> AsyncIterator[None]:
        """Hold ``weight`` for the body of the ``async with``; raise OverloadedError when
        it does not fit."""
        self.acquire(retry_after, weight)
        try:
            yield
        finally:
            self.release(weight)
