"""The one threaded stand-in HTTP server: a ``BaseHTTPRequestHandler`` subclass served on
127.0.0.1 and a free port from a daemon thread (for code under test that blocks, such as the
offline tools' urllib clients)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def threaded_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` until the block ends; yields the base URL ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Canned(BaseHTTPRequestHandler):
    """Answers every GET with ``body`` (200, ``content_type``); quiet."""

    body: bytes = b""
    content_type: str = "application/json"

    def do_GET(self) -> None:
        body = self.body
        self.send_response(200)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # a client that stops reading early (fleet after one failed query) closes the socket:
        # that must not print a traceback into the stderr a test reads
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@contextlib.contextmanager
def canned_json_server(body: bytes) -> Iterator[str]:
    """A threaded server answering every GET with ``body`` as 200 ``application/json``; yields
    its base URL (a stand-in Prometheus for the offline tools)."""
    handler = type("Canned", (_Canned,), {"body": body})
    with threaded_http_server(handler) as url:
        yield url


@contextlib.contextmanager
def canned_page_server(body: bytes) -> Iterator[str]:
    """A threaded server answering every GET with ``body`` as a Prometheus text page (a
    stand-in vLLM ``/metrics`` for a command run as a process); yields its base URL."""
    handler = type(
        "CannedPage", (_Canned,), {"body": body, "content_type": "text/plain; version=0.0.4"}
    )
    with threaded_http_server(handler) as url:
        yield url
