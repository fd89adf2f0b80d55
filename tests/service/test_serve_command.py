"""The server commands (``scripts/serve.sh`` and the Docker image) pass uvicorn the
settings that are uvicorn's options, with the settings' own defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: Settings that only the server command reads, as uvicorn options.
UVICORN_OPTIONS = {"workers": "--workers", "keep_alive_s": "--timeout-keep-alive"}


@pytest.mark.parametrize("command", ["scripts/serve.sh", "Dockerfile"])
@pytest.mark.parametrize(("field", "option"), UVICORN_OPTIONS.items())
def test_uvicorn_options_come_from_the_settings_with_their_defaults(
    command: str, field: str, option: str
) -> None:
    text = (ROOT / command).read_text()
    variable = f"LEAD_{field.upper()}"
    found = re.search(rf'{option} "?\$\{{{variable}:-([^}}]+)\}}', text)
    assert found is not None, f"{command} does not pass {option} from {variable}"
    assert found.group(1) == str(Settings.model_fields[field].default)


@pytest.mark.parametrize("command", ["scripts/serve.sh", "Dockerfile"])
@pytest.mark.parametrize(
    "option",
    [
        "--loop service.event_loop:new_event_loop",  # LEAD_BUSY_POLL_US
        "--http service.http_protocol:BoundedHttpToolsProtocol",  # LEAD_MAX_HEADER_BYTES
    ],
)
def test_the_server_runs_the_services_loop_and_protocol(command: str, option: str) -> None:
    """Settings that take effect only through uvicorn's ``--loop`` and ``--http``."""
    assert option in " ".join((ROOT / command).read_text().split()), f"{command}: {option}"
