"""A real HTTP server on loopback that answers what a test says: a proxy, another server
on the port, a server that refuses every key. Not LEAD: what clients must cope with."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: ``(method, path, headers, body) -> (status, headers, body)``: the answer to one request;
#: ``None``: close the connection without one (a server's keep-alive timeout racing the
#: request).
Answer = Callable[[str, str, Any, bytes], tuple[int, dict[str, str], bytes] | None]


@contextlib.contextmanager
def answering(answer: Answer) -> Iterator[str]:
    """Serve ``answer`` on a free loopback port while the context lasts; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            sent = self.rfile.read(int(self.headers.get("content-length") or 0))
            answered = answer(self.command, self.path, self.headers, sent)
            if answered is None:
                self.close_connection = True
                return
            status, headers, body = answered
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
