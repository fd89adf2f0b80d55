"""The OpenAPI documentation of ``POST /v1/translate`` beyond its models: the request
examples, the Arrow IPC request and answer, and the query parameters of Arrow bodies."""

from __future__ import annotations

from typing import Any

from service.arrow_io import ARROW_STREAM
from service.schemas import TranslateOptions

__all__ = ["ARROW_ANSWER", "REQUEST_BODY"]

_B64_EXAMPLE = "AACAPwAAAEAAAEBAAACAQA=="  # [1, 2, 3, 4] as little-endian float32

REQUEST_BODY: dict[str, Any] = {
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
            },
            ARROW_STREAM: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "An Arrow IPC stream (options in the query string). Its "
                    "vector column is the column named `embedding`, else its only fixed-size-list "
                    "column, of type `fixed_size_list<float32>[d_src]` without nulls; every other "
                    "column (ids of any type) is passed through to the answer untouched. At most "
                    "`max_vectors_arrow` rows and `max_body_bytes_arrow` bytes (GET /v1/info); "
                    "batches must not be compressed (lz4/zstd; `Content-Encoding: gzip` is "
                    "accepted).",
                }
            },
        },
    },
    "parameters": [
        {
            "name": name,
            "in": "query",
            "required": False,
            "description": "Arrow bodies only (a JSON body carries this field itself, and "
            "gets 422 when the query names it too): "
            + str(TranslateOptions.model_fields[name].description),
            "schema": schema,
        }
        for name, schema in (
            ("stitch", {"type": "string"}),
            ("source_model", {"type": "string"}),
            ("target_model", {"type": "string"}),
            ("direction", {"type": "string", "enum": ["forward", "inverse"], "default": "forward"}),
            ("normalize", {"type": "boolean", "default": False}),
            ("strict", {"type": "boolean", "default": False}),
            ("return_confidence", {"type": "boolean", "default": False}),
        )
    ],
}

ARROW_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The translated vectors: JSON for a JSON body; for an Arrow body an "
        "Arrow IPC stream of the request's batches (same rows, order and other columns) whose "
        "vector column holds `fixed_size_list<float32>[d_tgt]`, the other fields of the JSON "
        "answer (`model`, `stitch`, `input_normalized`, `rescaled_inputs`, `usage`) being the "
        "JSON text of its schema metadata key `lead`; with `return_confidence=true` two "
        "columns follow: `confidence` (float32) and `out_of_distribution` (bool).",
        "content": {ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}},
    }
}
