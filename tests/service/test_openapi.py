"""``openapi.yaml`` equals the app's schema (regenerate it: ``python -m service.openapi``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from service.app import create_app
from service.jobs.schemas import AlignRequest, JobCreate
from service.openapi.cli import main
from service.settings import Settings

OPENAPI_YAML = Path(__file__).resolve().parents[2] / "openapi.yaml"


def test_openapi_yaml_is_current() -> None:
    schema = create_app(Settings(stitches=[], device="cpu", api_keys="k")).openapi()
    on_disk = yaml.safe_load(OPENAPI_YAML.read_text(encoding="utf-8"))
    assert on_disk == schema, "openapi.yaml is stale: run `python -m service.openapi`"
    assert main(["--check"]) == 0


def test_openapi_command_checks_the_file() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service.openapi", "--check"],
        cwd=OPENAPI_YAML.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_server_without_keys_serves_a_schema_without_security() -> None:
    """Without API keys nothing needs a key: the served schema says so (no security
    requirement, no 401 / 403), else a schema-driven client would send keys, and a fuzzer
    would expect 401 for requests without one."""
    keyed = create_app(Settings(stitches=[], device="cpu", api_keys="k")).openapi()
    open_ = create_app(Settings(stitches=[], device="cpu")).openapi()
    assert "securitySchemes" in keyed["components"]
    assert "securitySchemes" not in open_["components"]
    assert keyed["paths"].keys() == open_["paths"].keys()
    secured = 0
    for path, item in open_["paths"].items():
        for method, operation in item.items():
            assert "security" not in operation, (method, path)
            assert not {"401", "403"} & set(operation["responses"]), (method, path)
            secured += "security" in keyed["paths"][path][method]
    assert secured >= 10


def test_openapi_documents_the_api() -> None:
    schema = create_app(Settings(stitches=[], device="cpu", api_keys="k")).openapi()
    paths = schema["paths"]
    for path in (
        "/v1/translate",
        "/v1/stitches",
        "/v1/stitches/{stitch_id}",
        "/v1/info",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in paths, path
    translate = paths["/v1/translate"]["post"]
    body = translate["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/TranslateRequest"}
    assert set(body["examples"]) == {"float", "base64"}
    components = schema["components"]["schemas"]
    assert set(components["TranslateRequest"]["properties"]) >= {
        "stitch",
        "source_model",
        "target_model",
        "input",
        "encoding_format",
        "normalize",
        "strict",
    }
    for status in ("400", "401", "404", "413", "415", "422", "429", "503"):
        assert translate["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorEnvelope"
        }
    assert "HTTPValidationError" not in components
    # every JSON-body route refuses other content types (service.deps.require_json)
    json_bodies = [
        (path, method)
        for path, item in paths.items()
        for method, op in item.items()
        if "application/json" in op.get("requestBody", {}).get("content", {})
    ]
    assert {p for p, _ in json_bodies} == {"/v1/translate", "/v1/jobs", "/v1/align"}
    for path, method in json_bodies:
        assert {"408", "415"} <= set(paths[path][method]["responses"]), path
    assert not {"/docs", "/redoc", "/openapi.json"} & set(paths)
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


@pytest.mark.parametrize("component", ["AlignRequest", "JobCreate"])
@pytest.mark.parametrize(
    ("data", "valid"),
    [
        ({"dataset": "ds_0123"}, True),
        ({"dataset": "ds_0123", "source": None, "target": None}, True),
        ({"source": [[0.1, 0.2]] * 4, "target": [[0.3]] * 4}, True),
        ({"dataset": None, "source": ["AAAAAA=="], "target": ["AAAAAA=="]}, True),
        ({}, False),
        ({"dataset": None}, False),
        ({"source": [[0.1]] * 4}, False),
        ({"dataset": "ds_0123", "source": [[0.1]] * 4}, False),
        ({"dataset": "ds_0123", "source": [[0.1]] * 4, "target": [[0.1]] * 4}, False),
    ],
)
def test_pairs_body_schema_agrees_with_the_server(
    component: str, data: dict[str, Any], valid: bool
) -> None:
    """The body's ``oneOf`` (a dataset id, or inline source + target) accepts exactly what
    the server's validation accepts, so a schema-driven client is never refused for it."""
    schema = create_app(Settings(stitches=[], device="cpu")).openapi()
    body = dict(data)
    if component == "JobCreate":
        body |= {"source_model": "a", "target_model": "b"}
    validator = jsonschema.Draft202012Validator(
        {**schema["components"]["schemas"][component], "components": schema["components"]}
    )
    model = {"AlignRequest": AlignRequest, "JobCreate": JobCreate}[component]
    try:
        model.model_validate(body)
        server_accepts = True
    except pydantic.ValidationError:
        server_accepts = False
    assert validator.is_valid(body) is valid
    assert server_accepts is valid
