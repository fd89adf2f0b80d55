#!/usr/bin/env bash
# Set up the virtualenv and start the service on the bundled stitches in models/.
# Settings come from LEAD_* environment variables (see README); host/port from HOST/PORT.
# LEAD_EXTRAS=scale installs what replicas on PostgreSQL and Ray need (README, "Several replicas").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${LEAD_EXTRAS:-service}"
# the settings once, before uvicorn: with LEAD_WORKERS > 1 its supervisor would restart
# workers that refuse them forever instead of stopping
"${LEAD_VENV:-.venv}/bin/python" -m service.settings_check
# with several workers, /metrics sums them through PROMETHEUS_MULTIPROC_DIR (see the script)
. scripts/prometheus_dir.sh
# the loop polls its sockets briefly before sleeping (LEAD_BUSY_POLL_US; service/event_loop.py)
exec "${LEAD_VENV:-.venv}/bin/uvicorn" service.app:create_app --factory --host "${HOST:-127.0.0.1}" \
  --port "${PORT:-8000}" --workers "${LEAD_WORKERS:-1}" --timeout-keep-alive "${LEAD_KEEP_ALIVE_S:-75}" \
  --loop service.event_loop:new_event_loop --http service.http_protocol:BoundedHttpToolsProtocol
