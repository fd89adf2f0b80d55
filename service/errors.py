"""The one place that maps exceptions to HTTP statuses, and the error envelope.

Every error response, FastAPI's own 404/405/422 included, has the body::

    {"error": {"type": ..., "code": ..., "message": ..., "param": ..., "request_id": ...}}

:data:`ERROR_TABLE` maps each :class:`lead.errors.LeadError` class to a status, an
OpenAI-style ``type`` and a ``code``; a class not listed uses its nearest listed base
class. Anything else is a 500 whose message never shows internals (the traceback is
logged with the request id). A client that went away before its request was read
(:class:`starlette.requests.ClientDisconnect`) is no error of the service: it is logged at
debug level and counted with the status 499 ("client closed request"), never as a 500.
"""

from __future__ import annotations

import difflib
import errno
import logging
import re
import sqlite3
from collections.abc import Iterable
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lead import errors as le
from lead._options import cut, echo
from service.paths import route_path

__all__ = [
    "CLIENT_CLOSED_STATUS",
    "ERROR_TABLE",
    "REQUEST_ID_SCOPE_KEY",
    "ErrorKind",
    "InternalErrorMiddleware",
    "echo",
    "error_response",
    "install_error_handlers",
    "lead_error_response",
    "request_id_of",
    "suggest_fields",
]

logger = logging.getLogger("lead.service")

#: Where the request-id middleware stores the id of the request in the ASGI scope.
REQUEST_ID_SCOPE_KEY = "lead.request_id"

#: Status recorded for a request whose client disconnected before it was answered (nginx's
#: "client closed request"); the client never sees it.
CLIENT_CLOSED_STATUS = 499


class ErrorKind(NamedTuple):
    status: int
    type: str
    code: str


_INVALID = "invalid_request_error"

#: Exception class → (HTTP status, error type, error code). Most specific first is not
#: needed: the lookup walks each exception's MRO.
ERROR_TABLE: dict[type[le.LeadError], ErrorKind] = {
    le.LeadError: ErrorKind(400, _INVALID, "invalid_request"),
    le.InvalidInputError: ErrorKind(400, _INVALID, "invalid_input"),
    le.DecodeError: ErrorKind(400, _INVALID, "decode_error"),
    le.InvalidJSONError: ErrorKind(400, _INVALID, "invalid_json"),
    le.NotInvertibleError: ErrorKind(422, _INVALID, "not_invertible"),
    le.NoConfidenceError: ErrorKind(422, _INVALID, "no_confidence"),
    le.ModelMismatchError: ErrorKind(422, _INVALID, "model_mismatch"),
    le.ShapeMismatchError: ErrorKind(422, _INVALID, "shape_mismatch"),
    le.NonFiniteError: ErrorKind(422, _INVALID, "non_finite_input"),
    le.ZeroVectorError: ErrorKind(422, _INVALID, "zero_vector"),
    le.IllConditionedError: ErrorKind(422, _INVALID, "ill_conditioned_input"),
    le.TooFewPairsError: ErrorKind(422, _INVALID, "too_few_pairs"),
    le.LimitExceededError: ErrorKind(422, _INVALID, "limit_exceeded"),
    le.PayloadTooLargeError: ErrorKind(413, _INVALID, "payload_too_large"),
    le.UnsupportedMediaTypeError: ErrorKind(415, _INVALID, "unsupported_media_type"),
    le.RequestTimeoutError: ErrorKind(408, _INVALID, "request_timeout"),
    le.StitchFormatError: ErrorKind(422, _INVALID, "stitch_format_error"),
    le.NotFoundError: ErrorKind(404, "not_found_error", "not_found"),
    le.StitchNotFoundError: ErrorKind(404, "not_found_error", "stitch_not_found"),
    le.JobNotFoundError: ErrorKind(404, "not_found_error", "job_not_found"),
    le.DatasetNotFoundError: ErrorKind(404, "not_found_error", "dataset_not_found"),
    le.StoreNotFoundError: ErrorKind(404, "not_found_error", "store_not_found"),
    le.FitError: ErrorKind(422, _INVALID, "fit_failed"),
    le.NonFiniteOutputError: ErrorKind(422, _INVALID, "non_finite_output"),
    le.AuthenticationError: ErrorKind(401, "authentication_error", "invalid_api_key"),
    le.PermissionDeniedError: ErrorKind(403, "permission_error", "insufficient_scope"),
    le.ConflictError: ErrorKind(409, _INVALID, "conflict"),
    le.IdempotencyKeyReusedError: ErrorKind(422, _INVALID, "idempotency_key_reused"),
    le.OverloadedError: ErrorKind(429, "rate_limit_error", "overloaded"),
    le.NotReadyError: ErrorKind(503, "service_unavailable_error", "not_ready"),
    le.FeatureDisabledError: ErrorKind(503, "service_unavailable_error", "feature_disabled"),
    le.JobCancelledError: ErrorKind(409, _INVALID, "job_cancelled"),
    le.HubError: ErrorKind(502, "server_error", "hub_error"),
    le.StoreError: ErrorKind(502, "server_error", "store_error"),
    le.StorageFullError: ErrorKind(507, "server_error", "insufficient_storage"),
}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "overloaded",
}


