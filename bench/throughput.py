"""Translate throughput and latency: in-process stitch forward against the HTTP service.

Encodings over HTTP: JSON with float arrays or base64 strings at every batch size, and
Arrow IPC streams (``application/vnd.apache.arrow.stream``, raw float32 both ways) at
batch 8,192 for the ridge 384→384 stitch and the bundled ones (:data:`ARROW_STITCHES`).

In-process is the raw ``stitch(x)`` under ``torch.inference_mode()`` (for a ridge stitch a
float32 matrix product, centring and L2 normalisation; the bundled gated stitches run a
residual MLP and a local stitch with its memory search, and mix them): the limit of this
machine. HTTP is a real
uvicorn process on loopback, driven by ``concurrency`` httpx clients (threads) that each send
the same pre-serialised request body back to back; the clients read every response body in
full (streamed, not kept) but do not parse it in the timed loop (the first, untimed response
of each configuration is parsed and compared with the in-process output). Clients and server
share the machine's cores.
"""

from __future__ import annotations

import base64
import multiprocessing
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import torch

from bench.common import TMP, log, percentile_ms, time_calls
from bench.data import MODEL_IDS, REPO, load_scifact
from bench.server import BenchServer

#: Bench stitch id → (source model key, target model key). The bundled stitches are what
#: the service serves by default (gated: a local stitch and a residual MLP, stored in
#: float16); the ridge
#: ones (fitted on all shared docs) have the cheapest forward, a single matrix product, so
#: the service's own cost weighs most on them: the worst case of the HTTP fraction.
BUNDLED_STITCHES = {"minilm-to-pml3": ("minilm", "pml3"), "minilm-to-mpnet": ("minilm", "mpnet")}
RIDGE_STITCHES = {
    "pml3-to-minilm-ridge": ("pml3", "minilm"),
    "minilm-to-mpnet-ridge": ("minilm", "mpnet"),
}
BENCH_STITCHES = {**BUNDLED_STITCHES, **RIDGE_STITCHES}
HEADERS = {"content-type": "application/json"}
ARROW_HEADERS = {"content-type": "application/vnd.apache.arrow.stream"}
#: Stitches measured with Arrow bodies: the cheapest forward of equal dimensions (ridge
#: 384→384, where the service's own cost weighs most) and the bundled ones.
ARROW_STITCHES = ("pml3-to-minilm-ridge", *BUNDLED_STITCHES)


def stitch_kind(stitch_id: str) -> str:
    """``"bundled"`` or ``"ridge"``."""
    return "bundled" if stitch_id in BUNDLED_STITCHES else "ridge"


def make_bench_stitches() -> dict[str, Path]:
    """The bench stitches' folders: the bundled ones under ``models/``, the ridge ones fitted
    and saved under ``bench/results/tmp/stitches`` (once)."""
    from lead.artifacts import save_stitch
    from lead.fitting import fit_stitch
    from lead.stitches import StitchInfo

    folders = {stitch_id: REPO / "models" / stitch_id for stitch_id in BUNDLED_STITCHES}
    for stitch_id, (src, tgt) in RIDGE_STITCHES.items():
        folder = TMP / "stitches" / stitch_id
        if not (folder / "config.json").exists():
            X, Y, _ = load_scifact().pair(src, tgt)
            info = StitchInfo(source_model=MODEL_IDS[src], target_model=MODEL_IDS[tgt])
            save_stitch(fit_stitch(X, Y, "ridge", info=info), folder)
        folders[stitch_id] = folder
    return folders


def source_batch(stitch_id: str, batch: int) -> np.ndarray:
    """``batch`` real source-model vectors (tiled when the corpus is smaller), float32."""
    src = BENCH_STITCHES[stitch_id][0]
    corpus = load_scifact().corpus[src]
    rows = np.arange(batch) % corpus.shape[0]
    return np.ascontiguousarray(corpus[rows], dtype=np.float32)


def encode_body(stitch_id: str, x: np.ndarray, encoding: str) -> bytes:
    """A translate request body as a client would send it (floats via ``tolist()``; for
    ``"arrow"`` an Arrow IPC stream of one batch, the stitch in :func:`request_path`)."""
    if encoding == "arrow":
        column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
        batch = pa.RecordBatch.from_arrays([column], names=["embedding"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())
    if encoding == "float":
        items: list[Any] = x.tolist()
    else:
        items = [base64.b64encode(row.tobytes()).decode("ascii") for row in x.astype("<f4")]
    return orjson.dumps({"stitch": stitch_id, "input": items, "encoding_format": encoding})


def request_path(stitch_id: str, encoding: str) -> tuple[str, dict[str, str]]:
    """The path (with the query string of an Arrow request) and headers of a request."""
    if encoding == "arrow":
        return f"/v1/translate?stitch={stitch_id}", ARROW_HEADERS
    return "/v1/translate", HEADERS


def decode_response(content: bytes, encoding: str) -> np.ndarray:
    if encoding == "arrow":
        column = pa.ipc.open_stream(content).read_all().column("embedding").combine_chunks()
        return np.asarray(column.flatten().to_numpy()).reshape(len(column), -1)
    data = orjson.loads(content)["data"]
    if encoding == "float":
        return np.asarray([d["embedding"] for d in data], dtype=np.float32)
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data])


