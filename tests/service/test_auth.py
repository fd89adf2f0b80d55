"""Optional API keys on every route except health, readiness and metrics."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from service_helpers import b64

from service.app import create_app
from service.settings import Settings

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


def test_two_authorization_headers_are_refused(make_client: Any, queries: Any) -> None:
    """The first of two headers counted (an adversarial pass): a proxy that reads the last
    would authorise another key than this server checked."""
    client = make_client(api_keys=[KEYS[0], f"{KEYS[1]}:translate"])
    both = [("Authorization", f"Bearer {KEYS[0]}"), ("Authorization", f"Bearer {KEYS[1]}")]
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
    for headers in (both, both[::-1]):
        for r in (
            client.get("/v1/jobs", headers=headers),
            client.post("/v1/translate", json=body, headers=headers),
        ):
            assert r.status_code == 401, r.text
            assert r.json()["error"]["message"] == (
                "2 Authorization headers: send one, `Authorization: Bearer <key>`"
            )
    assert client.get("/v1/jobs", headers=[both[0]]).status_code == 200


def test_a_request_without_a_key_is_refused_before_its_body_is_read(make_client: Any) -> None:
    """The body limit ran before the key check: clients without a key got 413, 415 or 422
    (an adversarial pass), and their gzip bodies were inflated in the slots that keyed
    clients wait for."""
    import gzip

    client = make_client(api_keys=KEYS)
    bomb = gzip.compress(b" " * (80 << 20), 9)  # over the body limit once inflated
    pairs = b'{"source": [' + b",".join([b"[1]"] * 20_000) + b"]}"
    cases = [
        ("POST", "/v1/translate", bomb, {"Content-Encoding": "gzip"}),
        ("POST", "/v1/translate", b"{}", {"Content-Encoding": "br"}),
        ("POST", "/v1/jobs", pairs, {}),
        ("POST", "/v1/align", b"x" * (70 << 20), {}),
        ("GET", "/v1/jobs?bogus=1", b"", {}),
        ("GET", "/v1/nowhere", b"", {}),
    ]
    for method, path, body, headers in cases:
        for auth in ({}, {"Authorization": "Bearer wrong-key"}):
            r = client.request(
                method,
                path,
                content=body or None,
                headers={"Content-Type": "application/json", **headers, **auth},
            )
            assert r.status_code == 401, (path, headers, r.text[:300])
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert (r.headers.get("connection") == "close") == bool(body), path
    good = {"Authorization": f"Bearer {KEYS[0]}", "Content-Encoding": "gzip"}
    r = client.post("/v1/translate", content=bomb, headers=good)
    assert r.status_code == 413, r.text  # with a key: the body limit speaks
    key = {"Authorization": f"Bearer {KEYS[0]}"}
    assert client.get("/v1/jobs?bogus=1", headers=key).status_code == 422
    assert client.get("/healthz").status_code == 200  # open routes stay open


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


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "missing API key: send the header `Authorization: Bearer <key>`"),
        ("Bearer ", "missing API key after `Bearer`"),
        (KEYS[0], "does not use the Bearer scheme: use `Authorization: Bearer <key>`"),
        (f"Basic {KEYS[0]}", "does not use the Bearer scheme"),
        ("Token abc", "does not use the Bearer scheme"),
    ],
    ids=["missing", "bearer-without-key", "no-scheme", "basic-scheme", "token-scheme"],
)
def test_401_says_what_is_wrong_with_the_header(
    make_client: Any, header: str | None, says: str
) -> None:
    client = make_client(api_keys=KEYS)
    r = client.get("/v1/stitches", headers={"Authorization": header} if header else {})
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert says in error["message"]
    assert error["code"] == "invalid_api_key" and error["param"] == "Authorization"
    assert KEYS[0] not in r.text


ADMIN_KEY = "admin-key-0123456789"
READER_KEY = "reader-key-abcdefghij"
SCOPED_KEYS = f"{ADMIN_KEY}, {READER_KEY}:translate"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_translate_key_reads_and_translates_but_cannot_administer(
    make_client: Any, queries: Any
) -> None:
    client = make_client(api_keys=SCOPED_KEYS)
    reader = _bearer(READER_KEY)
    assert _translate(client, queries, reader).status_code == 200
    for path in (
        "/v1/info",
        "/v1/stitches",
        "/v1/stitches/minilm-to-mpnet",
        "/v1/stitch-files/config.json?stitch=minilm-to-mpnet",
        "/openapi.json",
    ):
        r = client.get(path, headers=reader)
        assert r.status_code == 200, (path, r.text)
    pairs = b64(queries["minilm"][:8])
    r = client.post(
        "/v1/align", json={"source": pairs, "target": pairs, "folds": 2}, headers=reader
    )
    assert r.status_code == 200, r.text
    refused = [
        client.delete("/v1/stitches/minilm-to-mpnet", headers=reader),
        client.delete("/v1/stitches/no-such-stitch", headers=reader),  # 403 before 404
        client.get("/v1/jobs", headers=reader),
        client.get("/v1/jobs/job_missing", headers=reader),
        client.post("/v1/jobs", json={}, headers=reader),
        client.get("/v1/datasets", headers=reader),
        client.post("/v1/datasets", content=b"x", headers=reader),
    ]
    for r in refused:
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["type"] == "permission_error"
        assert error["code"] == "insufficient_scope"
        assert "'translate'" in error["message"] and "'admin'" in error["message"]
        assert r.headers["www-authenticate"] == 'Bearer error="insufficient_scope", scope="admin"'
        assert READER_KEY not in r.text
    assert client.get("/v1/stitches/minilm-to-mpnet", headers=reader).status_code == 200


def test_admin_key_and_bare_key_can_do_everything(make_client: Any, queries: Any) -> None:
    client = make_client(api_keys=SCOPED_KEYS)
    admin = _bearer(ADMIN_KEY)  # written without a scope: admin, as keys were before scopes
    assert _translate(client, queries, admin).status_code == 200
    assert client.get("/v1/jobs", headers=admin).status_code == 200
    assert client.get("/v1/datasets", headers=admin).status_code == 200
    r = client.delete("/v1/stitches/no-such-stitch", headers=admin)
    assert r.status_code == 404, r.text
    r = client.delete("/v1/stitches/minilm-to-mpnet", headers=admin)
    assert r.status_code == 409, r.text  # configured, not trained by a job
    assert r.json()["error"]["code"] == "conflict"
    explicit = make_client(api_keys=[f"{ADMIN_KEY}:admin", f"{READER_KEY}:translate"])
    assert explicit.get("/v1/jobs", headers=admin).status_code == 200
    assert explicit.get("/v1/jobs", headers=_bearer(READER_KEY)).status_code == 403
    assert explicit.get("/v1/jobs", headers=_bearer(f"{READER_KEY}:translate")).status_code == 401


def test_scoped_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_API_KEYS", f'["{ADMIN_KEY}", "{READER_KEY}:translate", "a:b:admin"]')
    keys = Settings().api_keys
    assert [(k.get_secret_value(), k.scope) for k in keys] == [
        (ADMIN_KEY, "admin"),
        (READER_KEY, "translate"),
        ("a:b", "admin"),  # a key containing ':' ends with its scope
    ]
    assert ADMIN_KEY not in repr(keys)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (f"{ADMIN_KEY}:superuser", "is not a scope (translate, admin)"),
        (f"{ADMIN_KEY}:secretpart", "a key that contains ':' is written KEY:admin"),
        (":translate", "an API key is empty"),
        (f"{ADMIN_KEY},{ADMIN_KEY}:translate", "API keys 1 and 2 are the same key"),
        # "${KEY_1},${KEY_2}" with both unset: these turned authentication off
        (",", "entry 1 of 2 is empty"),
        (" ", "entry 1 of 1 is empty"),
        (f"{ADMIN_KEY},,{READER_KEY}", "entry 2 of 3 is empty"),
        ("[]", "the list is empty; unset the variable"),
        # keys no HTTP client can send as a bearer token (LeadClient refused them)
        ("sec ret:translate", "printable ASCII without spaces"),
        ("supersécret", "printable ASCII without spaces"),
    ],
    ids=[
        "unknown-scope",
        "colon-in-key",
        "empty",
        "duplicate",
        "comma",
        "blank",
        "gap",
        "empty-json-list",
        "space",
        "non-ascii",
    ],
)
def test_bad_key_entries_are_refused_at_start_without_showing_keys(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as error:
        Settings(api_keys=value)
    assert says in str(error.value)
    assert ADMIN_KEY not in str(error.value) and "secretpart" not in str(error.value)


def test_openapi_names_the_scope_and_documents_401_and_403() -> None:
    schema = create_app(Settings(stitches=[], device="cpu", api_keys=ADMIN_KEY)).openapi()
    admin = {
        ("delete", "/v1/stitches/{stitch_id}"),
        *((m, p) for p, item in schema["paths"].items() for m in item if p.startswith("/v1/jobs")),
        *(
            (m, p)
            for p, item in schema["paths"].items()
            for m in item
            if p.startswith("/v1/datasets")
        ),
    }
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if path in ("/healthz", "/readyz", "/metrics"):
                assert "security" not in operation, path
                continue
            scope = "admin" if (method, path) in admin else "translate"
            assert operation["security"] == [{"HTTPBearer": [scope]}], (method, path)
            for status in ("401", "403"):
                content = operation["responses"][status]["content"]["application/json"]
                assert content["schema"] == envelope, (method, path, status)
    assert len(admin) >= 8


def test_a_key_without_the_routes_scope_is_refused_before_its_body_is_read(
    make_client: Any, queries: Any
) -> None:
    """A translate key sending gzip bombs to admin routes had them inflated (a decompression
    slot each) before its 403 (a second adversarial pass): 413, 415 and 400 instead."""
    import gzip

    client = make_client(api_keys=SCOPED_KEYS)
    bomb = gzip.compress(b" " * (80 << 20), 9)
    reader = {**_bearer(READER_KEY), "Content-Type": "application/json"}
    cases = [
        ("POST", "/v1/jobs", bomb, {"Content-Encoding": "gzip"}),
        ("POST", "/v1/jobs", b"{}", {"Content-Encoding": "br"}),
        ("POST", "/v1/jobs", b"[" * 100_000, {}),
        ("POST", "/v1/datasets", b"x" * (5 << 20), {"Content-Type": "application/octet-stream"}),
        ("DELETE", "/v1/stitches/minilm-to-mpnet", b"", {}),
        ("GET", "/v1/jobs?bogus=1", b"", {}),
    ]
    for method, path, body, headers in cases:
        r = client.request(method, path, content=body or None, headers={**reader, **headers})
        assert r.status_code == 403, (path, headers, r.text[:300])
        assert r.json()["error"]["code"] == "insufficient_scope"
        assert (r.headers.get("connection") == "close") == bool(body), path
    # the reader's own routes are not refused early, the admin's nothing
    assert _translate(client, queries, _bearer(READER_KEY)).status_code == 200
    r = client.post(
        "/v1/jobs", content=bomb, headers={**_bearer(ADMIN_KEY), "Content-Encoding": "gzip"}
    )
    assert r.status_code == 413, r.text  # an admin key reaches the body limit


def test_head_needs_the_key_and_scope_of_get(make_client: Any) -> None:
    """HEAD is answered wherever GET is (``service.routes.head_routes``) and guarded alike."""
    client = make_client(api_keys=[f"{ADMIN_KEY}:admin", f"{READER_KEY}:translate"])
    for path in ("/v1/info", "/v1/stitches", "/v1/jobs"):
        r = client.head(path)
        assert r.status_code == 401 and r.content == b"", path
    assert client.head("/v1/stitches", headers=_bearer(READER_KEY)).status_code == 200
    assert client.head("/v1/jobs", headers=_bearer(READER_KEY)).status_code == 403
    assert client.head("/v1/jobs", headers=_bearer(ADMIN_KEY)).status_code == 200
    assert client.head("/metrics").status_code == 200  # open as GET


def test_keys_are_checked_under_a_root_path(make_client: Any, queries: Any) -> None:
    """Behind ``uvicorn --root-path /api`` (or mounted in another app) the scope's path holds
    the prefix: the gate compared it with ``/v1/`` and let ``POST /v1/translate``, which
    has no dependency to check again, answer 200 without a key (an adversarial pass)."""
    from fastapi.testclient import TestClient

    app = make_client(api_keys=[f"{ADMIN_KEY}:admin", f"{READER_KEY}:translate"]).app
    client = TestClient(app, root_path="/api", raise_server_exceptions=False)
    body = {"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:1])}
    for headers in ({}, _bearer("wrong-key")):
        r = client.post("/api/v1/translate", json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert client.get("/api/v1/stitches", headers=headers).status_code == 401
    r = client.post("/api/v1/translate", json=body, headers=_bearer(READER_KEY))
    assert r.status_code == 200, r.text
    assert client.get("/api/v1/jobs", headers=_bearer(READER_KEY)).status_code == 403
    r = client.get("/api/v1/jobs?bogus=1", headers=_bearer(ADMIN_KEY))
    assert r.status_code == 422, r.text  # an unknown query key, as without a root path
