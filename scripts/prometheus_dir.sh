# Prometheus multiprocess mode for several server processes; sourced by scripts/serve.sh.
#
# Each uvicorn worker counts its own requests. With PROMETHEUS_MULTIPROC_DIR set before the
# workers start, they write their metrics to files in that folder and /metrics sums every
# worker, whichever answers (service/observability.py). The folder must be empty at start:
# - set by you: created when missing, and the *.db files in it (prometheus_client's, from an
#   earlier run) are deleted; nothing else there is touched. Give each server its own folder.
# - unset (or empty) and LEAD_WORKERS > 1: a fresh private folder from `mktemp -d`
#   (lead-metrics.XXXXXX in $TMPDIR or /tmp); a few KB, left behind at exit.
# - unset and one worker: nothing changes (the process's own metrics).
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
  mkdir -p -- "$PROMETHEUS_MULTIPROC_DIR"
  find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -type f -name '*.db' -delete
  export PROMETHEUS_MULTIPROC_DIR
else
  # set but empty would turn prometheus_client's files on in the working directory
  unset PROMETHEUS_MULTIPROC_DIR
  if [ "${LEAD_WORKERS:-1}" -gt 1 ]; then
    PROMETHEUS_MULTIPROC_DIR="$(mktemp -d "${TMPDIR:-/tmp}/lead-metrics.XXXXXX")"
    export PROMETHEUS_MULTIPROC_DIR
  fi
fi
