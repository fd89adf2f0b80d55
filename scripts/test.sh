#!/usr/bin/env bash
# Set up the virtualenv and run the whole test suite (no network, no GPU needed).
# Tests that need ../shared/data are skipped with a reason when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
