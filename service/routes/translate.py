"""``POST /v1/translate``: vectors of one model's space into another's.

Hot path, all in a worker thread so that the event loop stays free: the raw body is decoded
by one typed decoder into its fields, its route and one float32 array
(:mod:`service.translate_body`), scaled to unit length where the stitch was fitted on
unit-length vectors, run through the stitch (or chain) in one forward under
``torch.inference_mode()``, checked for finiteness and serialised (orjson; base64 vectors
are written straight into the JSON text)."""

from __future__ import annotations

from typing import Any

import orjson
import torch
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from service.deps import LimiterDep, MetricsDep, RegistryDep, SettingsDep, require_json
from service.encoding import render_embeddings
from service.observability import Metrics
from service.registry import StitchRegistry
from service.schemas import TranslateRequest, TranslateResponse, error_responses
from service.settings import Settings
from service.translate_body import decode_request

__all__ = ["OPENAPI_MODELS", "router"]

router = APIRouter(tags=["translate"])

_B64_EXAMPLE = "AACAPwAAAEAAAEBAAACAQA=="  # [1, 2, 3, 4] as little-endian float32

_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/TranslateRequest"},
                "examples": {
                    "float": {
                        "summary": "Float arrays, by stitch id",
                        "value": {"stitch": "minilm-to-mpnet", "input": [[0.1, -0.2, 0.3, 0.05]]},
                    },
                    "base64": {
                        "summary": "Base64 in and out, by models",
                        "value": {
                            "source_model": "sentence-transformers/all-MiniLM-L6-v2",
                            "target_model": "sentence-transformers/all-mpnet-base-v2",
                            "input": [_B64_EXAMPLE],
                            "encoding_format": "base64",
                        },
                    },
                },
            }
        },
    }
}


async def _read_body(request: Request) -> bytes:
    """The request body, without a copy when it comes as one piece (the body limit
    middleware delivers it so; ``Request.body()`` copies it once more)."""
    chunks = [chunk async for chunk in request.stream() if chunk]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _translate(
    body: bytes, registry: StitchRegistry, settings: Settings, metrics: Metrics
) -> bytes:
    """Decode, translate and serialise one request (runs in a worker thread)."""
    if torch.get_num_threads() != settings.torch_threads:
        # OpenMP keeps a thread count per calling thread: set it in this worker too.
        torch.set_num_threads(settings.torch_threads)
    options, x, route = decode_request(body, registry, settings.max_vectors)
    y, rescaled = route.translate(x, normalize=options.normalize)
    ids = [entry.id for entry in route.entries]
    rest = {
        "model": route.target_model,
        "stitch": {
            "id": None if route.is_chain else ids[0],
            "direction": "inverse" if route.inverse else "forward",
            "chain": ids,
            "models": route.models,
        },
        "input_normalized": route.input_normalized,
        "rescaled_inputs": rescaled,
        "usage": {"vectors": len(y)},
    }
    # {"object": "list", "data": [...], **rest}, with the (large) data array pre-rendered
    before, after = b'{"object":"list","data":', b"," + orjson.dumps(rest)[1:]
    content = render_embeddings(y, options.encoding_format, before=before, after=after)
    for stitch_id in ids:
        metrics.vectors.labels(stitch_id).inc(len(y))
    return content


@router.post(
    "/v1/translate",
    response_model=TranslateResponse,
    summary="Translate vectors into another model's space",
    openapi_extra=_REQUEST_BODY,
    responses=error_responses(400, 401, 404, 408, 413, 415, 422, 429, 503),
    dependencies=[Depends(require_json)],
)
async def translate(
    request: Request,
    registry: RegistryDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    limiter: LimiterDep,
) -> Response:
    """Translate `input` with the stitch named by `stitch`, or by `source_model` +
    `target_model` (through the shortest chain of stitches when no direct one exists,
    unless `strict`). `data[i]` answers `input[i]`; `stitch.chain` names the stitches used.

    A stitch fitted on unit-length vectors (`source.normalized` in its listing; for
    `"direction": "inverse"`, `target.normalized`) gets its input scaled to unit length first:
    `input_normalized` says so and `rescaled_inputs` counts the vectors that were not of unit
    length. An all-zero vector cannot be scaled: 422 `zero_vector`, naming `input[i]`.
    """
    # Read the body first: the limiter guards compute, and a slow client must not hold a
    # slot (the body limit middleware times the read out with 408).
    body = await _read_body(request)
    async with limiter.slot(settings.retry_after_seconds):
        content = await run_in_threadpool(_translate, body, registry, settings, metrics)
    return Response(content, media_type="application/json")


#: Models that the OpenAPI components must hold although no route declares them.
OPENAPI_MODELS = (TranslateRequest,)
