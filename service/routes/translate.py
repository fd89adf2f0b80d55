"""``POST /v1/translate``: vectors of one model's space into another's.

The raw body is decoded by one typed decoder into its fields, its route and one float32
array (:mod:`service.translate_body`), scaled to unit length where the stitch was fitted on
unit-length vectors, run through the stitch (or chain) batch-invariantly under
``torch.inference_mode()``, checked for finiteness and serialised (orjson; base64 vectors
are written straight into the JSON text). A small body (at most :data:`SMALL_BODY_BYTES`,
the query-time case) is handled on the event loop and its forward shared with concurrent
requests (:mod:`service.batcher`); a larger one runs whole in a worker thread, so that the
event loop stays free.

A body of type ``application/vnd.apache.arrow.stream`` (an Arrow IPC stream, options in
the query string) is read and answered by :mod:`service.arrow_io` around the same
translation.

The route is served by a plain Starlette route without FastAPI's dependency solving
(:func:`fast_route`); FastAPI's route of the same endpoint documents it."""

from __future__ import annotations

from typing import Any

import orjson
import torch
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route as StarletteRoute

from service import arrow_io
from service.deps import check_query, require_json_or_arrow_media, translate_context
from service.encoding import render_embeddings, render_scored
from service.held_answer import HeldAnswer
from service.jobs.schemas import AlignRequest, JobCreate
from service.observability import Metrics
from service.registry import StitchRegistry
from service.routes.translate_openapi import ARROW_ANSWER, REQUEST_BODY
from service.routing import Route, Translation
from service.schemas import (
    TranslateRequest,
    TranslateResponse,
    error_responses,
)
from service.settings import Settings
from service.translate_body import TranslateFields, decode_request, find_route

__all__ = ["OPENAPI_MODELS", "fast_route", "router"]

router = APIRouter(tags=["translate"])

#: Requests declaring a body of at most this many bytes (a few dozen vectors) are decoded
#: on the event loop and micro-batched; larger ones run whole in a worker thread.
SMALL_BODY_BYTES = 64 * 1024


async def _read_body(request: Request) -> bytes:
    """The request body, without a copy when it comes as one piece (the body limit
    middleware delivers it so; ``Request.body()`` copies it once more)."""
    chunks = [chunk async for chunk in request.stream() if chunk]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _use_torch_threads(settings: Settings) -> None:
    if torch.get_num_threads() != settings.torch_threads:
        # OpenMP keeps a thread count per calling thread: set it in this worker too.
        torch.set_num_threads(settings.torch_threads)


def _answer_fields(route: Route, rescaled: int, n: int) -> dict[str, Any]:
    """The answer's fields beside ``data`` (``object`` aside)."""
    ids = [entry.id for entry in route.entries]
    return {
        "model": route.target_model,
        "stitch": {
            "id": None if route.is_chain else ids[0],
            "direction": "inverse" if route.inverse else "forward",
            "chain": ids,
            "models": route.models,
        },
        "input_normalized": route.input_normalized,
        "rescaled_inputs": rescaled,
        "usage": {"vectors": n},
    }


def _count_vectors(metrics: Metrics, route: Route, n: int) -> None:
    for entry in route.entries:
        metrics.vectors.labels(entry.id).inc(n)


def _render(options: TranslateFields, route: Route, answer: Translation, metrics: Metrics) -> bytes:
    """The response body for ``answer`` (with confidences when it has them)."""
    rest = _answer_fields(route, answer.rescaled_inputs, len(answer.vectors))
    # {"object": "list", "data": [...], **rest}, with the (large) data array pre-rendered
    before, after = b'{"object":"list","data":', b"," + orjson.dumps(rest)[1:]
    y, confidence, ood = answer.vectors, answer.confidence, answer.out_of_distribution
    if confidence is None or ood is None:
        content = render_embeddings(y, options.encoding_format, before=before, after=after)
    else:
        content = render_scored(
            y, confidence, ood, options.encoding_format, before=before, after=after
        )
    _count_vectors(metrics, route, len(y))
    return content


def _translate(
    body: bytes, registry: StitchRegistry, settings: Settings, metrics: Metrics
) -> bytes:
    """Decode, translate and render a large request in one go (in a worker thread)."""
    _use_torch_threads(settings)
    options, x, route = decode_request(body, registry, settings.max_vectors)
    answer = route.run(x, normalize=options.normalize, scored=options.return_confidence)
    return _render(options, route, answer, metrics)


def _translate_arrow(
    body: bytes,
    query: list[tuple[str, str]],
    registry: StitchRegistry,
    settings: Settings,
    metrics: Metrics,
) -> memoryview:
    """:func:`_translate` for an Arrow IPC body: options from the query string."""
    _use_torch_threads(settings)
    arrow_io.refuse_json(body)  # before its query: the options of a JSON body are in it
    options = arrow_io.query_options(query)
    route = find_route(registry, options)
    request = arrow_io.read_vectors(body, route.d_src, settings.max_vectors_arrow)
    answer = route.run(
        request.vectors, normalize=options.normalize, scored=options.return_confidence
    )
    y, confidence, ood, _ = answer
    scores = None if confidence is None or ood is None else [confidence, ood]
    fields = _answer_fields(route, answer.rescaled_inputs, len(y))
    content = arrow_io.write_vectors(request, y, fields, scores=scores)
    _count_vectors(metrics, route, len(y))
    return memoryview(content)