@dataclass
class Load:
    """What the clients did in one timed run."""

    latencies: list[float]
    wall: float
    requests: int


def drive(
    url: str,
    body: bytes,
    *,
    concurrency: int,
    min_time: float,
    min_requests: int,
    path: str = "/v1/translate",
    headers: dict[str, str] = HEADERS,
) -> Load:
    """``concurrency`` clients (threads sharing one ``httpx.Client`` with a connection
    each) post ``body`` back to back for ``min_time`` s (and ``min_requests`` requests);
    every response must be 200 and is read in full, streamed and not kept (a load
    generator's job: keeping it would time the client's own copies of it)."""
    latencies: list[float] = []
    errors: list[str] = []
    claimed = 0
    lock = threading.Lock()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url, timeout=600, limits=limits) as client:
        stop = time.perf_counter() + min_time

        def worker() -> None:
            nonlocal claimed
            while not errors:
                with lock:
                    if claimed >= min_requests and time.perf_counter() >= stop:
                        return
                    claimed += 1
                start = time.perf_counter()
                try:
                    with client.stream("POST", path, content=body, headers=headers) as r:
                        if r.status_code != 200:
                            errors.append(f"HTTP {r.status_code}: {r.read()[:500]!r}")
                            return
                        for _ in r.iter_raw():
                            pass
                except httpx.HTTPError as exc:  # a client thread must not die unnoticed
                    errors.append(repr(exc))
                    return
                latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(errors[0])
    return Load(latencies, wall, len(latencies))


def _drive_at(
    args: tuple[str, bytes, int, float, str, dict[str, str], float],
) -> tuple[Load, float]:
    """:func:`drive` in a client process from wall-clock time ``start_at`` on, with the CPU
    seconds the process spent."""
    url, body, concurrency, min_time, path, headers, start_at = args
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    load = drive(
        url,
        body,
        concurrency=concurrency,
        min_time=min_time,
        min_requests=concurrency,
        path=path,
        headers=headers,
    )
    return load, time.process_time() - cpu


def drive_processes(
    url: str,
    body: bytes,
    *,
    concurrency: int,
    processes: int,
    min_time: float,
    path: str,
    headers: dict[str, str],
) -> tuple[Load, float]:
    """:func:`drive` with the ``concurrency`` clients spread over ``processes`` client
    processes that start together: one Python process moving large bodies is bound by its
    own interpreter lock (at batch 8,192 its client threads spent ~13-22 ms of CPU a request,
    as much as the server), and would time itself rather than the server.

    Returns the load (requests and latencies of all processes; ``wall`` the longest) and
    the client processes' CPU seconds."""
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    shares = [share for share in shares if share > 0]
    with multiprocessing.get_context("spawn").Pool(len(shares)) as pool:
        start_at = time.time() + 2.0  # the processes have started and imported by then
        args = [(url, body, share, min_time, path, headers, start_at) for share in shares]
        results = pool.map(_drive_at, args, chunksize=1)
    loads = [load for load, _ in results]
    load = Load(
        [latency for one in loads for latency in one.latencies],
        max(one.wall for one in loads),
        sum(one.requests for one in loads),
    )
    return load, sum(cpu for _, cpu in results)


def in_process(stitch: torch.nn.Module, x: np.ndarray, min_time: float) -> dict[str, Any]:
    """``stitch(x)`` timed with torch's default thread count and with one thread; the faster
    is the in-process figure (the limit), both are kept."""
    tensor = torch.from_numpy(x)
    default = torch.get_num_threads()
    by_threads: dict[str, dict[str, Any]] = {}
    try:
        for threads in sorted({default, 1}, reverse=True):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                for _ in range(3):
                    stitch(tensor)
                latencies = time_calls(lambda: stitch(tensor), min_time=min_time, min_calls=5)
            by_threads[str(threads)] = {
                "vectors_per_s": x.shape[0] * len(latencies) / sum(latencies),
                "p50_ms": percentile_ms(latencies, 50),
                "p99_ms": percentile_ms(latencies, 99),
                "calls": len(latencies),
            }
    finally:
        torch.set_num_threads(default)
    threads, best = max(by_threads.items(), key=lambda kv: kv[1]["vectors_per_s"])
    return {**best, "threads": int(threads), "by_threads": by_threads}


