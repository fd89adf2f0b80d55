# LEAD translation service: serves the bundled stitches in models/ on port 8000.
#
#   docker build -t lead .                                   # CPU torch (default, slim)
#   docker build -t lead:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 .
#   docker run -p 8000:8000 lead
#   docker run --gpus all -e LEAD_DEVICE=cuda -p 8000:8000 lead:cuda
#
# Settings are LEAD_* environment variables (LEAD_STITCHES, LEAD_API_KEYS, LEAD_DEVICE, ...).
# Hub stitches are cached under HF_HOME; mount a volume there to keep them across restarts.
FROM python:3.11-slim

# The PyTorch wheel index: CPU wheels by default; a CUDA index (cu126, ...) for a GPU image.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first, from its own index, so that the project install below does not pull another build.
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md ./
COPY lead ./lead
COPY service ./service
# EXTRAS=scale for replicas on PostgreSQL and Ray (see the README's "Several replicas")
ARG EXTRAS=service
RUN pip install ".[${EXTRAS}]"

COPY models ./models
COPY scripts/prometheus_dir.sh ./scripts/

RUN useradd --create-home --uid 10001 lead \
    && mkdir -p /data \
    && chown lead:lead /data
USER lead

ENV LEAD_MODELS_DIR=/app/models \
    LEAD_DATA_DIR=/data \
    HF_HOME=/home/lead/.cache/huggingface

EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]

# LEAD_WORKERS server processes; with more than 1, /metrics sums them (prometheus_dir.sh)
CMD ["sh", "-c", "python -m service.settings_check && . scripts/prometheus_dir.sh && exec uvicorn service.app:create_app --factory --host 0.0.0.0 --port 8000 --workers ${LEAD_WORKERS:-1} --timeout-keep-alive ${LEAD_KEEP_ALIVE_S:-75} --loop service.event_loop:new_event_loop --http service.http_protocol:BoundedHttpToolsProtocol"]