def _is_small(request: Request, settings: Settings) -> bool:
    """Whether the request declares a body small enough for the event loop (and so for
    the micro-batcher)."""
    length = request.headers.get("content-length", "")
    return settings.micro_batching and length.isdigit() and int(length) <= SMALL_BODY_BYTES


@router.post(
    "/v1/translate",
    response_model=TranslateResponse,
    summary="Translate vectors into another model's space",
    openapi_extra=REQUEST_BODY,
    responses={**ARROW_ANSWER, **error_responses(400, 401, 404, 408, 413, 415, 422, 429, 503)},
)
async def translate(request: Request) -> Response:
    """Translate `input` with the stitch named by `stitch`, or by `source_model` +
    `target_model` (through the shortest chain of stitches when no direct one exists,
    unless `strict`). `data[i]` answers `input[i]`; `stitch.chain` names the stitches used.

    A stitch fitted on unit-length vectors (`source.normalized` in its listing; for
    `"direction": "inverse"`, `target.normalized`) gets its input scaled to unit length first:
    `input_normalized` says so and `rescaled_inputs` counts the vectors that were not of unit
    length. An all-zero vector cannot be scaled: 422 `zero_vector`, naming `input[i]`.

    `"return_confidence": true` adds `confidence` (in [0, 1]: the stitch's calibrated
    estimate of the cosine between this translation and the target model's own vector) and
    `out_of_distribution` (the input is far from what the stitch was fitted on; its
    confidence is then 0) to each `data[i]`; a stitch without a confidence head gets 422
    `no_confidence`.

    Bulk: a body of type `application/vnd.apache.arrow.stream` (an Arrow IPC stream of
    float32 vectors, options in the query string) is answered with an Arrow IPC stream:
    raw float32 both ways, no JSON, up to `max_vectors_arrow` vectors per request.
    """
    # What FastAPI's dependencies would check, in their order (served without them:
    # fast_route). The query string is parsed only when there is one (a cost on every
    # single vector).
    query: list[tuple[str, str]] = []
    if request.scope.get("query_string"):
        check_query(request, _QUERY_NAMES)
        query = request.query_params.multi_items()
    arrow = require_json_or_arrow_media(request) == arrow_io.ARROW_STREAM
    ctx = translate_context(request)
    if not arrow:
        arrow_io.refuse_query_options(query)
    # Read the body first: the limiter guards compute, and a slow client must not hold a
    # slot (the body limit middleware times the read out with 408).
    settings, registry, metrics, limiter = ctx.settings, ctx.registry, ctx.metrics, ctx.limiter
    if arrow or not _is_small(request, settings):
        body = await _read_body(request)
        weight = len(body)
        limiter.acquire(settings.retry_after_seconds, weight)
        try:
            if arrow:
                content: bytes | memoryview = await run_in_threadpool(
                    _translate_arrow, body, query, registry, settings, metrics
                )
            else:
                content = await run_in_threadpool(_translate, body, registry, settings, metrics)
        except BaseException:
            limiter.release(weight)
            raise
        # the share is held until the client has taken the answer (service.held_answer)
        return HeldAnswer(
            content,
            arrow_io.ARROW_STREAM if arrow else "application/json",
            release=lambda: limiter.release(weight),
            timeout_s=settings.body_timeout_seconds,
        )
    # Small: decoded and rendered on the event loop (a thread hand-off would cost more than
    # either), the forward shared with concurrent requests (service.batcher).
    with ctx.batcher.arriving():
        body = await _read_body(request)
    async with ctx.small_limiter.slot(settings.retry_after_seconds, weight=len(body)):
        options, x, route = decode_request(body, registry, settings.max_vectors)
        if options.return_confidence:  # never micro-batched
            answer = route.run(x, normalize=options.normalize, scored=True)
        else:
            answer = await ctx.batcher.run(route, x, normalize=options.normalize)
        content = _render(options, route, answer, metrics)
    return Response(content, media_type="application/json")


#: The query parameters the route takes (Arrow bodies' options).
_QUERY_NAMES = frozenset(
    parameter["name"] for parameter in REQUEST_BODY["parameters"] if parameter["in"] == "query"
)


def fast_route() -> StarletteRoute:
    """``POST /v1/translate`` as a plain Starlette route, for :func:`translate` to be served
    without FastAPI's per-request machinery.

    FastAPI solves a route's dependencies on every request (the app's query check, the
    router's API-key check with its settings and bearer dependencies: seven solves) and
    matches the routes included before it: in-process that was about half of the server's
    own time around a single vector's forward, and over loopback one client's p50 went
    from 1.58 to 1.15 ms without it (``bench.latency``, side by side). :func:`translate`
    checks what those dependencies would, itself; API keys and scopes are checked before
    the body by :class:`service.auth.ApiKeyGate`, which covers this route as every
    protected one. Put ahead of the routers (:func:`service.routes.include_routers`), this
    route answers every ``POST /v1/translate``; FastAPI's route of the same endpoint
    documents it in the OpenAPI schema (a test keeps it free of dependencies).
    """
    return StarletteRoute("/v1/translate", translate, methods=["POST"])


#: Models that the OpenAPI components must hold although no route declares them.
OPENAPI_MODELS = (TranslateRequest, AlignRequest, JobCreate)