def over_http(
    server: BenchServer,
    stitch_id: str,
    x: np.ndarray,
    expected: np.ndarray,
    encoding: str,
    *,
    concurrency: int,
    min_time: float,
    client_processes: int = 1,
) -> dict[str, Any]:
    """``concurrency`` clients posting ``x`` in ``encoding`` back to back (in
    ``client_processes`` processes, see :func:`drive_processes`), after one untimed request
    whose answer is compared with ``expected``."""
    body = encode_body(stitch_id, x, encoding)
    path, headers = request_path(stitch_id, encoding)
    # untimed warm-up request, whose answer is checked against the in-process output
    response = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"{stitch_id} {encoding} b={len(x)}: {response.text[:500]}")
    got = decode_response(response.content, encoding)
    max_abs_diff = float(np.abs(got - expected).max())
    same_bytes = got.astype(np.float32).tobytes() == expected.astype(np.float32).tobytes()
    cpu_server = server.cpu_seconds()
    if client_processes > 1:
        load, cpu_client = drive_processes(
            server.url,
            body,
            concurrency=concurrency,
            processes=client_processes,
            min_time=min_time,
            path=path,
            headers=headers,
        )
    else:  # in this process, from now on
        load, cpu_client = _drive_at((server.url, body, concurrency, min_time, path, headers, 0.0))
    cpu_server = server.cpu_seconds() - cpu_server
    return {
        "client_processes": client_processes,
        "vectors_per_s": x.shape[0] * load.requests / load.wall,
        "requests_per_s": load.requests / load.wall,
        "p50_ms": percentile_ms(load.latencies, 50),
        "p99_ms": percentile_ms(load.latencies, 99),
        "requests": load.requests,
        "wall_s": load.wall,
        "request_bytes": len(body),
        "response_bytes": len(response.content),
        "server_cpu_ms_per_request": 1000 * cpu_server / load.requests,
        "client_cpu_ms_per_request": 1000 * cpu_client / load.requests,
        "max_abs_diff_vs_in_process": max_abs_diff,
        "same_bytes_as_in_process": same_bytes,
    }


