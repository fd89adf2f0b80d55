"""Fitting cost: wall time and peak memory of each method for growing numbers of pairs.

Each measurement runs in a fresh subprocess (``python -m bench.fitcost --worker ...``), so
the peak resident set size (which sees torch's allocations, unlike tracemalloc) is not
polluted by earlier fits. The worker loads the pairs, runs one small untimed warm-up fit of
the same method (library initialisation, MKL kernels), resets the kernel's peak-RSS mark
(``/proc/self/clear_refs``; ``resource.getrusage(...).ru_maxrss``, the whole process's
high-water mark, where that is not possible), times the real fit (ridge and Procrustes 3
times, the fastest counts) and reads the peak (``VmHWM``) again: peak RSS during the
fit(s), and its rise over the RSS just before. The fitted stitch's forward is timed too
(batch-invariant, as the service runs it; one vector and 1,024). Every row weighs 1, so a
local or gated stitch keeps every pair in its memory (a gated stitch's gate then sends
nearly everything to its local expert).

Pairs are minilm → mpnet (384 → 768): the SciFact documents both models have (2,560), then
the STS-B sentences (12,935), all real; beyond those 15,495 the set reuses real pairs with
small Gaussian noise (σ = 0.1 / √d per coordinate, rows re-normalised). Every fit runs with
one torch / OpenMP thread (see :data:`THREADS`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import log
from bench.data import REPO, load_scifact, load_stsb

SOURCE, TARGET = "minilm", "mpnet"
NOISE = 0.1
#: torch / OpenMP threads of every fit: on 2 shared cores, two OpenMP threads slow down 5-20x
#: whenever another process takes a core, so one thread gives comparable figures.
THREADS = 1


def pairs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` minilm → mpnet pairs and how many of them are noisy copies."""
    X, Y, _ = load_scifact((SOURCE, TARGET)).pair(SOURCE, TARGET)
    X = np.concatenate([X, load_stsb(SOURCE)])
    Y = np.concatenate([Y, load_stsb(TARGET)])
    real = min(n, X.shape[0])
    if n <= X.shape[0]:
        return X[:n], Y[:n], 0
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, X.shape[0], n - X.shape[0])

    def noisy(A: np.ndarray) -> np.ndarray:
        B = A[rows] + rng.normal(0.0, NOISE / np.sqrt(A.shape[1]), (len(rows), A.shape[1]))
        return (B / np.linalg.norm(B, axis=1, keepdims=True)).astype(np.float32)

    return np.concatenate([X, noisy(X)]), np.concatenate([Y, noisy(Y)]), n - real


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _status_mib(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux only)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def worker(method: str, n: int, options: dict[str, Any], repeats: int) -> dict[str, Any]:
    import torch

    from lead.fitting import fit_stitch

    torch.set_num_threads(THREADS)

    X, Y, noisy = pairs(n)
    fit_stitch(X[:200], Y[:200], method, **options)  # warm-up, untimed
    gc.collect()
    reset = _reset_peak()
    before = _status_mib("VmRSS") if reset else _maxrss_mib()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stitch = fit_stitch(X, Y, method, **options)
        times.append(time.perf_counter() - start)
    # what `lead fit` adds by default: a confidence head (timed only: calibrated on a slice
    # of the same rows, where lead fit uses its held-out rows)
    from lead.confidence import fit_confidence

    held = slice(0, max(50, n // 5))
    start = time.perf_counter()
    fit_confidence(stitch, X, Y, X[held], Y[held], seed=0)
    confidence_seconds = time.perf_counter() - start
    peak = _status_mib("VmHWM") if reset else _maxrss_mib()
    assert before is not None and peak is not None
    forward = _forward_ms(stitch, X)
    return {
        "method": method,
        "pairs": n,
        "noisy_pairs": noisy,
        "options": options,
        "seconds": min(times),
        "all_seconds": times,
        "confidence_seconds": confidence_seconds,
        "peak_rss_mib": peak,
        "rss_before_fit_mib": before,
        "fit_rss_increase_mib": peak - before,
        "process_peak_rss_mib": _maxrss_mib(),
        "peak_measure": "VmHWM reset before the fit" if reset else "ru_maxrss",
        "fit_info": {k: v for k, v in stitch.info.fit.items() if k != "alpha_holdout_mse"},
        "forward_ms": forward,
    }


def _forward_ms(stitch: Any, X: np.ndarray) -> dict[str, float]:
    """The fitted stitch's batch-invariant forward (as the service runs it), one thread:
    median milliseconds for one vector and for 1,024."""
    import torch

    from lead.batch_invariance import forward_batch_invariant

    out = {}
    with torch.inference_mode():
        for rows, calls in ((1, 200), (1024, 10)):
            x = torch.from_numpy(np.ascontiguousarray(X[:rows], dtype=np.float32))
            forward_batch_invariant(stitch, x)  # warm-up
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                forward_batch_invariant(stitch, x)
                times.append(time.perf_counter() - start)
            out[str(rows)] = 1000 * float(np.median(times))
    return out


def run(
    *, sizes: tuple[int, ...], methods: dict[str, dict[str, Any]], closed_form_repeats: int = 3
) -> dict[str, Any]:
    """Every (method, size) in a fresh subprocess; the closed-form fits are timed
    ``closed_form_repeats`` times in that process (the fastest counts: the least disturbed
    by other work), the MLP once."""
    rows = []
    for method, options in methods.items():
        for n in sizes:
            repeats = 1 if method in ("mlp", "gated") else closed_form_repeats
            cmd = [
                sys.executable,
                "-m",
                "bench.fitcost",
                "--repeats",
                str(repeats),
                "--worker",
                method,
                str(n),
                json.dumps(options),
            ]
            start = time.perf_counter()
            env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
            out = subprocess.run(
                cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise RuntimeError(f"fitcost worker {method} {n} failed:\n{out.stderr[-3000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["process_seconds"] = time.perf_counter() - start
            rows.append(row)
            log(
                f"{method} n={n}: {row['seconds']:.2f} s (+{row['confidence_seconds']:.2f} s "
                f"for the confidence head), peak RSS {row['peak_rss_mib']:.0f} MiB "
                f"(+{row['fit_rss_increase_mib']:.0f} MiB during the fit); forward "
                f"{row['forward_ms']['1']:.2f} ms (1 vector) / "
                f"{row['forward_ms']['1024']:.1f} ms (1,024)"
            )
    return {
        "source": SOURCE,
        "target": TARGET,
        "d_src": 384,
        "d_tgt": 768,
        "real_pairs_available": 2560 + 12935,
        "torch_threads": THREADS,
        "noise_sigma_times_sqrt_d": NOISE,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "N", "OPTIONS_JSON"))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    method, n, options = args.worker
    print(json.dumps(worker(method, int(n), json.loads(options), args.repeats)))


if __name__ == "__main__":
    main()
