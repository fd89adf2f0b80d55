#!/usr/bin/env bash
# Create (or reuse) the project virtualenv and install LEAD into it.
# Usage: bash scripts/setup.sh [EXTRAS]   e.g. "service" (default) or "test"
# torch==2.13.0 is installed first so that pip does not pull a multi-GB CUDA build;
# pyproject.toml accepts any torch 2.x, so a machine may bring its own build.
# A venv that already holds this pyproject.toml's install (same extras) is reused as is:
# no pip call, so a restart needs no package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=${1:-service}
VENV=${LEAD_VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.lead-installed-${EXTRAS//[^a-z,]/_}"
WANT=$(sha256sum pyproject.toml | cut -d' ' -f1)
# the `test` extra holds every other one (service, migrate, ...): a venv made for it serves all
installed() {
  [ -x "$VENV/bin/python" ] || return 1
  for stamp in "$STAMP" "$VENV/.lead-installed-test"; do
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$WANT" ]; then return 0; fi
  done
  return 1
}
if installed; then
  exit 0
fi
# one install at a time (two servers started at once share the venv)
exec 9>"$VENV.setup-lock"
if command -v flock >/dev/null; then flock 9; fi
if installed; then
  exit 0
fi
# pip runs quietly: say what the wait is for (a first run was silent for ~2 minutes)
echo "setup: installing lead[$EXTRAS] and torch 2.13.0 into $VENV (the first time: a minute or two)" >&2
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
fi
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
echo "$WANT" > "$STAMP"
echo "setup: done" >&2
