#!/usr/bin/env bash
# Run the whole LEAD bench from a fresh clone (with ../shared beside it):
#   bash bench/run.sh            # full run, < 20 minutes on 2 cores
#   bash bench/run.sh --quick    # smoke run
# Uses .venv (created like the README does when missing) and .venv-embed + .embed-models
# (made by ../shared/data/tools/setup_offline_models.sh when missing). Results: bench/results/
# (--quick: bench/results/quick/, git-ignored, so the committed full-run results stay).
set -euo pipefail
cd "$(dirname "$0")/.."
export BENCH_STARTED_AT=$(date +%s.%N)
SHARED=${LEAD_SHARED_DATA:-../shared/data}
if [ ! -d "$SHARED/scifact/embeddings" ]; then
  echo "bench: the real data is missing at $SHARED (clone ../shared beside the repo)" >&2
  exit 1
fi
bash scripts/setup.sh "test,bench"   # the project's .venv, as the README's commands make it
if [ ! -x .venv-embed/bin/python ] || [ ! -f .embed-models/all-mpnet-base-v2/model.safetensors ]; then
  echo "bench: installing the offline embedding models (.venv-embed, .embed-models)" >&2
  bash "$SHARED/tools/setup_offline_models.sh" .venv-embed .embed-models
fi
exec .venv/bin/python -m bench "$@"
