"""Shared pieces of the job scripts: a real uvicorn server on loopback, the SciFact dataset.

Not a test module; used by ``scripts/measure_job_latency.py`` and ``scripts/kill9_check.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from safetensors.numpy import load_file, save

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
MODEL_IDS = {
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
    "e5": "intfloat/multilingual-e5-small",
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
    "pml3": "sentence-transformers/paraphrase-MiniLM-L3-v2",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``uvicorn service.app:create_app --factory`` in a child process, on 127.0.0.1."""

    def __init__(self, data_dir: Path, *, options: tuple[str, ...] = (), **env: str) -> None:
        self.data_dir = data_dir
        self.options = options  # more uvicorn options
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "LEAD_DATA_DIR": str(data_dir),
            "LEAD_STITCHES": "[]",
            "LEAD_DEVICE": "cpu",
            "LEAD_LOAD_IN_BACKGROUND": "false",
            "LEAD_LOG_LEVEL": "WARNING",
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 120.0) -> Server:
        command = [
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
            *self.options,
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not start in {timeout} s; see {self.log}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        """Process ids of the server's child processes (Linux /proc)."""
        pids: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            text = (task / "children").read_text().split()
            pids += [int(p) for p in text]
        return pids

    def kill9(self) -> None:
        """SIGKILL the server process (its workers notice and exit by themselves)."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def scifact_pairs(source: str = "minilm", target: str = "e5") -> dict[str, Any]:
    """All 5,183 SciFact documents embedded by two models, with queries and test qrels."""
    root = SHARED_DATA / "scifact"
    a = load_file(root / "embeddings" / f"{source}.safetensors")
    b = load_file(root / "embeddings" / f"{target}.safetensors")
    ids = json.loads((root / "ids.json").read_text())
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        query, doc, grade = line.split("\t")
        qrels.setdefault(query, {})[doc] = int(grade)
    return {
        "source": a["corpus"],
        "target": b["corpus"],
        "source_queries": a["queries"],
        "target_queries": b["queries"],
        "query_ids": ids["queries"],
        "corpus_ids": ids["corpus"],
        "qrels": qrels,
        "source_model": MODEL_IDS[source],
        "target_model": MODEL_IDS[target],
    }


def dataset_file(pairs: dict[str, Any], *, retrieval: bool = True) -> bytes:
    """The pairs as a dataset file (``.safetensors``) for ``POST /v1/datasets``."""
    tensors = {k: np.ascontiguousarray(pairs[k]) for k in ("source", "target")}
    metadata = {"source_model": pairs["source_model"], "target_model": pairs["target_model"]}
    if retrieval:
        tensors["source_queries"] = np.ascontiguousarray(pairs["source_queries"])
        tensors["target_queries"] = np.ascontiguousarray(pairs["target_queries"])
        metadata.update({k: json.dumps(pairs[k]) for k in ("query_ids", "corpus_ids", "qrels")})
    return save(tensors, metadata=metadata)


def wait_job(client: httpx.Client, job_id: str, until: Any = None, timeout: float = 900) -> Any:
    done = until or (lambda job: job["status"] in ("succeeded", "failed", "cancelled"))
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if done(job) or job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(job)
        time.sleep(0.1)
