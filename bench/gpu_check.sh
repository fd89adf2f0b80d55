#!/usr/bin/env bash
# The GPU checks in one run, on a lent CUDA machine whose python3 holds torch but not the
# service's packages: the GPU tests (`-m gpu`) and `python -m bench.gpu`, logs and results
# into $OUT (or ./gpu-out). Before it, on the machine that sends the tree:
#   * `.whl/`: cp312 manylinux wheels of the service's packages missing there (fastapi,
#     starlette, pydantic, pydantic-core, pydantic-settings, python-dotenv, annotated-types,
#     typing-inspection, typing-extensions, uvicorn, httptools, orjson, msgspec, pybase64,
#     python-multipart, fastapi-offline, annotated-doc, opentelemetry-api (fastapi's), and
#     for the tests' client httpx2, httpcore2, truststore, anyio, idna, h11), at the
#     versions of .venv;
#   * `.gpudata/scifact/`: ids.json, qrels/test.tsv and embeddings/{minilm,pml3}.safetensors
#     from ../shared/data/scifact (bench.gpu's inputs; ../shared does not travel).
# The GPU tests and bench.gpu need models/minilm-to-pml3 and no other bundled stitch; the
# tree that travels is limited (64 MiB) and the bundled stitches hold ~180 MB, so keep the
# others out of it for the run (`git rm -r -q --cached models/<id>` and `/models/<id>/` in
# .git/info/exclude, undone with `git reset` and the exclude lines removed).
set -x
out="${OUT:-gpu-out}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 LEAD_SHARED_DATA="$PWD/.gpudata"
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"
# the machine's own packages may warn of deprecations that the pinned ones here do not
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu -rs \
  -W default::DeprecationWarning -W default::PendingDeprecationWarning \
  tests/lead/test_cuda_graphs.py tests/service/test_microbatching.py \
  tests/service/test_routing_paths.py tests/service/test_translate.py 2>&1 | tee "$out/pytest.log"
timeout 330 python3 -m bench.gpu --min-time 2 --concurrency 4 8 16 --workers 1 4 \
  --out "$out/gpu.json" 2>&1 | tee "$out/bench.log"
cp bench/results/tmp/server.log "$out/server.log" 2>/dev/null
true
