"""Store URIs: LEAD's parameters out, the rest to the client as written, secrets never
printed; the stitch identity a migration records; the translator's refusals."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from lead.artifacts import BUNDLED_MODELS_DIR
from lead.errors import InvalidInputError, LeadError, StoreError
from lead.migrate.stores import parse_store_uri
from lead.migrate.translator import LocalTranslator, RemoteTranslator
from tests._http import answering

SECRET = "Hunter2Secret"


@pytest.mark.parametrize(
    "uri",
    [
        f"postgresq://user:{SECRET}@/postgres?table=docs",  # a mistyped scheme
        f"qdrnt://host/c?api_key={SECRET}",
        f"postgresql://user:ab%zz{SECRET}@/postgres?table=docs",  # a bad percent-encoding
        f"postgresql://user:{SECRET}@[bad/db",  # not a URI
    ],
)
def test_refused_uris_never_repeat_a_secret(uri):
    with pytest.raises(InvalidInputError) as caught:
        parse_store_uri(uri)
    assert SECRET not in caught.value.message


@pytest.mark.parametrize("name", ["api_key", "api-key", "password", "pasword", "x_token"])
def test_secret_parameters_are_hidden_even_when_mistyped(name):
    parsed = parse_store_uri(f"qdrant://host:6333/docs?{name}={SECRET}&vector=v")
    assert SECRET not in parsed.uri and f"{name}=***" in parsed.uri
    assert SECRET in parsed.connect  # the client still gets it
    assert parsed.params == {"vector": "v"}


def test_other_parameters_reach_libpq_as_written():
    uri = "postgresql://app@/db?options=-c%20statement_timeout%3D5000&host=/tmp/pg%20x&table=t"
    parsed = parse_store_uri(uri)
    assert "options=-c%20statement_timeout%3D5000" in parsed.connect  # a space stays %20
    assert "host=/tmp/pg%20x" in parsed.connect and "+" not in parsed.connect
    assert parsed.params == {"table": "t"}


def test_the_stitch_digest_covers_config_and_weights(tmp_path):
    folder = tmp_path / "stitch"
    shutil.copytree(BUNDLED_MODELS_DIR / "minilm-to-e5", folder)
    by_id = LocalTranslator("minilm-to-e5").ref.sha256
    assert LocalTranslator(folder).ref.sha256 == by_id  # same files, another name
    config = json.loads((folder / "config.json").read_text())
    config["normalize_output"] = not config.get("normalize_output", False)
    (folder / "config.json").write_text(json.dumps(config))
    assert LocalTranslator(folder).ref.sha256 != by_id


@pytest.mark.parametrize(("device", "message"), [("bogus", "unknown device"), ("tpu", "use cpu")])
def test_bad_devices_are_refused(device, message):
    with pytest.raises(InvalidInputError, match=message):
        LocalTranslator("minilm-to-mpnet", device=device)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_server_that_is_not_there_or_not_lead(tmp_path: Path):
    with pytest.raises(InvalidInputError, match="http"):
        RemoteTranslator("notaurl", "minilm-to-mpnet")
    with pytest.raises(StoreError, match="cannot reach the LEAD server"):
        RemoteTranslator(f"http://127.0.0.1:{_closed_port()}", "minilm-to-mpnet")

    def not_found(method: str, path: str, headers: object, sent: bytes) -> tuple[int, dict, bytes]:
        return 404, {}, b"<html>\n<body>\n<h1>Not Found</h1>\n</body>\n</html>\n"

    with answering(not_found) as url, pytest.raises(LeadError) as caught:
        RemoteTranslator(url, "minilm-to-mpnet")
    message = str(caught.value)
    assert "did not answer as a LEAD server" in message and "\n" not in message
