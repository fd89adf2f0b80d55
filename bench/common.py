"""Shared helpers: results folder, timers, percentiles, machine facts."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"  # the committed results of full runs
QUICK_RESULTS = RESULTS / "quick"  # git-ignored: a --quick run's results, never committed
TMP = RESULTS / "tmp"  # git-ignored scratch: bench stitches, server logs, profiles

_results_dir = RESULTS  # where this run writes and reads: see use_results_dir


def use_results_dir(folder: Path) -> None:
    """Write and read this run's results (JSON, plots, SUMMARY.md) in ``folder``."""
    global _results_dir
    _results_dir = folder


def results_dir() -> Path:
    """This run's results folder: :data:`RESULTS`, or :data:`QUICK_RESULTS` for a quick run."""
    return _results_dir


def write_result(name: str, payload: dict[str, Any]) -> Path:
    """Write ``<results_dir()>/<name>.json`` (pretty, stable key order)."""
    results_dir().mkdir(parents=True, exist_ok=True)
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=_default) + "\n")
    return path


def read_result(name: str) -> dict[str, Any] | None:
    path = results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def percentile_ms(latencies_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies_s), q) * 1000.0) if latencies_s else 0.0


def time_calls(
    fn: Callable[[], Any], *, min_time: float, min_calls: int = 5, max_calls: int = 100_000
) -> list[float]:
    """Call ``fn`` until ``min_time`` seconds and ``min_calls`` calls; latencies in seconds."""
    latencies: list[float] = []
    stop = time.perf_counter() + min_time
    while len(latencies) < max_calls and (len(latencies) < min_calls or time.perf_counter() < stop):
        start = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - start)
    return latencies


def machine() -> dict[str, Any]:
    """CPU, threads, load and library versions, stored with every result."""
    import torch

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


class Section:
    """Times a bench section and records the 1-minute load average before and after."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.info: dict[str, Any] = {}

    def __enter__(self) -> Section:
        self.start = time.perf_counter()
        self.info["loadavg_before"] = round(os.getloadavg()[0], 2)
        print(f"\n== {self.name} ==", flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.info["seconds"] = round(time.perf_counter() - self.start, 1)
        self.info["loadavg_after"] = round(os.getloadavg()[0], 2)
        print(f"== {self.name}: {self.info['seconds']} s ==", flush=True)


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)
