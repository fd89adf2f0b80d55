"""The GPU path (``LEAD_DEVICE=cuda``): in process, over HTTP, against the copies it makes.

For each stitch, at batch 8,192 of real SciFact source vectors (run on a machine with a
CUDA device; ``python -m bench.gpu``, ``LEAD_SHARED_DATA`` naming a folder with at least
the MiniLM and paraphrase-MiniLM-L3 SciFact embeddings):

* **copies**: the host→device copy of the input and the device→host copy of the output,
  both from and to pinned host memory, timed with CUDA events: what any GPU translation
  of these tensors must move.
* **device forward**: the service's batch-invariant forward (fixed tiles of
  :data:`lead.batch_invariance.CUDA_TILE` rows, each replayed from a CUDA graph) with the
  input already on the device, and the same tiles launched eagerly.
* **in process**: :meth:`service.routing.Route.run` host to host, as the service calls it
  (a NumPy array in, one in pinned memory, the copies queued, one synchronisation at the
  copy back), in float32 and in each reduced precision the stitch allows.
* **HTTP**: a real uvicorn server with ``LEAD_DEVICE=cuda`` on loopback (one process, or
  ``--workers`` processes as ``scripts/serve.sh`` starts them), Arrow IPC bodies (raw
  float32 both ways), ``concurrency`` clients sending the same body back to back; the
  answer must be the in-process answer's bytes; the clients are spread over
  ``--client-processes`` processes (in one, the client's own interpreter lock capped the
  run at ~90 requests a second, whatever the server). In process is one caller.

The issue's figures: HTTP vectors/s over in-process vectors/s (≥ 0.5), and the in-process
time over the copy time (≤ 2).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import RESULTS, TMP, log, machine, percentile_ms, time_calls, write_result
from bench.data import MODEL_IDS, load_scifact
from bench.server import BenchServer
from bench.throughput import over_http

#: Bench stitch id → (source model key, target model key, bundled folder or None for a
#: ridge stitch fitted on the SciFact documents). The ridge 384→384 stitch has the
#: cheapest forward (the service's own cost weighs most); the bundled one is what the
#: service serves by default (a residual MLP and a local stitch with its memory search).
GPU_STITCHES: dict[str, tuple[str, str, Path | None]] = {
    "pml3-to-minilm-ridge": ("pml3", "minilm", None),
    "minilm-to-pml3": ("minilm", "pml3", RESULTS.parents[1] / "models" / "minilm-to-pml3"),
}
BATCH = 8192


def stitch_folder(stitch_id: str) -> Path:
    """The stitch's folder: bundled, or fitted (ridge) and saved under the bench's scratch."""
    from lead.artifacts import save_stitch
    from lead.fitting import fit_stitch
    from lead.stitches import StitchInfo

    src, tgt, bundled = GPU_STITCHES[stitch_id]
    if bundled is not None:
        return bundled
    folder = TMP / "stitches" / stitch_id
    if not (folder / "config.json").exists():
        X, Y, _ = load_scifact((src, tgt)).pair(src, tgt)
        info = StitchInfo(source_model=MODEL_IDS[src], target_model=MODEL_IDS[tgt])
        save_stitch(fit_stitch(X, Y, "ridge", info=info), folder)
    return folder


def source_rows(stitch_id: str, batch: int) -> np.ndarray:
    """``batch`` real source-model documents (tiled), float32, C-contiguous."""
    src = GPU_STITCHES[stitch_id][0]
    corpus = load_scifact((src,)).corpus[src]
    return np.ascontiguousarray(corpus[np.arange(batch) % len(corpus)], dtype=np.float32)


def served_route(folder: Path, stitch_id: str, device: torch.device, dtype: torch.dtype) -> Any:
    """The route the service builds for ``folder`` (its serving copy, frozen)."""
    from lead.artifacts import load_stitch
    from service.routing import Route, StitchEntry, serving_copy

    stitch = serving_copy(load_stitch(folder), device, dtype).freeze()
    return Route((StitchEntry(stitch_id, stitch),), device)


def cuda_ms(fn: Any, *, reps: int) -> float:
    """Median milliseconds of ``fn()`` on the current stream (CUDA events, after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def copies(x: np.ndarray, d_out: int, device: torch.device, reps: int) -> dict[str, float]:
    """Pinned host→device copy of ``x`` and device→pinned host copy of an output of
    ``d_out`` float32 columns, milliseconds (median)."""
    host_in = torch.from_numpy(x).pin_memory()
    on_device = torch.empty(host_in.shape, dtype=torch.float32, device=device)
    out = torch.randn(len(x), d_out, device=device)
    host_out = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)
    h2d = cuda_ms(lambda: on_device.copy_(host_in, non_blocking=True), reps=reps)
    d2h = cuda_ms(lambda: host_out.copy_(out, non_blocking=True), reps=reps)
    return {"h2d_ms": h2d, "d2h_ms": d2h, "copy_ms": h2d + d2h}


