"""Optional API keys on every route except health, readiness and metrics."""

from __future__ import annotations

from typing import Any

import pytest
from service_helpers import b64

KEYS = ["first-key-0123456789", "second-key-abcdefghij"]


def _translate(client: Any, queries: Any, headers: dict[str, str] | None = None) -> Any:
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
    return client.post("/v1/translate", json=body, headers=headers or {})


def test_no_keys_configured_means_open(make_client: Any, queries: Any) -> None:
    client = make_client()
    assert _translate(client, queries).status_code == 200
    assert client.get("/v1/info").json()["auth"] is False


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {KEYS[0]}"},
        {"Authorization": KEYS[0]},
    ],
    ids=["missing", "wrong", "empty", "basic-scheme", "no-scheme"],
)
def test_bad_or_missing_key_is_401(make_client: Any, queries: Any, headers: dict[str, str]) -> None:
    client = make_client(api_keys=KEYS)
    for r in (
        _translate(client, queries, headers),
        client.get("/v1/stitches", headers=headers),
        client.get("/v1/stitches/minilm-to-mpnet", headers=headers),
        client.get("/v1/info", headers=headers),
    ):
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.json()["error"]["type"] == "authentication_error"
    good = {"Authorization": f"Bearer {KEYS[1]}"}
    assert _translate(client, queries, good).status_code == 200


def test_every_configured_key_works(make_client: Any, queries: Any) -> None:
    client = make_client(api_keys=",".join(KEYS))  # comma-separated, as from the environment
    for key in KEYS:
        r = _translate(client, queries, {"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    r = client.get("/v1/info", headers={"Authorization": f"Bearer {KEYS[0]}"})
    assert r.status_code == 200, r.text
    assert r.json()["auth"] is True
    assert KEYS[0] not in r.text


def test_health_readiness_and_metrics_stay_open(make_client: Any) -> None:
    client = make_client(api_keys=KEYS)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200, path
