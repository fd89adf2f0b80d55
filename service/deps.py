"""FastAPI dependencies: what routes get from the app (settings, registry, metrics, limiters),
and :func:`require_json`, the one content-type rule of every route with a JSON body.

All are ``async def``: they do no blocking work, and FastAPI runs a plain ``def``
dependency in the thread pool, a thread hand-off per dependency per request.

``POST /v1/translate`` is served without FastAPI's dependency solving (the query-time hot
path, :func:`service.routes.translate.fast_route`) and calls the plain functions here
itself: :func:`translate_context`, :func:`require_json_or_arrow_media` (JSON or an Arrow
IPC stream) and :func:`check_query`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Annotated, NoReturn
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from python_multipart.multipart import parse_options_header

from lead.errors import (
    InvalidInputError,
    LeadError,
    NotReadyError,
    UnsupportedMediaTypeError,
)
from service.arrow_io import ARROW_STREAM
from service.batcher import MicroBatcher
from service.limits import ConcurrencyLimiter
from service.observability import Metrics
from service.paths import route_path
from service.registry import StitchRegistry
from service.settings import Settings

__all__ = [
    "AlignLimiterDep",
    "LimiterDep",
    "MetricsDep",
    "RegistryDep",
    "SettingsDep",
    "TranslateContext",
    "body_error",
    "check_query",
    "get_align_limiter",
    "get_limiter",
    "get_metrics",
    "get_registry",
    "get_settings",
    "media_type",
    "one_idempotency_key",
    "refuse_repeated_query",
    "require_json",
    "require_json_or_arrow_media",
    "translate_context",
]


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_limiter(request: Request) -> ConcurrencyLimiter:
    limiter: ConcurrencyLimiter = request.app.state.limiter
    return limiter


async def get_align_limiter(request: Request) -> ConcurrencyLimiter:
    limiter: ConcurrencyLimiter = request.app.state.align_limiter
    return limiter


async def get_registry(request: Request) -> StitchRegistry:
    """The registry built by the lifespan (503 if the lifespan has not run)."""
    return _registry(request)


def _registry(request: Request) -> StitchRegistry:
    registry: StitchRegistry | None = getattr(request.app.state, "registry", None)
    if registry is None:
        raise NotReadyError("the service is starting")
    return registry


@dataclass(frozen=True)
class TranslateContext:
    """What the translate route needs from the app, read without FastAPI's dependency
    solving (the route is served without it: :func:`service.routes.translate.fast_route`)."""

    settings: Settings
    registry: StitchRegistry
    metrics: Metrics
    limiter: ConcurrencyLimiter  # bulk requests
    small_limiter: ConcurrencyLimiter  # small (query-time) requests
    batcher: MicroBatcher


def translate_context(request: Request) -> TranslateContext:
    """The translate route's context.

    Raises
    ------
    NotReadyError
        If the lifespan has not built the registry yet (503).
    """
    state = request.app.state
    return TranslateContext(
        state.settings,
        _registry(request),
        state.metrics,
        state.limiter,
        state.small_limiter,
        state.batcher,
    )


def media_type(request: Request) -> str:
    """The request's ``Content-Type`` without parameters, lower case ("" when missing).

    Raises
    ------
    UnsupportedMediaTypeError
        Several ``Content-Type`` headers (which one a proxy reads is anyone's guess), or a
        ``charset`` other than UTF-8 (bodies are read as UTF-8, RFC 8259 section 8.1).
    """
    values = _at_most_one(request, "Content-Type", UnsupportedMediaTypeError)
    media, parameters = parse_options_header(values[0] if values else "")
    charset = parameters.get(b"charset")
    if charset is not None and charset.lower() not in (b"utf-8", b"utf8"):
        raise UnsupportedMediaTypeError(
            f"charset {charset.decode('latin-1')!r} in Content-Type: bodies must be UTF-8 "
            "(send `charset=utf-8`, or no charset)"[:300],
            param="Content-Type",
        )
    return media.decode("latin-1")


def _at_most_one(request: Request, name: str, error: type[LeadError]) -> list[str]:
    """The values of header ``name``, refused with ``error`` when there are several: which
    one a proxy keeps is anyone's guess."""
    values = request.headers.getlist(name)
    if len(values) > 1:
        raise error(f"{len(values)} {name} headers: send one", param=name)
    return values


def one_idempotency_key(request: Request) -> None:
    """Refuse several ``Idempotency-Key`` headers (the first was used, the others dropped).

    Raises
    ------
    InvalidInputError
        Two or more of them (400).
    """
    _at_most_one(request, "Idempotency-Key", InvalidInputError)


def _is_json(media: str) -> bool:
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _refuse(request: Request, accepted: str) -> NoReturn:
    content_type = request.headers.get("content-type", "")
    raise UnsupportedMediaTypeError(
        f"Content-Type must be {accepted}, got "
        f"{repr(content_type) if content_type else 'no Content-Type'}"[:300],
        param="Content-Type",
    )


async def require_json(request: Request) -> None:
    """Refuse (415) a request whose ``Content-Type`` is not ``application/json`` (or
    ``application/*+json``); a missing header is refused too.

    Declared on every route with a JSON body (``dependencies=[Depends(require_json)]``),
    so that a form or a text body gets 415 instead of a validation error.
    """
    if not _is_json(media_type(request)):
        _refuse(request, "application/json")


def require_json_or_arrow_media(request: Request) -> str:
    """:func:`require_json`, but an Arrow IPC stream (:data:`ARROW_STREAM`) is accepted too:
    the rule of ``POST /v1/translate``, which calls it itself. Returns the media type."""
    media = media_type(request)
    if not _is_json(media) and media != ARROW_STREAM:
        _refuse(request, f"application/json or {ARROW_STREAM}")
    return media


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
LimiterDep = Annotated[ConcurrencyLimiter, Depends(get_limiter)]
AlignLimiterDep = Annotated[ConcurrencyLimiter, Depends(get_align_limiter)]
RegistryDep = Annotated[StitchRegistry, Depends(get_registry)]


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` takes: its own and its dependencies' (FastAPI's
    ``Dependant`` tree), and those its ``openapi_extra`` documents (translate's Arrow
    options, read by the route itself)."""
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(field.alias for field in dependant.query_params)
        pending.extend(dependant.dependencies)
    for parameter in (route.openapi_extra or {}).get("parameters", []):
        if parameter.get("in") == "query":
            names.add(parameter["name"])
    return frozenset(names)


def _refuse_non_utf8(query: bytes) -> None:
    """Refuse a query parameter that is not UTF-8 once percent-decoded (Starlette decodes
    it with U+FFFD in place of the bad bytes: ``?name=%ff`` labelled a dataset "\ufffd")."""
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        for piece, what in ((key, "the key"), (value, "the value")):
            try:
                unquote_to_bytes(piece.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError:
                raise _query_error(
                    key.decode("latin-1")[:200],
                    value.decode("latin-1")[:200],
                    f"Value error, {what} is not UTF-8 once percent-decoded; encode text as "
                    "UTF-8 before percent-encoding it",
                ) from None


def _field_error(where: str, key: str, value: str, message: str) -> RequestValidationError:
    """A 422 naming field ``key`` of the ``where`` ("query", "body"), as FastAPI's own
    validation errors do."""
    error = {"type": "value_error", "loc": (where, key), "msg": message, "input": value}
    return RequestValidationError([error])


def _query_error(key: str, value: str, message: str) -> RequestValidationError:
    return _field_error("query", key, value, message)


def body_error(key: str, value: str, message: str) -> RequestValidationError:
    """A 422 naming the body (form) field ``key`` (its value cut to 100 characters)."""
    return _field_error("body", key, value[:100], message)


async def refuse_repeated_query(request: Request) -> None:
    """Refuse a query parameter given more than once (every route's parameters are single
    values; FastAPI would keep the last and ignore the others), or one that a ``/v1/`` route
    does not take (FastAPI ignores it: ``GET /v1/jobs?stauts=failed`` listed every job):
    422 naming the key. Found by the contract test (``?limit=true&limit=true&limit=1``
    answered 200). Async: FastAPI runs a plain function dependency in a worker thread, a
    hand-off on every request."""
    if request.scope.get("query_string"):
        route = request.scope.get("route")
        check_query(request, _query_names(route) if isinstance(route, APIRoute) else None)


def check_query(request: Request, known: frozenset[str] | None) -> None:
    """:func:`refuse_repeated_query` for a route that takes the query parameters ``known``
    (None: any), called by a route served without FastAPI's dependencies.

    Raises
    ------
    RequestValidationError
        Naming the first key given twice or not in ``known``, or whose key or value is not
        UTF-8 once percent-decoded (422).
    """
    _refuse_non_utf8(request.scope.get("query_string", b""))
    seen: set[str] = set()
    for key, value in request.query_params.multi_items():
        if key in seen:
            message = "Value error, given more than once; give each query parameter once"
            raise _query_error(key, value, message)
        if known is not None and key not in known and route_path(request.scope).startswith("/v1/"):
            takes = ", ".join(sorted(known)) if known else "no query parameters"
            close = difflib.get_close_matches(key, sorted(known), n=1)
            guess = f"; did you mean {close[0]!r}?" if close else ""
            raise _query_error(key, value, f"not a query parameter of this route ({takes}){guess}")
        seen.add(key)