def device_forward_ms(route: Any, x: np.ndarray, reps: int, *, graphs: bool = True) -> float:
    """The batch-invariant forward with the input already on the device, milliseconds:
    each tile replayed from a CUDA graph as the service runs it, or (``graphs=False``) the
    same tiles launched eagerly."""
    from lead.batch_invariance import CUDA_TILE, forward_batch_invariant
    from lead.unit_input import scale_to_unit

    entry = route.entries[0]
    on_device = torch.from_numpy(x).to(route.device)

    def eager(y: torch.Tensor) -> torch.Tensor:
        tiles = []
        for i in range(0, len(y), CUDA_TILE):
            part = y[i : i + CUDA_TILE]
            padded = torch.cat([part, part.new_zeros((CUDA_TILE - len(part), part.shape[1]))])
            tiles.append(entry.stitch(padded)[: len(part)])
        return torch.cat(tiles)

    def forward() -> None:
        with torch.inference_mode():
            y, _ = scale_to_unit(entry.stitch, on_device)
            y = y.to(entry.dtype)
            forward_batch_invariant(entry.stitch, y) if graphs else eager(y)

    return cuda_ms(forward, reps=reps)


def in_process(route: Any, x: np.ndarray, min_time: float) -> dict[str, Any]:
    """``route.run(x)`` host to host, as the service calls it."""
    for _ in range(3):
        route.run(x)
    latencies = time_calls(lambda: route.run(x), min_time=min_time, min_calls=10)
    return {
        "vectors_per_s": len(x) * len(latencies) / sum(latencies),
        "p50_ms": percentile_ms(latencies, 50),
        "p99_ms": percentile_ms(latencies, 99),
        "calls": len(latencies),
    }


def run(
    *,
    min_time: float,
    concurrencies: tuple[int, ...],
    worker_counts: tuple[int, ...],
    client_processes: int,
    reps: int,
) -> dict[str, Any]:
    device = torch.device("cuda")
    folders = {stitch_id: stitch_folder(stitch_id) for stitch_id in GPU_STITCHES}
    rows: dict[str, Any] = {}
    expected: dict[str, np.ndarray] = {}
    for stitch_id, folder in folders.items():
        x = source_rows(stitch_id, BATCH)
        route = served_route(folder, stitch_id, device, torch.float32)
        expected[stitch_id] = route.translate(x)
        row: dict[str, Any] = {
            "batch": BATCH,
            "d_src": route.d_src,
            "d_tgt": route.d_tgt,
            **copies(x, route.d_tgt, device, reps),
            "device_forward_ms": device_forward_ms(route, x, reps),
            "device_forward_eager_ms": device_forward_ms(route, x, reps, graphs=False),
            "in_process": {},
        }
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            served = served_route(folder, stitch_id, device, dtype)
            name = str(dtype).removeprefix("torch.")
            result = in_process(served, x, min_time)
            result["runs_in"] = str(served.entries[0].dtype).removeprefix("torch.")
            result["ms_per_batch"] = 1000 * len(x) / result["vectors_per_s"]
            result["over_copy_time"] = result["ms_per_batch"] / row["copy_ms"]
            row["in_process"][name] = result
            log(
                f"{stitch_id} {name} (runs in {result['runs_in']}): in process "
                f"{result['ms_per_batch']:.2f} ms/batch = {result['over_copy_time']:.2f}x the "
                f"copies ({row['copy_ms']:.2f} ms); "
                f"device forward {row['device_forward_ms']:.2f} ms "
                f"({row['device_forward_eager_ms']:.2f} ms launched eagerly)"
            )
        rows[stitch_id] = row
    env = {"LEAD_DEVICE": "cuda"}
    for row in rows.values():
        row["http"] = []
    for workers in worker_counts:
        servers = BenchServer(list(folders.values()), max_vectors=BATCH, env=env, workers=workers)
        with servers as server:
            for stitch_id, row in rows.items():
                x = source_rows(stitch_id, BATCH)
                for concurrency in concurrencies:
                    # in process and over HTTP alternately, side by side
                    local = in_process(
                        served_route(folders[stitch_id], stitch_id, device, torch.float32),
                        x,
                        min_time,
                    )
                    http = over_http(
                        server,
                        stitch_id,
                        x,
                        expected[stitch_id],
                        "arrow",
                        concurrency=concurrency,
                        min_time=min_time,
                        client_processes=min(concurrency, client_processes),
                    )
                    http["workers"] = workers
                    http["concurrency"] = concurrency
                    http["in_process_vectors_per_s"] = local["vectors_per_s"]
                    http["fraction_of_in_process"] = http["vectors_per_s"] / local["vectors_per_s"]
                    row["http"].append(http)
                    log(
                        f"{stitch_id} Arrow b={BATCH} workers={workers} c={concurrency}: "
                        f"{http['vectors_per_s']:,.0f} vec/s = "
                        f"{http['fraction_of_in_process']:.3f} of in process; "
                        f"same bytes {http['same_bytes_as_in_process']}"
                    )
    return {
        "machine": machine(),
        "gpu": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda,
        "stitches": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="server processes (each in turn)"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=4,
        help="processes the HTTP clients are spread over (one Python process would time itself)",
    )
    parser.add_argument("--reps", type=int, default=50, help="CUDA-event repetitions")
    parser.add_argument("--out", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu needs a CUDA device")
    start = time.perf_counter()
    result = run(
        min_time=args.min_time,
        concurrencies=tuple(args.concurrency),
        worker_counts=tuple(args.workers),
        client_processes=args.client_processes,
        reps=args.reps,
    )
    result["seconds"] = round(time.perf_counter() - start, 1)
    path = write_result("gpu", result)
    if args.out is not None:
        args.out.write_text(path.read_text())
    log(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
