"""The OpenAPI schema, and ``python -m service.openapi`` to regenerate ``openapi.yaml``.

``python -m service.openapi`` writes the file; ``--check`` exits 1 when it is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

__all__ = ["OPENAPI_PATH", "build_openapi", "main"]

OPENAPI_PATH = Path(__file__).resolve().parents[1] / "openapi.yaml"


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the models that routes reference but do not declare."""
    if app.openapi_schema:
        return app.openapi_schema
    from service.routes.translate import OPENAPI_MODELS

    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in OPENAPI_MODELS:
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
    from service.schemas import ErrorEnvelope

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


def render_yaml(schema: dict[str, Any]) -> str:
    import yaml  # only needed to write the file (tests and this command)

    text: str = yaml.safe_dump(schema, sort_keys=False, allow_unicode=True, width=100)
    return text


def main(argv: list[str] | None = None) -> int:
    from service.app import create_app
    from service.settings import ApiKey, Settings

    parser = argparse.ArgumentParser(prog="python -m service.openapi", description=__doc__)
    parser.add_argument("--output", type=Path, default=OPENAPI_PATH)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    import yaml

    # the schema of a deployment with API keys (a server without keys drops its security)
    keys = [ApiKey.model_validate("documentation-key")]
    app = create_app(Settings(device="cpu", stitches=[], api_keys=keys))
    text = render_yaml(app.openapi())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if yaml.safe_load(current) != yaml.safe_load(text):
            sys.stderr.write(f"{args.output} is stale; run python -m service.openapi\n")
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    sys.stderr.write(f"wrote {args.output}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
