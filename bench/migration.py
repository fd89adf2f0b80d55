"""Migration cost: translating a stored corpus through the service against re-embedding it.

Translate: the whole SciFact corpus (5,183 source-model vectors) is sent to the running
service in base64 batches of 1,024 by 4 concurrent clients, which also encode the requests
and decode every answer into one array (end to end, client work included; median of 3).
Re-embed: the target model embeds a seeded random sample of documents (title + " " + text)
from text in ``.venv-embed`` (model load and a 2-document warm-up excluded, reported apart),
extrapolated linearly to the corpus.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.common import log
from bench.data import REPO, data_dir, load_scifact
from bench.server import BenchServer
from bench.throughput import BENCH_STITCHES, HEADERS, make_bench_stitches

#: target model → bench stitch that translates into it
TARGETS = {"mpnet": "minilm-to-mpnet", "minilm": "pml3-to-minilm-ridge"}


async def translate_corpus(
    url: str, stitch_id: str, X: np.ndarray, *, batch: int = 1024, concurrency: int = 4
) -> np.ndarray:
    out = np.empty((X.shape[0], 0), np.float32)
    parts: dict[int, np.ndarray] = {}
    starts = list(range(0, X.shape[0], batch))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            while starts:
                start = starts.pop(0)
                rows = X[start : start + batch].astype("<f4")
                body = orjson.dumps(
                    {
                        "stitch": stitch_id,
                        "input": [base64.b64encode(r.tobytes()).decode("ascii") for r in rows],
                        "encoding_format": "base64",
                    }
                )
                response = await client.post("/v1/translate", content=body, headers=HEADERS)
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
                data = orjson.loads(response.content)["data"]
                parts[start] = np.frombuffer(
                    b"".join(base64.b64decode(d["embedding"]) for d in data), "<f4"
                ).reshape(len(data), -1)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    out = np.concatenate([parts[s] for s in sorted(parts)])
    return out


def reembed(model: str, docs: int, embed_python: Path, mpnet_dir: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "MPNET_DIR": str(mpnet_dir),
        "LEAD_SHARED_DATA": str(data_dir()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    # -P: do not put bench/ on sys.path (its modules would shadow the stdlib's)
    cmd = [str(embed_python), "-P", str(REPO / "bench" / "reembed_worker.py"), model, str(docs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"re-embedding with {model} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(*, sample_docs: int, embed_python: Path, mpnet_dir: Path, repeats: int = 3) -> dict:
    import torch

    from lead.artifacts import load_stitch

    scifact = load_scifact()
    folders = make_bench_stitches()
    corpus_docs = len(scifact.corpus_ids["minilm"])
    translate: dict[str, Any] = {}
    with BenchServer(list(folders.values())) as server:
        for target, stitch_id in TARGETS.items():
            src = BENCH_STITCHES[stitch_id][0]
            X = scifact.corpus[src]
            assert X.shape[0] == corpus_docs
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                Y = asyncio.run(translate_corpus(server.url, stitch_id, X))
                times.append(time.perf_counter() - start)
            stitch = load_stitch(folders[stitch_id], dtype=torch.float32)
            with torch.inference_mode():
                expected = stitch(torch.from_numpy(X)).numpy()
            translate[target] = {
                "stitch": stitch_id,
                "docs": X.shape[0],
                "seconds": statistics.median(times),
                "all_seconds": times,
                "max_abs_diff_vs_in_process": float(np.abs(Y - expected).max()),
            }
            log(f"translate corpus -> {target} via {stitch_id}: {statistics.median(times):.2f} s")
    rows = {}
    for target in TARGETS:
        r = reembed(target, sample_docs, embed_python, mpnet_dir)
        r["extrapolated_corpus_s"] = r["encode_s"] / r["docs"] * corpus_docs
        r["translate_corpus_s"] = translate[target]["seconds"]
        r["speedup"] = r["extrapolated_corpus_s"] / translate[target]["seconds"]
        rows[target] = {"reembed": r, "translate": translate[target]}
        log(
            f"re-embed {target}: {r['docs_per_s']:.2f} docs/s -> corpus "
            f"{r['extrapolated_corpus_s']:.0f} s; translate {r['translate_corpus_s']:.2f} s; "
            f"speed-up {r['speedup']:,.0f}x"
        )
    return {"corpus_docs": corpus_docs, "sample_docs": sample_docs, "targets": rows}
