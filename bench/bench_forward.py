"""CPU per request of the HTTP/1.1 forwarding engine's own Python, in a hot loop.

No sockets: one client connection and one pooled upstream connection on fake transports, so
the figure is the engine's Python alone (parsing, head rebuild, relay, pool and timers), not
the kernel's ``send()`` and wake-ups that :mod:`bench_proxy` measures with it. For each path
(``fast``: the fast paths on, as shipped; ``parser``: every request and answer through llhttp)
and each answer kind (``json``: one ``Content-Length`` answer in one read; ``sse``: a chunked
stream of ``--chunks`` events in as many reads) it sends ``--requests`` keep-alive requests
one after another and prints the best of ``--repeat`` runs in microseconds per request.

Run from the repository root::

    PYTHONPATH=. python bench/bench_forward.py --requests 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from specwatch.core.listen import ListenerStats, ListenLimits
from specwatch.http1.forwarder import Forwarder
from specwatch.http1.pool import Upstream, UpstreamConnection
from specwatch.shadow.ingest.offer import IngestCounters

BODY = json.dumps({"model": "m", "prompt": "bench", "max_tokens": 16}).encode()
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:9401\r\nUser-Agent: bench/1\r\n"
    b"Accept: */*\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
    % (len(BODY), BODY)
)
ANSWER_BODY = json.dumps({"id": "cmpl-bench", "choices": [{"text": "x" * 64}]}).encode()
JSON_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
    % (len(ANSWER_BODY), ANSWER_BODY)
)
EVENT = b'data: {"id":"cmpl-bench","choices":[{"text":"tok "}]}\n\n'


def sse_answer(chunks: int) -> list[bytes]:
    """A chunked SSE answer in ``chunks + 1`` reads: the head with the first event, one event
    per read, then the last chunk."""
    chunk = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    fields = b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n"
    return [head + chunk] + [chunk] * (chunks - 1) + [b"0\r\n\r\n"]


class FakeTransport(asyncio.Transport):
    """Takes writes and drops them; reading can be paused and resumed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class NoHandover:
    """A hand-over that takes the copies and drops them."""

    def copy(self, path: str, raw: bytes, category: str | None, request_id: str | None) -> None:
        pass

    def too_large(self) -> None:
        pass

    def incomplete(self, shadow: bool) -> None:
        pass

    def marked(self) -> None:
        pass


def run(fast: bool, answer: list[bytes], requests: int) -> float:
    """Seconds for ``requests`` exchanges on one client connection."""
    loop = asyncio.new_event_loop()
    try:
        fwd = Forwarder(
            Upstream.parse("http://127.0.0.1:8000", 10.0, None),
            NoHandover(),
            counters=IngestCounters(),
            limits=ListenLimits(),
            stats=ListenerStats("bench"),
            shadow_paths=frozenset({"/v1/completions"}),
            marker=b"x-specwatch-shadow",
            category_header=b"x-specwatch-category",
            request_id_header=b"x-request-id",
            max_body_bytes=8 << 20,
        )
        fwd.fast = fast
        fwd.loop = fwd.pool.loop = loop  # what start() sets, without a listening socket
        fwd.pool.open = True
        up = UpstreamConnection()
        up.connection_made(FakeTransport())
        fwd.pool.release(up)
        client = fwd.protocol()
        client.connection_made(FakeTransport())
        t0 = time.perf_counter()
        for _ in range(requests):
            client.data_received(REQUEST)
            for piece in answer:
                up.data_received(piece)
        elapsed = time.perf_counter() - t0
        assert fwd.counters.proxy_requests == requests
        assert fwd.pool.idle == [up], "the upstream connection was not reused"
        return elapsed
    finally:
        loop.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=16, help="SSE events per streamed answer")
    args = ap.parse_args()
    answers = {"json": [JSON_ANSWER], "sse": sse_answer(args.chunks)}
    print(f"{'path':<8}{'answer':<8}{'us/request':>12}")
    for path in ("fast", "parser"):
        for kind, answer in answers.items():
            best = min(run(path == "fast", answer, args.requests) for _ in range(args.repeat))
            print(f"{path:<8}{kind:<8}{1e6 * best / args.requests:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