def kind_of(exc: le.LeadError) -> ErrorKind:
    """The table entry of the nearest listed class in ``type(exc)``'s MRO."""
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    return ERROR_TABLE[le.LeadError]


def request_id_of(scope: Scope) -> str | None:
    """The request id the request-id middleware gave this request, if any."""
    value = scope.get(REQUEST_ID_SCOPE_KEY)
    return value if isinstance(value, str) else None


def error_response(
    status: int,
    type_: str,
    code: str,
    message: str,
    *,
    param: str | None = None,
    request_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A response with the error envelope."""
    body = {
        "error": {
            "type": type_,
            "code": code,
            "message": message,
            "param": param,
            "request_id": request_id,
        }
    }
    all_headers = dict(headers or {})
    if request_id:
        all_headers["X-Request-ID"] = request_id
    return JSONResponse(body, status_code=status, headers=all_headers)


def suggest_fields(errors: Iterable[dict[str, Any]], fields: Iterable[str]) -> list[dict[str, Any]]:
    """``errors`` (pydantic's), each unknown top-level field's message naming the closest of
    ``fields`` (``normalise`` was "Extra inputs are not permitted", with no hint, while a
    mistyped query parameter already named the right one), those errors first."""
    known = sorted(fields)
    hinted, rest = [], []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        close = []
        if error.get("type") == "extra_forbidden" and len(loc) == 2:
            close = difflib.get_close_matches(str(loc[1]), known, n=1)
        if close:
            message = f"Extra inputs are not permitted; did you mean {close[0]!r}?"
            hinted.append({**error, "msg": message})
        else:
            rest.append(error)
    return hinted + rest  # a mistyped field first: it explains the missing one


def lead_error_response(exc: le.LeadError, scope: Scope) -> JSONResponse:
    """Map a :class:`~lead.errors.LeadError` to its status, type, code and headers."""
    kind = kind_of(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, le.AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, le.PermissionDeniedError) and exc.required:  # RFC 6750, section 3
        headers["WWW-Authenticate"] = f'Bearer error="insufficient_scope", scope="{exc.required}"'
    if isinstance(exc, le.OverloadedError | le.NotReadyError):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, le.PayloadTooLargeError | le.RequestTimeoutError):
        # the rest of the body is not read: it must not be taken for the next request, and
        # a streamed upload's sender would otherwise go on sending into the void
        headers["Connection"] = "close"
    return error_response(
        kind.status,
        kind.type,
        kind.code,
        exc.message,
        param=exc.param,
        request_id=request_id_of(scope),
        headers=headers,
    )


def client_closed_response(request: Request) -> Response:
    """What a request whose client disconnected gets (nobody reads it; metrics count 499)."""
    logger.debug(
        "client disconnected before %s %s was answered (request %s)",
        request.method,
        request.url.path,
        request_id_of(request.scope),
    )
    return Response(status_code=CLIENT_CLOSED_STATUS)


async def _on_client_disconnect(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientDisconnect)
    return client_closed_response(request)


async def _on_lead_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, le.LeadError)
    return lead_error_response(exc, request.scope)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    # A LeadError raised while FastAPI reads a body (e.g. the body limit) arrives wrapped.
    if isinstance(exc.__cause__, le.LeadError):
        return lead_error_response(exc.__cause__, request.scope)
    if isinstance(exc.__cause__, ClientDisconnect):
        return client_closed_response(request)
    status = exc.status_code
    headers = dict(exc.headers or {})
    if status == 404:
        message = f"no route {echo(request.url.path)}{_slash_hint(request)}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
        allowed = _allowed_methods(request)
        if allowed:  # else keep Starlette's (a path the schema's templates cannot match)
            headers["Allow"] = ", ".join(allowed)
    else:
        message = str(exc.detail)
    type_ = "not_found_error" if status == 404 else _INVALID if status < 500 else "server_error"
    return error_response(
        status,
        type_,
        _HTTP_CODES.get(status, "http_error"),
        message,
        request_id=request_id_of(request.scope),
        headers=headers,
    )


def _slash_hint(request: Request) -> str:
    """``" (without the trailing slash: /v1/jobs)"`` when the path without its trailing
    slash is a route (the app answers ``/v1/jobs/`` with 404, not a redirect), else ``""``."""
    path = request.url.path
    if len(path) < 2 or not path.endswith("/"):
        return ""
    scope = {**request.scope, "path": path.rstrip("/")}
    if any(route.matches(scope)[0] != Match.NONE for route in request.app.router.routes):
        return f" (without the trailing slash: {echo(scope['path'])})"
    return ""


def _allowed_methods(request: Request) -> list[str]:
    """Methods the OpenAPI schema lists for this path.

    Starlette's own ``Allow`` names the methods of the first route that matches the path
    only, while a path here may have one route per method (``GET`` and ``DELETE``).
    """
    methods: set[str] = set()
    path = route_path(request.scope)
    for template, item in request.app.openapi().get("paths", {}).items():
        regex, _, _ = compile_path(template)
        if regex.match(path):
            methods.update(method.upper() for method in item if method.upper() in _HTTP_METHODS)
    return sorted(methods)


_HTTP_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"})


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    # pydantic names the member of a union it tried ("list[list[float]]"): not a field
    parts = [
        cut(str(p))  # a field name is the client's: 20 MB of it were echoed twice
        for p in loc
        if p not in ("body", "query", "path", "header") and not re.search(r"[\[(]", str(p))
    ]
    if not parts:
        return None
    text = parts[0]
    for part in parts[1:]:
        text += f"[{part}]" if part.isdigit() else f".{part}"
    return text


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first: dict[str, Any] = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    # A schema validator that raised a LeadError (e.g. NonFiniteError) keeps its status/code.
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, le.LeadError):
        if cause.param is None:
            cause.param = _loc_to_param(loc)
        return lead_error_response(cause, request.scope)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "JSON decode error")
        return error_response(
            400,
            _INVALID,
            "invalid_json",
            f"request body is not valid JSON: {detail}",
            request_id=request_id_of(request.scope),
        )
    param = _loc_to_param(loc)
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return error_response(
        422,
        _INVALID,
        "validation_error",
        message,
        param=param,
        request_id=request_id_of(request.scope),
    )


def storage_full(exc: BaseException) -> le.StorageFullError | None:
    """The :class:`~lead.errors.StorageFullError` that ``exc`` (or what caused it) means,
    if it is a write that found no room: ``ENOSPC`` / ``EDQUOT``, or SQLite's "database or
    disk is full"."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception, its cause, theirs...
        if seen is None:
            return None
        if isinstance(seen, le.StorageFullError):
            return seen
        full = isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or (isinstance(seen, sqlite3.OperationalError) and "is full" in str(seen)):
            return le.StorageFullError(
                "the server has no room left to write (its disk or database is full); "
                "nothing was kept of this request: retry once space is freed"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _internal_error(scope: Scope, exc: BaseException) -> JSONResponse:
    """Log an unexpected exception with the request id; the 500 that hides it (a 507 for a
    write that found the disk full)."""
    full = storage_full(exc)
    if full is not None:
        logger.error(
            "no room to write on %s (request %s): %s", scope.get("path"), request_id_of(scope), exc
        )
        return lead_error_response(full, scope)
    request_id = request_id_of(scope)
    logger.error(
        "unhandled error on %s %s (request %s)",
        scope.get("method"),
        scope.get("path"),
        request_id,
        exc_info=exc,
    )
    return error_response(
        500,
        "server_error",
        "internal_error",
        "internal server error; quote the request id when reporting it",
        request_id=request_id,
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    return _internal_error(request.scope, exc)


class InternalErrorMiddleware:
    """Answer an unexpected exception with the 500 envelope and keep the connection.

    Starlette's outermost middleware answers it too, but then raises it again for the
    server to log, and uvicorn closes a connection whose app raised after answering: the
    client's next request on that keep-alive connection failed with "connection reset".
    Here it is logged and answered, and nothing is raised; only an exception after the
    answer started (an interrupted stream) still goes up, and the connection closes, as
    it must.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:
            if started:
                raise
            await _internal_error(scope, exc)(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Register the envelope handlers on ``app`` (LeadError, HTTP, validation, catch-all)."""
    app.add_exception_handler(le.LeadError, _on_lead_error)
    app.add_exception_handler(ClientDisconnect, _on_client_disconnect)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
