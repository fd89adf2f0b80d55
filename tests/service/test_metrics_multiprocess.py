"""``/metrics`` with several uvicorn workers: prometheus_client's multiprocess mode.

Real processes: ``uvicorn --workers 2`` on a loopback port with ``PROMETHEUS_MULTIPROC_DIR``
set, as ``scripts/serve.sh`` starts it for ``LEAD_WORKERS`` > 1. Whichever worker answers
the scrape, ``/metrics`` must count the requests that every worker served.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from scripts._harness import alive, free_port
from service.observability import Metrics

REPO = Path(__file__).resolve().parents[2]
STITCH = "minilm-to-pml3"  # a bundled stitch (models/), 384 -> 384
JSON = {"content-type": "application/json"}
TRANSLATE = 'lead_http_requests_total{method="POST",route="/v1/translate",status="200"}'


@pytest.fixture()
def two_workers(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, multiprocess folder) of ``uvicorn --workers 2`` serving the stitch, on the
    polling event loop (``service.event_loop``) as ``scripts/serve.sh`` runs it."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(folder),
        "LEAD_STITCHES": orjson.dumps([str(REPO / "models" / STITCH)]).decode(),
        "LEAD_ENABLE_JOBS": "false",
        "LEAD_WORKERS": "2",
        "LEAD_DEVICE": "cpu",
        "LEAD_LOAD_IN_BACKGROUND": "false",
        "LEAD_LOG_LEVEL": "WARNING",
        "LEAD_DATA_DIR": str(tmp_path / "data"),
    }
    command = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    command += ["--log-level", "warning", "--no-access-log"]
    command += ["--loop", "service.event_loop:new_event_loop"]  # as scripts/serve.sh runs it
    command += ["--http", "service.http_protocol:BoundedHttpToolsProtocol"]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        # both workers started: each wrote its files (unlabelled metrics) at start-up
        while len({p.stem.rsplit("_", 1)[1] for p in folder.glob("*.db")}) < 2 or not _ready(url):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"not ready in 120 s: {log.read_text()}"
            time.sleep(0.2)
        yield url, folder
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _counted_by_pid(folder: Path, route: str, method: str = "POST") -> dict[int, float]:
    """Requests answered 200 on ``route`` per worker process, from its own counter file."""
    counts: dict[int, float] = {}
    for path in folder.glob("counter_*.db"):
        if path.stat().st_size == 0:  # created, not yet sized (as the service skips it)
            continue
        for metric in MultiProcessCollector.merge([str(path)]):  # type: ignore[no-untyped-call]
            for sample in metric.samples:
                wanted = {"route": route, "method": method, "status": "200"}
                if sample.name == "lead_http_requests_total" and sample.labels == wanted:
                    counts[int(path.stem.split("_")[1])] = sample.value
    return counts


def _wait_counted(folder: Path, route: str, method: str, sent: int) -> dict[int, float]:
    """The counts per process once all ``sent`` requests are counted (each is, just after
    its last byte is sent)."""
    deadline = time.monotonic() + 10
    while sum((by_pid := _counted_by_pid(folder, route, method)).values()) < sent:
        assert time.monotonic() < deadline, f"{by_pid} for {sent} requests"
        time.sleep(0.05)
    return by_pid


def _scrape(url: str, sample: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert match is not None, text
    return float(match.group(1))


def test_metrics_count_the_requests_of_every_worker(two_workers: tuple[str, Path]) -> None:
    url, folder = two_workers
    vector = np.random.default_rng(0).standard_normal(384).astype("<f4")
    body = orjson.dumps(
        {
            "stitch": STITCH,
            "input": [base64.b64encode(vector.tobytes()).decode()],
            "encoding_format": "base64",
        }
    )

    def burst(_: int) -> int:
        # a fresh connection per client, so that either worker may accept it
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(10):
                r = client.post("/v1/translate", content=body, headers=JSON)
                assert r.status_code == 200, r.text
        return 10

    sent = 0
    deadline = time.monotonic() + 60
    with ThreadPoolExecutor(8) as pool:
        # until both workers have served some (the kernel picks who accepts a connection)
        while len(_counted_by_pid(folder, "/v1/translate")) < 2 and time.monotonic() < deadline:
            sent += sum(pool.map(burst, range(8)))
    by_pid = _wait_counted(folder, "/v1/translate", "POST", sent)
    assert len(by_pid) == 2, f"one worker served all {sent} requests: {by_pid}"
    assert sum(by_pid.values()) == sent
    # the sum over both workers, whichever answers; scraped several times to hit both
    for _ in range(6):
        assert _scrape(url, TRANSLATE) == sent
    # vectors translated (one per request) and the latency histogram are aggregated too
    assert _scrape(url, f'lead_vectors_translated_total{{stitch="{STITCH}"}}') == sent
    count = 'lead_http_request_duration_seconds_count{method="POST",route="/v1/translate"}'
    assert _scrape(url, count) == sent
    # in flight: the scrape itself, in one live worker (a livesum gauge, not a stale sum)
    assert _scrape(url, "lead_http_requests_in_flight") == 1
    assert _scrape(url, 'lead_stitches{state="ready"}') == 1


def _in_flight_by_pid(folder: Path) -> dict[int, float]:
    counts: dict[int, float] = {}
    for path in folder.glob("gauge_livesum_*.db"):
        for metric in MultiProcessCollector.merge([str(path)]):  # type: ignore[no-untyped-call]
            for sample in metric.samples:
                if sample.name == "lead_http_requests_in_flight":
                    counts[int(path.stem.rsplit("_", 1)[1])] = sample.value
    return counts


def test_a_worker_killed_mid_request_leaves_no_stale_gauge(two_workers: tuple[str, Path]) -> None:
    """uvicorn replaces a dead worker but has no hook to tell prometheus_client: the scrape
    drops the dead process's live gauges itself, and keeps its counts."""
    url, folder = two_workers
    healthz = 'lead_http_requests_total{method="GET",route="/healthz",status="200"}'
    deadline, sent = time.monotonic() + 60, 0

    def get(_: int) -> int:  # a fresh connection each
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        return 1

    with ThreadPoolExecutor(8) as pool:
        while len(_counted_by_pid(folder, "/healthz", "GET")) < 2:  # both workers served
            assert time.monotonic() < deadline
            sent += sum(pool.map(get, range(16)))
    _wait_counted(folder, "/healthz", "GET", sent)
    # a request whose body never finishes: in flight in whichever worker accepted it
    port = int(url.rsplit(":", 1)[1])
    stuck = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/translate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    stuck.sendall(f"{head}Content-Length: 1000\r\n\r\n{{".encode())
    while not (busy := [p for p, n in _in_flight_by_pid(folder).items() if n == 1]):
        assert time.monotonic() < deadline, _in_flight_by_pid(folder)
        time.sleep(0.05)
    os.kill(busy[0], signal.SIGKILL)
    stuck.close()
    while alive(busy[0]):  # SIGKILL lands asynchronously (a zombie counts as gone)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # only the scrape itself is in flight (the other worker answers), not the dead request
    assert _scrape(url, "lead_http_requests_in_flight") == 1
    assert not (folder / f"gauge_livesum_{busy[0]}.db").exists()
    # its counts stay: a counter never goes down
    assert (folder / f"counter_{busy[0]}.db").exists()
    assert _scrape(url, healthz) == sent


