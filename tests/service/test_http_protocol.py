"""A request's line and headers are bounded (``service.http_protocol``): 431 in the error
envelope, before a huge head is in memory, and the next request is served as usual.

A real ``uvicorn`` process on a loopback port, started as ``scripts/serve.sh`` starts it
(``--loop`` and ``--http`` of the service), with ``LEAD_MAX_HEADER_BYTES`` at its minimum.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from scripts._harness import Server

REPO = Path(__file__).resolve().parents[2]
STITCH = "minilm-to-pml3"  # a bundled stitch (models/)
LIMIT = 8192


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(host, port) of the service, its heads bounded to :data:`LIMIT` bytes."""
    running = Server(
        tmp_path_factory.mktemp("http") / "data",
        options=(
            "--no-access-log",
            "--loop",  # as scripts/serve.sh runs it
            "service.event_loop:new_event_loop",
            "--http",
            "service.http_protocol:BoundedHttpToolsProtocol",
        ),
        LEAD_STITCHES=orjson.dumps([str(REPO / "models" / STITCH)]).decode(),
        LEAD_ENABLE_JOBS="false",
        LEAD_MAX_HEADER_BYTES=str(LIMIT),
    ).start()
    try:
        yield "127.0.0.1", running.port
    finally:
        running.stop()


def _request(header_bytes: int) -> bytes:
    """A GET /healthz whose Authorization header holds ``header_bytes`` bytes."""
    return (
        b"GET /healthz HTTP/1.1\r\nHost: lead\r\nAuthorization: Bearer "
        + b"a" * header_bytes
        + b"\r\n\r\n"
    )


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {name.lower(): value for name, value in headers.items()}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_head_beyond_the_limit_gets_431_in_the_envelope(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=10) as sock:
        sock.sendall(_request(4 * LIMIT))
        status, headers, body = _read_response(sock)
        assert status == 431
        assert headers["content-type"] == "application/json"
        error = orjson.loads(body)["error"]
        assert error["code"] == "headers_too_large"
        assert error["type"] == "invalid_request_error"
        assert str(LIMIT) in error["message"]
        assert _closed(sock)
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_a_huge_head_is_refused_while_it_arrives(server: tuple[str, int]) -> None:
    """The answer comes after the limit, not after the whole head: the client is still
    sending (64 MiB) when the connection is refused and closed."""
    chunk = b"a" * 65536
    sent = 0
    with socket.create_connection(server, timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: lead\r\nAuthorization: Bearer ")
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 16 * 1024 * 1024, f"the server read {sent} bytes of one head"
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_heads_under_the_limit_are_served_and_counted_per_request(
    server: tuple[str, int],
) -> None:
    """Three requests of 0.7 times the limit each on one keep-alive connection: each head
    is counted on its own (together they are twice the limit)."""
    with socket.create_connection(server, timeout=10) as sock:
        for _ in range(3):
            sock.sendall(_request(int(0.7 * LIMIT)))
            status, _, body = _read_response(sock)
            assert status == 200, body
        sock.sendall(_request(2 * LIMIT))  # then one too large, on the same connection
        status, _, body = _read_response(sock)
        assert status == 431, body


@pytest.mark.parametrize("split", [False, True], ids=["one write", "head end split"])
def test_a_large_body_after_a_small_head_is_not_counted(
    server: tuple[str, int], split: bool
) -> None:
    """A 256 KiB body arriving with its head (one write), or right after the head's blank
    line was split between two writes (its last byte with the body): the body is not
    counted as head bytes."""
    vector = [0.05] * 384
    body = orjson.dumps({"stitch": STITCH, "input": [vector]})
    body += b" " * (256 * 1024 - len(body))  # JSON whitespace
    head = (
        "POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(server, timeout=10) as sock:
        if split:
            sock.sendall(head[:-1])
            time.sleep(0.2)  # the server reads the head without its last byte
            sock.sendall(head[-1:] + body)
        else:
            sock.sendall(head + body)
        status, _, answer = _read_response(sock)
    assert status == 200, answer
    assert orjson.loads(answer)["usage"] == {"vectors": 1}
