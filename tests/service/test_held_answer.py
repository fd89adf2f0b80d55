"""A bulk answer holds its share of the translate budget until its client has taken it
(``service.held_answer``), on a real ``uvicorn`` process: a client that does not read its
answer keeps others to 429 instead of letting the server's memory grow, and after the body
timeout it loses its connection and the share is free again."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest

from scripts._harness import Server

REPO = Path(__file__).resolve().parents[2]
STITCH = "minilm-to-pml3"  # a bundled stitch, 384 -> 384
ROWS = 8192  # an answer of ~12.6 MB: more than the sockets' buffers hold
TIMEOUT_S = 3.0


def _arrow_body(x: np.ndarray) -> bytes:
    column = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])
    batch = pa.record_batch({"embedding": column})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@pytest.fixture(scope="module")
def body(scifact_small: Any) -> bytes:
    """ROWS real MiniLM vectors (the fixture's documents, repeated) as an Arrow stream."""
    return _arrow_body(np.resize(scifact_small.corpus["minilm"], (ROWS, 384)))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, body: bytes) -> Iterator[Server]:
    """A service whose bulk share of the byte budget holds one such request, not two."""
    limit = int(1.5 * len(body) * 8 / 7)  # the bulk share is 7/8 of it: 1.5 requests
    running = Server(
        tmp_path_factory.mktemp("held") / "data",
        LEAD_STITCHES=orjson.dumps([str(REPO / "models" / STITCH)]).decode(),
        LEAD_ENABLE_JOBS="false",
        LEAD_MAX_TRANSLATE_BYTES_IN_FLIGHT=str(limit),
        LEAD_BODY_TIMEOUT_SECONDS=str(TIMEOUT_S),
    ).start()
    try:
        yield running
    finally:
        running.stop()


def _post(server: Server, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/translate",
        params={"stitch": STITCH},
        content=body,
        headers={"Content-Type": "application/vnd.apache.arrow.stream"},
        timeout=60,
    )


def test_an_unread_answer_holds_its_share_until_the_body_timeout(
    server: Server, body: bytes
) -> None:
    assert _post(server, body).status_code == 200  # one request alone fits
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    reader.connect(("127.0.0.1", server.port))
    try:
        head = (
            f"POST /v1/translate?stitch={STITCH} HTTP/1.1\r\nHost: lead\r\n"
            "Content-Type: application/vnd.apache.arrow.stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        reader.sendall(head.encode() + body)
        # its answer has begun (the forward is over), and it reads no further
        assert select.select([reader], [], [], 60)[0], "no answer began"
        assert reader.recv(1, socket.MSG_PEEK) == b"H"
        held = _post(server, body)
        assert held.status_code == 429, held.text[:200]  # was 200: the share was freed
        assert held.json()["error"]["code"] == "overloaded"
        # after the body timeout the server gives the answer up and frees the share
        deadline = time.monotonic() + TIMEOUT_S + 20
        while (again := _post(server, body)).status_code == 429:
            assert time.monotonic() < deadline, "the share was never freed"
            time.sleep(0.5)
        assert again.status_code == 200, again.text[:200]
        got = 0
        reader.settimeout(10)
        try:
            while chunk := reader.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass
        assert got < ROWS * 384 * 4  # closed before the whole answer (its vectors alone)
    finally:
        reader.close()
    assert "Traceback" not in server.log.read_text()
