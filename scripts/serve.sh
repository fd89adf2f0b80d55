#!/usr/bin/env bash
# Set up the virtualenv and start the service on the bundled stitches in models/.
# Settings come from LEAD_* environment variables (see README); host/port from HOST/PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh service
exec .venv/bin/uvicorn service.app:create_app --factory --host "${HOST:-127.0.0.1}" \
  --port "${PORT:-8000}" --workers "${LEAD_WORKERS:-1}"
