"""A request's line and headers are bounded (``service.http_protocol``): 431 in the error
envelope, before a huge head is in memory, and the next request is served as usual.

A real ``uvicorn`` process on a loopback port, started as ``scripts/serve.sh`` starts it
(``--loop`` and ``--http`` of the service), with ``LEAD_MAX_HEADER_BYTES`` at its minimum.
"""

from __future__ import annotations

import base64
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import numpy as np
import orjson
import pytest

from scripts._harness import Server

REPO = Path(__file__).resolve().parents[2]
STITCH = "minilm-to-pml3"  # a bundled stitch (models/)
LIMIT = 8192
HEAD_TIMEOUT = 1.5  # seconds; every other test sends its heads within it


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
        LEAD_HEADER_TIMEOUT_SECONDS=str(HEAD_TIMEOUT),
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


def _translate_body(pad_to: int = 0) -> bytes:
    body = orjson.dumps({"stitch": STITCH, "input": [[0.05] * 384]})
    return body + b" " * max(0, pad_to - len(body))  # JSON whitespace


def _post_head(length: int) -> bytes:
    """The head of a JSON POST /v1/translate whose body has ``length`` bytes."""
    return (
        "POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _read_response(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, from a socket's buffered ``reader``:
    (status, headers, body); what follows it stays for the next call."""
    status_line = reader.readline()
    assert status_line, "connection closed before an answer"
    headers: dict[str, str] = {}
    while (line := reader.readline().decode("latin-1").rstrip("\r\n")) != "":
        name, value = line.split(": ", 1)
        headers[name.lower()] = value
    body = reader.read(int(headers["content-length"]))
    assert len(body) == int(headers["content-length"]), "connection closed in the body"
    return int(status_line.split()[1]), headers, body


def _closed(reader: BinaryIO) -> bool:
    try:
        return reader.read(1) == b""
    except ConnectionResetError:
        return True


def test_a_head_beyond_the_limit_gets_431_in_the_envelope(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(_request(4 * LIMIT))
        status, headers, body = _read_response(reader)
        assert status == 431
        assert headers["content-type"] == "application/json"
        error = orjson.loads(body)["error"]
        assert error["code"] == "headers_too_large"
        assert error["type"] == "invalid_request_error"
        assert str(LIMIT) in error["message"]
        assert _closed(reader)
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_a_huge_head_is_refused_while_it_arrives(server: tuple[str, int]) -> None:
    """The answer comes once the limit is passed, not after the whole head: after 1 MiB of
    a header that never ends, the 431 is there to read."""
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: lead\r\nAuthorization: Bearer ")
        sock.sendall(b"a" * (1024 * 1024))
        readable, _, _ = select.select([sock], [], [], 10)
        assert readable, "no answer while the head was still arriving"
        status, _, body = _read_response(reader)
        assert status == 431, body
        assert _closed(reader)
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_heads_under_the_limit_are_served_and_counted_per_request(
    server: tuple[str, int],
) -> None:
    """Three requests of 0.7 times the limit each on one keep-alive connection: each head
    is counted on its own (together they are twice the limit)."""
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(3):
            sock.sendall(_request(int(0.7 * LIMIT)))
            status, _, body = _read_response(reader)
            assert status == 200, body
        sock.sendall(_request(2 * LIMIT))  # then one too large, on the same connection
        status, _, body = _read_response(reader)
        assert status == 431, body


@pytest.mark.parametrize("split", [False, True], ids=["one write", "head end split"])
def test_a_large_body_after_a_small_head_is_not_counted(
    server: tuple[str, int], split: bool
) -> None:
    """A 256 KiB body arriving with its head (one write), or right after the head's blank
    line was split between two writes (its last byte with the body): the body is not
    counted as head bytes."""
    body = _translate_body(pad_to=256 * 1024)
    head = _post_head(len(body))
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        if split:
            sock.sendall(head[:-1])
            time.sleep(0.2)  # the server reads the head without its last byte
            sock.sendall(head[-1:] + body)
        else:
            sock.sendall(head + body)
        status, _, answer = _read_response(reader)
    assert status == 200, answer
    assert orjson.loads(answer)["usage"] == {"vectors": 1}


def _chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    """A chunked POST /v1/translate of ``body`` in chunks of ``size`` bytes, then
    ``trailer`` (trailer field lines, each ending in CRLF)."""
    head = (
        b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    )
    return head + chunks + b"0\r\n" + trailer + b"\r\n"


def test_chunked_trailers_count_and_chunk_framing_does_not(server: tuple[str, int]) -> None:
    """The trailer fields after a chunked body are held like headers: bounded too. The
    framing of many small chunks (3 times the limit in all) is not counted."""
    body = _translate_body(pad_to=200 * 1024)
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(_chunked(body, 50, trailer=b"X-Check: " + b"a" * (LIMIT // 2) + b"\r\n"))
        status, _, answer = _read_response(reader)
        assert status == 200, answer
        # beyond one read (256 KiB): bytes after the body's end in its last read are free
        trailer = b"X-Check: " + b"a" * (1024 * 1024) + b"\r\n"
        sock.sendall(_chunked(body, 4096, trailer=trailer))
        status, _, answer = _read_response(reader)
        assert status == 431, answer
        assert orjson.loads(answer)["error"]["code"] == "headers_too_large"
        assert _closed(reader)


def test_a_head_split_after_a_pipelined_request_is_counted_right(
    server: tuple[str, int],
) -> None:
    """One write holds a whole request and the next one's head but its last byte; the
    next write, that byte and a body larger than the limit: the body is no head."""
    body = _translate_body(pad_to=4 * LIMIT)
    head = _post_head(len(body))
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: lead\r\n\r\n" + head[:-1])
        time.sleep(0.2)  # read apart from the rest
        sock.sendall(head[-1:] + body)
        assert _read_response(reader)[0] == 200
        status, _, answer = _read_response(reader)
    assert status == 200, answer


def test_a_refusal_waits_for_the_answers_before_it(server: tuple[str, int]) -> None:
    """A large answer is still being sent (the client reads nothing yet) when the next,
    pipelined request's head passes the limit: that answer arrives whole, then the 431."""
    rows = np.random.default_rng(0).standard_normal((2048, 384)).astype("<f4")
    strings = [base64.b64encode(row.tobytes()).decode() for row in rows]
    big = orjson.dumps({"stitch": STITCH, "input": strings, "encoding_format": "base64"})
    head = _post_head(len(big))
    with socket.create_connection(server, timeout=30) as sock:
        reader = sock.makefile("rb")
        sock.sendall(head + big + _request(1024 * 1024))  # beyond the read it starts in
        status, _, answer = _read_response(reader)
        assert status == 200
        assert len(orjson.loads(answer)["data"]) == 2048
        status, _, refused = _read_response(reader)
        assert status == 431, refused
        assert _closed(reader)


def test_a_head_that_stops_arriving_gets_408_and_frees_the_connection(
    server: tuple[str, int],
) -> None:
    """Slowloris: half a header line, then nothing. uvicorn's own protocol kept such
    connections open for good (ten of them after 100 s), and enough of them fill the
    process's open files. The deadline answers 408 in the envelope and closes, on a new
    connection and on a keep-alive one after a served request; a connection that sends
    nothing is closed without an answer."""
    partial = b"GET /healthz HTTP/1.1\r\nHost: lead\r\nX-Slow: "
    with (
        socket.create_connection(server, timeout=10) as fresh,
        socket.create_connection(server, timeout=10) as reused,
        socket.create_connection(server, timeout=10) as silent,
    ):
        reused_reader = reused.makefile("rb")
        reused.sendall(_request(10))
        assert _read_response(reused_reader)[0] == 200
        start = time.monotonic()
        fresh.sendall(partial)
        reused.sendall(partial)
        for reader in (fresh.makefile("rb"), reused_reader):
            status, headers, body = _read_response(reader)
            assert status == 408, body
            assert headers["connection"] == "close"
            error = orjson.loads(body)["error"]
            assert error["code"] == "request_timeout" and "LEAD_HEADER_TIMEOUT" in error["message"]
            assert _closed(reader)
        assert HEAD_TIMEOUT * 0.9 <= time.monotonic() - start < HEAD_TIMEOUT + 5
        assert _closed(silent.makefile("rb"))  # nothing sent: closed, no answer
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_a_head_sent_slowly_but_within_the_deadline_is_served(server: tuple[str, int]) -> None:
    """The deadline is for the whole head, not for each read: pauses shorter in total
    pass, and an idle keep-alive connection between requests is not cut by it."""
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: lead\r\n", b"\r\n"):
            sock.sendall(part)
            time.sleep(HEAD_TIMEOUT / 4)
        assert _read_response(reader)[0] == 200
        time.sleep(HEAD_TIMEOUT * 1.5)  # idle between requests: keep-alive's, not ours
        sock.sendall(_request(10))
        assert _read_response(reader)[0] == 200


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: -5\r\n",
        b"Content-Length: 3\r\nContent-Length: 4\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
    ],
)
def test_a_request_that_is_not_http_gets_400_in_the_envelope(
    server: tuple[str, int], head: bytes
) -> None:
    """uvicorn answers what its parser refuses with a plain-text 400; it is the error
    envelope like every other refusal."""
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\n" + head + b"\r\n{}")
        status, headers, body = _read_response(reader)
        assert status == 400, body
        assert headers["content-type"] == "application/json"
        assert orjson.loads(body)["error"]["code"] == "invalid_http"
        assert _closed(reader)
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate, chunked", b"x-custom, chunked"])
def test_a_transfer_coding_beside_chunked_gets_501(server: tuple[str, int], coding: bytes) -> None:
    """The parser frames such a body as chunked and drops the other codings: a gzip-coded
    body was translated as if it were plain (found by an adversarial pass). RFC 9112: 501."""
    body = _translate_body()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        head = b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Transfer-Encoding: " + coding + b"\r\n\r\n" + chunked)
        status, headers, answer = _read_response(reader)
        assert status == 501, answer
        assert headers["content-type"] == "application/json"
        error = orjson.loads(answer)["error"]
        assert error["code"] == "unsupported_transfer_coding"
        assert coding.decode().split(",")[0] in error["message"]
        assert _closed(reader)
    with socket.create_connection(server, timeout=10) as sock:  # chunked alone: served
        reader = sock.makefile("rb")
        head = b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        assert _read_response(reader)[0] == 200


