"""Decoding a translate body: the typed decoder against the hand-written parsing it replaced.

``python -m bench.decode [--ref 5359b85] [--rounds 3]`` (from the repository root) writes
``bench/results/decode.json``. Per case, the median milliseconds to turn a
``POST /v1/translate`` body into its options, its route (a 384 → 384 stitch) and the float32
array the stitch takes, or to refuse it, and the growth of the peak resident memory over
one such call:

- one vector and 1,024 × 384, as float JSON and as base64 strings (compact JSON, as httpx
  and orjson write it), and the 1,024 base64 strings in indented JSON;
- hostile 60 MB bodies of 20 million empty vectors (``[]``) or empty strings (the time to
  the 422).

The old code is ``service/`` at ``--ref`` (``git archive``: the compact base64 splitter, the
bracket / quote count and the true / false count), the new one this tree's; each round runs
both, one after the other, in fresh subprocesses, so that they share the machine's load.
Also the line counts of the translate route and of the decoding modules at both.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BENCH, log, machine, time_calls, write_result

REPO = BENCH.parent
D, MAX_VECTORS = 384, 2048
HOSTILE = 20_000_000
ROUTE = "service/routes/translate.py"
OLD_DECODING = (ROUTE, "service/compact_base64.py", "service/encoding.py")
NEW_DECODING = (ROUTE, "service/translate_body.py", "service/encoding.py")


def _bodies() -> dict[str, bytes]:
    import orjson
    import pybase64

    fields = {"stitch": "bench", "encoding_format": "base64"}
    out = {}
    for n in (1, 1024):
        x = np.random.default_rng(n).standard_normal((n, D)).astype(np.float32)
        strings = [pybase64.b64encode(row.tobytes()).decode() for row in x]
        out[f"float {n}x{D}"] = orjson.dumps(
            {**fields, "input": x}, option=orjson.OPT_SERIALIZE_NUMPY
        )
        out[f"base64 {n}x{D}"] = orjson.dumps({**fields, "input": strings})
    out[f"base64 1024x{D}, indented JSON"] = orjson.dumps(
        {**fields, "input": strings}, option=orjson.OPT_INDENT_2
    )
    for name, item in (("empty vectors", b"[]"), ("empty strings", b'""')):
        out[f"hostile: 20M {name} (60 MB)"] = (
            b'{"stitch":"bench","input":[' + (item + b",") * (HOSTILE - 1) + item + b"]}"
        )
    return out


def _registry() -> Any:
    import torch

    from lead.stitches import OrthogonalStitch, StitchInfo
    from service.registry import StitchRegistry

    registry = StitchRegistry(torch.device("cpu"))
    info = StitchInfo(source_model="a", target_model="b")
    registry.register("bench", OrthogonalStitch(D, D, info=info), origin="local")
    return registry


def _old_decoder(registry: Any) -> Callable[[bytes], Any]:
    """The old ``_translate`` up to the forward (the modules are gone from this tree, so
    they are looked up by name)."""
    compact = importlib.import_module("service.compact_base64")
    limits = importlib.import_module("service.limits")
    route = importlib.import_module("service.routes.translate")

    def decode(body: bytes) -> Any:
        split = compact.split_compact_base64(body)
        if split is not None:
            options, _ = route._parse_options(split.fields)
            found = route._find_route(registry, options)
            x = compact.decode_compact_base64(split, found.d_src, MAX_VECTORS)
            if x is not None:
                return x
        limit = limits.VectorLimit(MAX_VECTORS, "input", "in one request")
        limits.refuse_too_many_vectors(body, limit)
        payload = route._parse_json(body)
        options, items = route._parse_options(payload)
        found = route._find_route(registry, options)
        return route._decode_input(body, payload, items, found.d_src, MAX_VECTORS)

    return decode


def _new_decoder(registry: Any) -> Callable[[bytes], Any]:
    module = importlib.import_module("service.translate_body")

    def decode(body: bytes) -> Any:
        return module.decode_request(body, registry, MAX_VECTORS)[1]

    return decode


def _peak_rss_growth_mb(fn: Callable[[], Any]) -> float | None:
    """How far one call of ``fn`` lifts the resident memory above where it was (MB), from
    Linux's high-water mark reset through ``/proc/self/clear_refs``; None elsewhere."""

    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])  # kB
        raise KeyError(key)

    try:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")
        before = status("VmRSS:")
        fn()
        return (status("VmHWM:") - before) / 1024
    except OSError:
        return None


