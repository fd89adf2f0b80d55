"""``lead migrate apply`` killed with SIGKILL at random points resumes and writes every row
exactly once, equal to the in-process translation; the source never changes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from lead.migrate.registry import open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator
from tests.migrate.conftest import checksum, make_table, sql

pytestmark = pytest.mark.slow

ROUNDS = 5
BATCH = 16
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _rows_written(uri: str) -> int:
    if sql(uri, "SELECT to_regclass('lead_migrations')")[0][0] is None:
        return 0
    rows = sql(uri, "SELECT rows_written FROM lead_migrations WHERE target = 'public.k_out.emb'")
    return int(rows[0][0]) if rows else 0


def _command(source: str, target: str) -> list[str]:
    return [
        *(sys.executable, "-m", "lead.cli", "migrate", "apply", source, target),
        *("--stitch", "minilm-to-mpnet", "--batch-size", str(BATCH), "--quiet"),
    ]


def _start(source: str, target: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _command(source, target), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )


def _run(source: str, target: str) -> dict[str, Any]:
    done = subprocess.run(
        _command(source, target), capture_output=True, text=True, env=ENV, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_sigkill_at_random_points_then_resume(pg_uri, scifact_small):
    # 4,000 rows: the 400 real vectors ten times over, each under its own id
    X = np.tile(scifact_small.corpus["minilm"], (10, 1))
    ids = np.arange(len(X), dtype=np.int64) * 5 + 11
    source = make_table(pg_uri, "k_src", ids, X)
    target = with_params(pg_uri, table="k_out", column="emb")
    before = checksum(pg_uri, "k_src")
    rng = random.Random(20261201)
    kills = []
    for _ in range(ROUNDS):
        goal = min(_rows_written(pg_uri) + rng.randint(BATCH, 600), len(X) - BATCH)
        process = _start(source, target)
        deadline = time.monotonic() + 120
        while _rows_written(pg_uri) < goal and process.poll() is None:
            assert time.monotonic() < deadline, "apply made no progress"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.02))  # land anywhere in the next batch
        process.send_signal(signal.SIGKILL)
        process.wait()
        if process.returncode == -signal.SIGKILL:
            kills.append(_rows_written(pg_uri))
    assert len(kills) >= ROUNDS - 1, kills
    assert all(0 < k < len(X) for k in kills), kills
    landed = _rows_written(pg_uri)
    summary = _run(source, target)
    assert (summary["resumed_from"], summary["rows_total"]) == (landed, len(X))
    assert sql(pg_uri, "SELECT count(*), count(DISTINCT id) FROM k_out")[0] == (len(X), len(X))
    with open_target(target) as opened:
        got = opened.fetch(ids)
    expected = LocalTranslator("minilm-to-mpnet")(X)
    assert np.abs(got - expected).max() <= 1e-5
    assert checksum(pg_uri, "k_src") == before
    # a finished migration run again writes nothing
    assert _run(source, target)["rows_written"] == 0