def test_without_the_variable_each_app_keeps_its_own_metrics() -> None:
    """Tests build many apps in one process: their counts must not mix."""
    one, other = Metrics(), Metrics()
    assert one.multiprocess_dir is None
    one.requests.labels("/healthz", "GET", "200").inc(3)
    assert b'route="/healthz"' in one.exposition()
    assert b'route="/healthz"' not in other.exposition()


def test_a_worker_file_not_yet_sized_is_skipped(tmp_path: Path) -> None:
    """A worker creates its file at 0 bytes and sizes it a moment later; a scrape in between
    raised struct.error (a 500 on /metrics, seen in CI; prometheus/client_python#1199)."""
    written = MmapedDict(str(tmp_path / "counter_4242.db"))
    key = mmap_key("lead_jobs", "lead_jobs_total", ["status"], ["ok"], "Jobs.")
    written.write_value(key, 3.0, 0.0)
    written.close()
    (tmp_path / "counter_4243.db").touch()  # created, not yet sized
    text = Metrics(multiprocess_dir=tmp_path).exposition()
    assert b'lead_jobs_total{status="ok"} 3.0' in text


def test_a_variable_set_too_late_or_naming_no_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process imported prometheus_client without the variable: setting it now would
    leave the values in memory, so the scrape would read an empty folder."""
    for value in (str(tmp_path / "missing"), ""):  # "": prometheus_client's files in the CWD
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", value)
        with pytest.raises(RuntimeError, match="is not a folder"):
            Metrics()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="set after prometheus_client was imported"):
        Metrics()


def _prepare(env: dict[str, str]) -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` after ``scripts/prometheus_dir.sh`` (as serve.sh sources it)."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | env
    script = '. scripts/prometheus_dir.sh; printf %s "${PROMETHEUS_MULTIPROC_DIR-unset}"'
    done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_serve_sh_gives_several_workers_a_fresh_folder(tmp_path: Path) -> None:
    for unset in ({}, {"PROMETHEUS_MULTIPROC_DIR": ""}):
        assert _prepare({"LEAD_WORKERS": "1", **unset}) == "unset"
        first = _prepare({"LEAD_WORKERS": "2", "TMPDIR": str(tmp_path), **unset})
        second = _prepare({"LEAD_WORKERS": "2", "TMPDIR": str(tmp_path), **unset})
        assert first != second
        for folder in (Path(first), Path(second)):
            assert folder.parent == tmp_path and folder.is_dir() and not any(folder.iterdir())
            assert folder.stat().st_mode & 0o077 == 0  # private


def test_serve_sh_empties_a_given_folder_of_metric_files_only(tmp_path: Path) -> None:
    folder = tmp_path / "metrics"
    assert _prepare({"PROMETHEUS_MULTIPROC_DIR": str(folder), "LEAD_WORKERS": "2"}) == str(folder)
    assert folder.is_dir()
    for name in ("counter_123.db", "gauge_livesum_123.db", "notes.txt"):
        (folder / name).write_bytes(b"x")
    (folder / "sub").mkdir()
    (folder / "sub" / "keep.db").write_bytes(b"x")
    assert _prepare({"PROMETHEUS_MULTIPROC_DIR": str(folder), "LEAD_WORKERS": "1"}) == str(folder)
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert left == ["notes.txt", "sub", "sub/keep.db"]
