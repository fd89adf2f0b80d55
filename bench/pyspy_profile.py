"""Where the service's time goes: py-spy samples of the uvicorn process under load.

py-spy (PyPI) is used when on PATH or installed into ``bench/results/tmp/tools`` (the bench
installs it there with pip when missing). The server is sampled while ``concurrency``
clients send one configuration back to back; the raw stacks are folded into self and
inclusive time per function and into the stages of the translate hot path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import TMP, log
from bench.server import BenchServer
from bench.throughput import HEADERS, drive, encode_body, make_bench_stitches, source_batch

#: hot-path stage → pattern matched against a frame ("function (file)"), first match wins
#: when scanning a stack from the leaf upwards.
STAGES = (
    (
        "stitch forward + output finiteness (torch)",
        r"(^Route\.translate |\(lead/stitches\.py\)|\(nn/functional\.py\)|\(torch/)",
    ),
    ("base64 decode of the input", r"^_decode_base64 "),
    ("float JSON input to array", r"^_decode_floats "),
    ("finiteness checks", r"^check_finite "),
    ("output base64 + response JSON (render_embeddings)", r"^(render_embeddings|_base64_rows)"),
    ("request body decode (msgspec, typed)", r"^(decode_request|decode_body|Vectors\.items) "),
    ("routing", r"^_find_route "),
    ("rest of the handler (_translate)", r"^_translate(\.<locals>\.<listcomp>)? \(.*translate\.py"),
    ("HTTP protocol (h11 / httptools)", r"\((.*/)?(h11|httptools)[/_]"),
    ("uvicorn / starlette / fastapi", r"\(.*(uvicorn|starlette|fastapi|anyio)/"),
    ("asyncio event loop", r"\(.*asyncio/"),
    ("thread pool hand-off", r"\(.*(threading|concurrent|_backends/_asyncio)"),
)
#: leaf frames of a thread that waits (py-spy cannot always tell it is idle)
IDLE = re.compile(r"^(Condition\.wait|Queue\.get|Event\.wait|Runner\.run|select|_worker) \(")


def ensure_pyspy() -> str | None:
    found = shutil.which("py-spy")
    local = TMP / "tools" / "bin" / "py-spy"
    if found:
        return found
    if local.exists():
        return str(local)
    log("installing py-spy from PyPI into bench/results/tmp/tools")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--target", str(TMP / "tools"), "py-spy"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or not local.exists():
        log(f"py-spy unavailable: {done.stderr[-500:]}")
        return None
    return str(local)


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(:\d+)?\)$")


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` → ``func (to/file.py)``."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    parts = Path(m["file"]).parts
    return f"{m['func']} ({'/'.join(parts[-2:])})"


def fold(raw: str) -> dict[str, Any]:
    """Self / inclusive shares of busy samples per function and per hot-path stage.

    Stacks whose leaf is a wait (a thread-pool worker blocked on its queue, the event loop
    in ``select``) are counted apart as idle and left out of the shares.
    """
    total = idle = 0
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if "(" in f]
        names = [_frame_name(f) for f in frames]
        if names and IDLE.match(names[-1]):
            idle += n
            continue
        total += n
        if names:
            self_time[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
        stage = "other"
        for name in reversed(names):
            hit = next((s for s, pattern in STAGES if re.search(pattern, name)), None)
            if hit:
                stage = hit
                break
        stages[stage] += n

    def share(counter: Counter[str], top: int) -> list[dict[str, Any]]:
        return [
            {"function": name, "share": count / max(total, 1)}
            for name, count in counter.most_common(top)
        ]

    return {
        "samples": total,
        "idle_samples_excluded": idle,
        "stages": share(stages, len(STAGES) + 1),
        "self": share(self_time, 15),
        "inclusive": share(inclusive, 25),
    }


def run(
    *,
    stitch_id: str = "minilm-to-mpnet-ridge",
    batch: int = 1024,
    encoding: str = "base64",
    seconds: float = 8.0,
    concurrency: int = 4,
) -> dict[str, Any] | None:
    pyspy = ensure_pyspy()
    if pyspy is None:
        return None
    folders = make_bench_stitches()
    body = encode_body(stitch_id, source_batch(stitch_id, batch), encoding)
    out = TMP / f"pyspy-{stitch_id}-{encoding}-{batch}.txt"
    with BenchServer(list(folders.values())) as server:
        httpx.post(f"{server.url}/v1/translate", content=body, headers=HEADERS, timeout=600)
        cmd = [
            pyspy,
            "record",
            "--pid",
            str(server.pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(out),
        ]
        spy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        load = drive(
            server.url, body, concurrency=concurrency, min_time=seconds + 1, min_requests=1
        )
        spy_out, _ = spy.communicate(timeout=120)
    if spy.returncode != 0 or not out.exists():
        log(f"py-spy failed: {spy_out.decode(errors='replace')[-800:]}")
        return {"error": spy_out.decode(errors="replace")[-800:]}
    folded = fold(out.read_text())
    folded.update(
        {
            "stitch": stitch_id,
            "batch": batch,
            "encoding": encoding,
            "concurrency": concurrency,
            "seconds": seconds,
            "requests": load.requests,
            "vectors_per_s": batch * load.requests / load.wall,
            "raw_stacks": str(out.relative_to(TMP.parent.parent.parent)),
        }
    )
    for stage in folded["stages"]:
        log(f"profile {stage['function']}: {stage['share']:.1%}")
    return folded


def stage_breakdown(
    stitch_id: str = "minilm-to-mpnet-ridge", batch: int = 1024, encoding: str = "base64"
) -> dict[str, Any]:
    """Milliseconds per stage of the translate hot path, run serially in this process with
    the service's own code (``service.translate_body``: the typed decode of the body, then
    the vectors to one float32 array), one request at a time, with the service's default
    torch thread count."""
    import numpy as np
    import torch

    from bench.common import time_calls
    from lead.artifacts import load_stitch
    from service.encoding import decode_vectors, render_embeddings
    from service.settings import Settings
    from service.translate_body import decode_body

    stitch = load_stitch(make_bench_stitches()[stitch_id], dtype=torch.float32)
    body = encode_body(stitch_id, source_batch(stitch_id, batch), encoding)
    max_vectors = max(batch, int(Settings.model_fields["max_vectors"].default))
    items = decode_body(body, max_vectors).input.items()
    x = decode_vectors(items, stitch.d_src, check_bools=False)
    with torch.inference_mode():
        y = stitch(torch.from_numpy(x)).numpy()

    def forward() -> None:
        with torch.inference_mode():
            out = stitch(torch.from_numpy(x))
            bool(torch.isfinite(out).all())
            out.numpy()

    stages: dict[str, Callable[[], Any]] = {
        "decode_body (typed msgspec decode of the body)": lambda: decode_body(body, max_vectors),
        "decode_vectors (input → float32 array)": lambda: decode_vectors(
            items, stitch.d_src, check_bools=False
        ),
        "stitch forward + finiteness + numpy": forward,
        "render_embeddings (array → response JSON)": lambda: render_embeddings(y, encoding),  # type: ignore[arg-type]
    }
    out: dict[str, float] = {}
    threads, default = int(Settings.model_fields["torch_threads"].default), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name, fn in stages.items():
            out[name] = float(np.median(time_calls(fn, min_time=0.3, min_calls=5)) * 1000)
    finally:
        torch.set_num_threads(default)
    total = sum(out.values())
    log("serial stages (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return {
        "stitch": stitch_id,
        "batch": batch,
        "encoding": encoding,
        "torch_threads": threads,
        "stage_ms": out,
        "total_ms": total,
        "vectors_per_s_if_serial": batch / total * 1000,
    }