def _worker(which: str) -> dict[str, Any]:
    """Latencies (seconds) and peak memory growth of every case with the ``which`` decoder
    (``service`` on the path is the old or the new tree: see :func:`_run`)."""
    from lead.errors import LimitExceededError

    registry = _registry()
    decode = (_old_decoder if which == "old" else _new_decoder)(registry)
    out: dict[str, Any] = {}
    for case, body in _bodies().items():
        if case.startswith("hostile"):

            def call(body: bytes = body) -> None:
                try:
                    decode(body)
                except LimitExceededError:
                    return
                raise AssertionError("the hostile body was not refused")

            min_time, min_calls = 2.0, 5
        else:
            expected = int(case.split()[1].split("x")[0])
            assert decode(body).shape == (expected, D)

            def call(body: bytes = body) -> None:
                decode(body)

            min_time, min_calls = 1.0, 10
        call()  # warm (the typed decoder is built on its first call)
        out[case] = {
            "seconds": time_calls(call, min_time=min_time, min_calls=min_calls),
            "peak_rss_growth_mb": _peak_rss_growth_mb(call),
        }
    return out


def _run(which: str, tree: Path) -> dict[str, Any]:
    """One worker in a fresh interpreter, with ``tree`` first on the path."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(tree)!r}); "
        f"from bench.decode import _worker; print(json.dumps(_worker({which!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{which} worker failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _lines(ref: str | None, paths: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for path in paths:
        text = (
            subprocess.run(
                ["git", "show", f"{ref}:{path}"], cwd=REPO, capture_output=True, text=True
            ).stdout
            if ref
            else (REPO / path).read_text()
        )
        out[path] = len(text.splitlines())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__)
    parser.add_argument("--ref", default="5359b85", help="git revision of the old code")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, Any]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", args.ref, "service"], cwd=REPO, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        for round_ in range(args.rounds):
            for which, tree in (("old", Path(tmp)), ("new", REPO)):
                for case, result in _run(which, tree).items():
                    kept = runs[which].setdefault(case, {"seconds": [], "peak_rss_growth_mb": []})
                    kept["seconds"].extend(result["seconds"])
                    kept["peak_rss_growth_mb"].append(result["peak_rss_growth_mb"])
            log(f"decode bench: round {round_ + 1}/{args.rounds} done")
    cases: dict[str, dict[str, Any]] = {}
    for case in runs["new"]:
        row: dict[str, Any] = {}
        for which in ("old", "new"):
            run = runs[which][case]
            row[f"{which}_ms"] = float(np.median(run["seconds"]) * 1000)
            growth = [g for g in run["peak_rss_growth_mb"] if g is not None]
            row[f"{which}_peak_rss_growth_mb"] = max(growth) if growth else None
        row["new_over_old"] = row["new_ms"] / row["old_ms"]
        cases[case] = row
        log(
            f"{case}: old {row['old_ms']:.3f} ms, new {row['new_ms']:.3f} ms; peak RSS growth "
            f"old {row['old_peak_rss_growth_mb']} MB, new {row['new_peak_rss_growth_mb']} MB"
        )
    lines = {"old": _lines(args.ref, OLD_DECODING), "new": _lines(None, NEW_DECODING)}
    log(f"lines: {lines}")
    write_result(
        "decode",
        {
            "ref": args.ref,
            "rounds": args.rounds,
            "d": D,
            "max_vectors": MAX_VECTORS,
            "cases": cases,
            "lines": lines,
            "machine": machine(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
