"""Schemathesis drives every operation of the OpenAPI schema with a ``translate`` key: its
``ignored_auth`` check proves that each operation declaring the bearer scheme refuses
requests without a key or with a wrong one, ``status_code_conformance`` that every answer
(403 included) is documented, and :func:`scope_is_enforced` that an operation whose security
requirement names the ``admin`` scope never serves a ``translate`` key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.python.asgi import shutdown_lifespans  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    ignored_auth,
    status_code_conformance,
)

from service.app import create_app  # noqa: E402
from service.settings import Settings  # noqa: E402

ADMIN_KEY = "schemathesis-admin-0123456789"
READER_KEY = "schemathesis-reader-abcdefghij"
READER = {"Authorization": f"Bearer {READER_KEY}"}


@pytest.fixture
def api_schema(fitted: Any, tmp_path: Path) -> Iterator[Any]:
    settings = Settings(
        stitches=[str(fitted.folder("minilm-to-mpnet"))],
        data_dir=tmp_path / "data",
        device="cpu",
        load_in_background=False,
        api_keys=[ADMIN_KEY, f"{READER_KEY}:translate"],
        max_vectors=16,
        max_inline_pairs=64,
    )
    # Schemathesis runs the app's lifespan once and keeps it until shut down.
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", create_app(settings), headers=READER)
    finally:
        shutdown_lifespans()


def scope_is_enforced(ctx: Any, response: Any, case: Any) -> bool | None:
    """An operation that needs the ``admin`` scope answers a ``translate`` key with 403."""
    scopes = {
        scope
        for requirement in case.operation.definition.raw.get("security", [])
        for scope in requirement.get("HTTPBearer", [])
    }
    if "admin" in scopes and response.status_code != 403:
        raise AssertionError(
            f"{case.operation.label} needs the admin scope but answered a translate key "
            f"with {response.status_code}"
        )
    return None


def test_every_operation_enforces_keys_and_scopes(api_schema: Any) -> None:
    labels = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=5,
            derandomize=True,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            case.call_and_validate(
                headers=READER,
                checks=[ignored_auth, status_code_conformance, scope_is_enforced],
            )

        run()
    assert "DELETE /v1/stitches/{stitch_id}" in labels and "POST /v1/jobs" in labels
