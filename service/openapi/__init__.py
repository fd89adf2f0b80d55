"""The service's OpenAPI schema: FastAPI's, plus the models that routes reference but do
not declare, with the error envelope documented for 422.

``python -m service.openapi`` (:mod:`service.openapi.cli`) regenerates ``openapi.yaml``;
``--check`` exits 1 when it is stale. This module imports nothing of the app: the app
factory installs :func:`build_openapi`, and the command builds an app.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from service.schemas import ErrorEnvelope

__all__ = ["OPENAPI_PATH", "build_openapi"]

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "openapi.yaml"


def build_openapi(app: FastAPI, extra_models: Iterable[type[BaseModel]] = ()) -> dict[str, Any]:
    """FastAPI's schema of ``app`` plus ``extra_models`` (models that routes reference,
    e.g. in ``openapi_extra``, but do not declare), computed once per app."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in extra_models:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
    _document_envelope_for_422(schema)
    schema["components"]["schemas"] = dict(sorted(components.items()))
    if not app.state.settings.api_keys:
        _without_security(schema)
    app.openapi_schema = schema
    return schema


def _without_security(schema: dict[str, Any]) -> None:
    """The schema of a server without API keys: no security requirement, no 401 / 403.

    ``openapi.yaml`` is the schema with keys (what a deployment exposes); a server without
    keys serves this one, so that a schema-driven client or fuzzer sees what it answers.
    """
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            operation.pop("security", None)
            for status in ("401", "403"):
                operation.get("responses", {}).pop(status, None)
    schema.get("components", {}).pop("securitySchemes", None)


def _document_envelope_for_422(schema: dict[str, Any]) -> None:
    """FastAPI documents 422 as ``HTTPValidationError``; the service answers the envelope."""
    components = schema["components"]["schemas"]
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    default_ref = {"$ref": "#/components/schemas/HTTPValidationError"}
    for operation in (op for item in schema.get("paths", {}).values() for op in item.values()):
        response = operation.get("responses", {}).get("422")
        content = (response or {}).get("content", {}).get("application/json", {})
        if content.get("schema") == default_ref:
            content["schema"] = envelope
            response["description"] = (
                "Invalid fields, dimension mismatch, non-finite values, or a limit exceeded."
            )
    if "ErrorEnvelope" not in components:
        model_schema = ErrorEnvelope.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components["ErrorEnvelope"] = model_schema
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