def run(
    *,
    batches: tuple[int, ...],
    encodings: tuple[str, ...] = ("float", "base64"),
    concurrency: int = 4,
    in_process_time: float,
    http_time: float,
    acceptance_rounds_n: int = 3,
    arrow_batch: int | None = 8192,
    stitches: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Every (stitch, batch, encoding) in-process and over HTTP, in the same run (Arrow at
    ``arrow_batch`` for :data:`ARROW_STITCHES`); then ``acceptance_rounds_n`` alternating
    rounds of the acceptance configuration. ``stitches`` limits the run to some of
    :data:`BENCH_STITCHES`."""
    from lead.artifacts import load_stitch

    folders = make_bench_stitches()
    if stitches is not None:
        folders = {stitch_id: folders[stitch_id] for stitch_id in stitches}
    rows: list[dict[str, Any]] = []
    most = max((*batches, arrow_batch or 0, 8192))
    with BenchServer(list(folders.values()), max_vectors=most) as server:
        for stitch_id, folder in folders.items():
            stitch = load_stitch(folder, device="cpu", dtype=torch.float32)
            arrow = arrow_batch is not None and stitch_id in ARROW_STITCHES
            for batch in sorted({*batches, *([arrow_batch] if arrow else [])}):
                x = source_batch(stitch_id, batch)
                with torch.inference_mode():
                    expected = stitch(torch.from_numpy(x)).numpy()
                local = in_process(stitch, x, in_process_time)
                log(f"{stitch_id} b={batch} in-process {local['vectors_per_s']:,.0f} vec/s")
                wanted = list(encodings) if batch in batches else []
                if arrow and batch == arrow_batch:
                    wanted.append("arrow")
                for encoding in wanted:
                    http = over_http(
                        server,
                        stitch_id,
                        x,
                        expected,
                        encoding,
                        concurrency=concurrency,
                        min_time=http_time,
                    )
                    fraction = http["vectors_per_s"] / local["vectors_per_s"]
                    log(
                        f"{stitch_id} b={batch} http/{encoding} {http['vectors_per_s']:,.0f} "
                        f"vec/s p50 {http['p50_ms']:.1f} ms = {fraction:.3f} of in-process"
                    )
                    rows.append(
                        {
                            "stitch": stitch_id,
                            "d_src": stitch.d_src,
                            "d_tgt": stitch.d_tgt,
                            "batch": batch,
                            "encoding": encoding,
                            "in_process": local,
                            "http": http,
                            "fraction_of_in_process": fraction,
                        }
                    )
        check = (
            acceptance_rounds(
                server,
                folders,
                rounds=acceptance_rounds_n,
                in_process_time=in_process_time,
                http_time=http_time,
                concurrency=concurrency,
            )
            if acceptance_rounds_n
            else {}
        )
        arrow_check = (
            acceptance_rounds(
                server,
                {s: folder for s, folder in folders.items() if s in ARROW_STITCHES},
                rounds=acceptance_rounds_n,
                in_process_time=in_process_time,
                http_time=http_time,
                concurrency=concurrency,
                batch=arrow_batch,
                encoding="arrow",
            )
            if acceptance_rounds_n and arrow_batch is not None
            else {}
        )
    return {
        "concurrency": concurrency,
        "acceptance_rounds": check,
        "arrow_batch": arrow_batch,
        "arrow_rounds": arrow_check,
        "in_process_min_time_s": in_process_time,
        "http_min_time_s": http_time,
        "stitches": {k: {"source": v[0], "target": v[1]} for k, v in BENCH_STITCHES.items()},
        "rows": rows,
    }


def acceptance_rounds(
    server: BenchServer,
    folders: dict[str, Path],
    *,
    rounds: int,
    in_process_time: float,
    http_time: float,
    concurrency: int,
    batch: int = 1024,
    encoding: str = "base64",
) -> dict[str, Any]:
    """The acceptance configuration (base64, batch 1024; or another ``encoding`` and
    ``batch``) measured in ``rounds`` alternating in-process / HTTP rounds per stitch; the
    median fraction resists a passing burst of other work on the machine better than one
    sweep measurement."""
    from lead.artifacts import load_stitch

    out: dict[str, Any] = {}
    for stitch_id, folder in folders.items():
        stitch = load_stitch(folder, device="cpu", dtype=torch.float32)
        x = source_batch(stitch_id, batch)
        with torch.inference_mode():
            expected = stitch(torch.from_numpy(x)).numpy()
        fractions, local_vps, http_vps = [], [], []
        for _ in range(rounds):
            local = in_process(stitch, x, in_process_time)
            http = over_http(
                server,
                stitch_id,
                x,
                expected,
                encoding,
                concurrency=concurrency,
                min_time=http_time,
            )
            local_vps.append(local["vectors_per_s"])
            http_vps.append(http["vectors_per_s"])
            fractions.append(http["vectors_per_s"] / local["vectors_per_s"])
        out[stitch_id] = {
            "fractions": fractions,
            "median_fraction": float(np.median(fractions)),
            "in_process_vectors_per_s": local_vps,
            "http_vectors_per_s": http_vps,
        }
        log(f"rounds {stitch_id} b={batch} {encoding}: fractions {np.round(fractions, 3)}")
    return out


def acceptance(result: dict[str, Any], batch: int = 1024) -> dict[str, Any]:
    """The base64 batch-1024 HTTP fraction of in-process per stitch (median of the
    acceptance rounds when there are any, else the sweep's figure), and the worst of each
    kind: the bundled stitches (what the service serves; the figure judged) and the ridge
    ones (the cheapest forward; reported as the worst case)."""
    rounds = result.get("acceptance_rounds") or {}
    fractions = {stitch: r["median_fraction"] for stitch, r in rounds.items()} or {
        row["stitch"]: row["fraction_of_in_process"]
        for row in result["rows"]
        if row["batch"] == batch and row["encoding"] == "base64"
    }
    worst = {
        kind: min((f for s, f in fractions.items() if stitch_kind(s) == kind), default=None)
        for kind in ("bundled", "ridge")
    }
    judged = worst["bundled"]
    return {
        "per_stitch": fractions,
        "kind": {stitch: stitch_kind(stitch) for stitch in fractions},
        "worst": judged,
        "worst_by_kind": worst,
        "passes": judged is not None and judged >= 0.30,
        "source": "median of alternating rounds" if rounds else "sweep",
    }


def arrow_fractions(result: dict[str, Any]) -> dict[str, float]:
    """The Arrow HTTP fraction of in-process per stitch: the median of the alternating
    rounds when there are any, else the sweep's figure."""
    rounds = result.get("arrow_rounds") or {}
    return {stitch: r["median_fraction"] for stitch, r in rounds.items()} or {
        row["stitch"]: row["fraction_of_in_process"]
        for row in result["rows"]
        if row["encoding"] == "arrow"
    }
