"""/docs, /redoc and /openapi.json: served offline (assets from this server) and without
an API key even when keys are configured; the schema declares the bearer scheme."""

from __future__ import annotations

import re
from typing import Any

import pytest
from service_helpers import no_network

KEYS = ["key-one", "key-two"]

#: Every URL an HTML page loads or links to: src=, href=, Swagger's url:, ReDoc's spec-url=.
_URLS = re.compile(r"""(?:\bsrc|\bhref|\bspec-url)\s*=\s*["']([^"']+)|\burl:\s*["']([^"']+)""")

_CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


def _urls(html: str) -> list[str]:
    return [a or b for a, b in _URLS.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets_without_a_key(
    make_client: Any, page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make_client(api_keys=KEYS)
    with no_network(monkeypatch):
        r = client.get(page)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/html")
        urls = _urls(r.text)
        assert "/openapi.json" in urls
        assets = [url for url in urls if url != "/openapi.json"]
        assert any(url.endswith(".js") for url in assets), urls
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url}"
        assert "http://" not in r.text and "https://" not in r.text  # no CDN, no fonts
        for url in assets:
            asset = client.get(url)  # no Authorization header
            assert asset.status_code == 200, (url, asset.text)
            suffix = url[url.rfind(".") :]
            assert _CONTENT_TYPES[suffix] in asset.headers["content-type"], url
            assert len(asset.content) > 1000, url


def test_schema_is_open_and_declares_the_bearer_scheme(make_client: Any) -> None:
    client = make_client(api_keys=KEYS)
    r = client.get("/openapi.json")
    assert r.status_code == 200, r.text
    schema = r.json()
    schemes = schema["components"]["securitySchemes"]
    bearer = {
        name for name, s in schemes.items() if (s["type"], s.get("scheme")) == ("http", "bearer")
    }
    assert bearer, schemes  # Swagger UI shows "Authorize" for it
    translate = schema["paths"]["/v1/translate"]["post"]
    assert {name for requirement in translate["security"] for name in requirement} <= bearer
    assert "security" not in schema["paths"]["/healthz"]["get"]


def test_the_api_still_needs_the_key(make_client: Any) -> None:
    client = make_client(api_keys=KEYS)
    for path in ("/v1/info", "/v1/stitches"):
        r = client.get(path)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    ok = client.get("/v1/info", headers={"Authorization": f"Bearer {KEYS[1]}"})
    assert ok.status_code == 200, ok.text


def test_an_unknown_asset_is_a_404_envelope(make_client: Any) -> None:
    client = make_client(api_keys=KEYS)
    for path in ("/docs-assets/nothing.js", "/docs-assets/../service/settings.py"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["code"] == "not_found"