_BAD_CODING = (
    b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    b"0\r\n\r\n"
)
_GET = b"GET /healthz HTTP/1.1\r\nHost: lead\r\n\r\n"


def _statuses(sock: socket.socket, seconds: float) -> list[int]:
    """The statuses of the answers read until the server closes (within ``seconds``)."""
    reader = sock.makefile("rb")
    statuses = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _closed_or_status(reader, statuses):
            return statuses
    raise AssertionError(f"still open after {seconds} s; answers so far {statuses}")


def _closed_or_status(reader: BinaryIO, statuses: list[int]) -> bool:
    try:
        line = reader.peek(1)
    except ConnectionResetError:
        return True
    if not line:
        return True
    statuses.append(_read_response(reader)[0])
    return False


def test_requests_after_a_refusal_in_the_same_read_are_dropped(server: tuple[str, int]) -> None:
    """What follows a refused request in the same read never reaches the app: a GET after
    a 501 got a cycle without its body (a 408 30 s later took the 501's place), and an
    upgrade request after one raised in the server (found by a second adversarial pass)."""
    upgrade = (
        b"GET /ws HTTP/1.1\r\nHost: lead\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    for after in (_GET, upgrade, _post_head(10**12)):
        with socket.create_connection(server, timeout=10) as sock:
            sock.sendall(_GET + _BAD_CODING + after)
            assert _statuses(sock, 8) == [200, 501], after
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_a_broken_chunk_in_a_body_gets_400_at_once(server: tuple[str, int]) -> None:
    """A parse error inside the body of the request being answered: the 400 is sent at
    once (it waited for that very request's answer, until the body timeout's 408)."""
    head = (
        b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    for before, rest in (
        (b"", b"2\r\n{}\r\nzz\r\n"),
        (b"", b"0\r\nbad trailer line\r\n\r\n"),
        (_GET, b"2\r\n{}\r\nzz\r\n"),  # queued behind a GET: its answer comes first
    ):
        with socket.create_connection(server, timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(before + head + rest)
            assert _statuses(sock, 8) == [200] * bool(before) + [400], rest
            assert time.monotonic() - start < 5
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_the_head_deadline_waits_while_the_server_is_busy(tmp_path: Path) -> None:
    """A head whose first bytes were read while the server was busy with earlier requests
    (reading paused behind them, the rest of the head unread in the socket) is timed from
    when the server is free: a slow translate, a GET, and a GET whose head the client
    finished 50 ms later are all answered (the last got a 408 when the translate took
    longer than the deadline; found by a second adversarial pass). A server of its own,
    with a deadline shorter than the translate."""
    deadline = 0.25
    x = np.random.default_rng(0).standard_normal((2048, 384)).astype("<f4")
    payload = {"stitch": STITCH, "input": [base64.b64encode(r.tobytes()).decode() for r in x]}
    body = orjson.dumps({**payload, "encoding_format": "base64"})  # ~0.4 s: memory rescored
    running = Server(
        tmp_path / "data",
        options=("--http", "service.http_protocol:BoundedHttpToolsProtocol"),
        LEAD_STITCHES=orjson.dumps([str(REPO / "models" / STITCH)]).decode(),
        LEAD_ENABLE_JOBS="false",
        LEAD_HEADER_TIMEOUT_SECONDS=str(deadline),
    ).start()
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            start = time.monotonic()
            sock.sendall(_post_head(len(body)) + body + _GET + b"GET /healthz HTTP/1.1\r\n")
            time.sleep(0.05)
            sock.sendall(b"Host: lead\r\n\r\n")
            reader = sock.makefile("rb")
            statuses = [_read_response(reader)[0] for _ in range(3)]
            busy = time.monotonic() - start
    finally:
        running.stop()
    assert statuses == [200, 200, 200]
    if busy <= deadline:
        pytest.skip(f"the translate took {busy:.2f} s: too short to show the case")


def test_blank_lines_between_requests_do_not_hold_a_connection(server: tuple[str, int]) -> None:
    """The parser skips CRLFs between requests without starting one, and uvicorn stops the
    keep-alive timer on any read: a CRLF now and then held a connection for good. The head
    deadline covers them."""
    with socket.create_connection(server, timeout=10) as sock:
        reader = sock.makefile("rb")
        sock.sendall(_GET)
        assert _read_response(reader)[0] == 200
        start = time.monotonic()
        sock.sendall(b"\r\n")
        assert _closed(reader)
        assert time.monotonic() - start < HEAD_TIMEOUT + 5


def test_a_request_sent_before_a_half_close_is_answered(server: tuple[str, int]) -> None:
    """A client that sends its whole request and then shuts its sending side down still
    gets the answer, then the connection closes (it got nothing, though the request ran:
    found by an adversarial pass); pipelined requests before it are answered in order."""
    body = _translate_body()
    for request, expected in (
        (_post_head(len(body)) + body, [200]),
        (_GET + _post_head(len(body)) + body, [200, 200]),
        (b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
         b"Content-Length: 2\r\n\r\n{}", [422]),
    ):  # fmt: skip
        with socket.create_connection(server, timeout=10) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            assert _statuses(sock, 8) == expected, request[:40]
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200


def test_an_upgrade_request_is_answered_as_plain_http(server: tuple[str, int]) -> None:
    """The service has no WebSocket route: a bodyless request with a stray ``Upgrade:
    websocket`` gets the usual answer, one with a body a 400 in the envelope (it got a
    plain-text 400 from the WebSocket handshake); the connection closes after either."""
    upgrade = b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
    body = b'{"stitch": "%s", "input": [[1]]}' % STITCH.encode()
    bad = (
        b"POST /v1/translate HTTP/1.1\r\nHost: lead\r\nContent-Type: application/json\r\n"
        + upgrade
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    ws = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    get = b"GET /v1/stitches HTTP/1.1\r\nHost: lead\r\n" + upgrade + ws + b"\r\n"
    for request, status in ((bad, 400), (get, 200)):
        with socket.create_connection(server, timeout=10) as sock:
            reader = sock.makefile("rb")
            sock.sendall(request)
            got, headers, answer = _read_response(reader)
            assert got == status and headers["content-type"] == "application/json", answer
            if status == 400:  # its body would reach the parser as the new protocol's
                error = orjson.loads(answer)["error"]
                assert error["code"] == "upgrade_not_supported" and "--http1.1" in error["message"]
            assert _closed(reader)
    assert httpx.get(f"http://{server[0]}:{server[1]}/healthz").status_code == 200
