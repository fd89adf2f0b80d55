"""Start the real service (uvicorn in a subprocess on loopback) for the bench, and stop it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

from bench.common import TMP
from bench.data import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc), else 0."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def worker_pids(folder: Path) -> set[str]:
    """The server processes that have written metrics to ``folder`` (prometheus-client's
    multiprocess mode names each process's files after its pid)."""
    return {p.stem.rsplit("_", 1)[1] for p in folder.glob("*.db")}


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


class BenchServer:
    """``uvicorn service.app:create_app --factory`` serving ``stitches`` on 127.0.0.1.

    Limits are raised for the bench: 8,192+ vectors per request, 1 GiB bodies, 2 GiB of
    bodies in flight (the clients never exceed it, so no 429s distort the figures). Jobs are off (a
    translation-only replica); everything else, torch threads included, is the default.
    With ``workers`` > 1, ``uvicorn --workers`` as ``scripts/serve.sh`` starts it, ready once
    every worker serves.
    """

    def __init__(
        self,
        stitches: list[Path],
        *,
        max_vectors: int = 8192,
        env: dict[str, str] | None = None,
        workers: int = 1,
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stitches = stitches
        self.max_vectors = max_vectors
        self.extra_env = dict(env or {})
        self.workers = workers
        self.metrics_dir = TMP / f"metrics-{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = TMP / "server.log"

    def __enter__(self) -> BenchServer:
        TMP.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "LEAD_STITCHES": json.dumps([str(p) for p in self.stitches]),
            "LEAD_DEVICE": "cpu",
            "LEAD_MAX_VECTORS": str(self.max_vectors),
            "LEAD_MAX_BODY_BYTES": str(1 << 30),
            "LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT": str(1 << 31),
            "LEAD_DATA_DIR": str(TMP / "lead-data"),
            "LEAD_LOAD_IN_BACKGROUND": "false",
            # a translation-only replica: no job runner process beside the server
            "LEAD_ENABLE_JOBS": "false",
            "LEAD_LOG_LEVEL": "WARNING",
            "LEAD_WORKERS": str(self.workers),
            **self.extra_env,
        }
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if self.workers > 1:  # as scripts/serve.sh
            self.metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            "service.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--workers",
            str(self.workers),
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
                if ready and (
                    self.workers == 1 or len(worker_pids(self.metrics_dir)) >= self.workers
                ):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"server not ready in 120 s: {self.log_path.read_text()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process and its workers so far (Linux
        /proc), else 0."""
        return cpu_seconds(self.pid) + sum(cpu_seconds(c) for c in _children(self.pid))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
