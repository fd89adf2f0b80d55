"""``python -m service.openapi``: write ``openapi.yaml`` from the app's schema, or with
``--check`` exit 1 when the file is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from service.app import create_app
from service.openapi import OPENAPI_PATH
from service.settings import ApiKey, Settings

__all__ = ["main", "render_yaml"]


def render_yaml(schema: dict[str, Any]) -> str:
    """``schema`` as the YAML text of ``openapi.yaml`` (keys in the schema's order)."""
    text: str = yaml.safe_dump(schema, sort_keys=False, allow_unicode=True, width=100)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.openapi", description=__doc__)
    parser.add_argument("--output", type=Path, default=OPENAPI_PATH)
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
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
