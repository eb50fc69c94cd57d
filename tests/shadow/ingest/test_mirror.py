"""The mirror listener and the authority forms a mesh sends mirrored copies with: each form
through real HTTP/1.1 on 127.0.0.1, with ``mirror_require_shadow_host`` on."""

from __future__ import annotations

import asyncio
import json

import pytest

from specwatch.core.wire import ShadowOrigin, shadow_origin
from tests.fakes.arm import FakeArm, serve_arm
from tests.fakes.raw import raw_exchange
from tests.shadow.test_pipeline import CHAT, _settings, sidecar

BODY = json.dumps(CHAT).encode()


async def _post(port: int, target: str, headers: list[tuple[str, str]]) -> tuple[int, object]:
    """One ``POST`` written byte for byte on a new connection (so the request target and every
    header are exactly these, absolute form included); the status and the JSON answer."""
    head = [f"POST {target} HTTP/1.1"]
    head += [f"{k}: {v}" for k, v in headers]
    head += ["Content-Type: application/json", f"Content-Length: {len(BODY)}", "Connection: close"]
    raw = await raw_exchange(port, ("\r\n".join(head) + "\r\n\r\n").encode() + BODY)
    status_line, _, rest = raw.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


#: (what the mesh sends, the request target, the headers): each names a mirrored copy.
MIRRORED = [
    ("envoy: suffix on the host name", "/v1/chat/completions", [("Host", "svc-shadow:8000")]),
    ("suffix after the port", "/v1/chat/completions", [("Host", "svc:8000-shadow")]),
    (
        "cluster name, suffix on the host name",
        "/v1/chat/completions",
        [("Host", "vllm-fly.llm.svc.cluster.local-shadow:8000")],
    ),
    ("IPv6 literal", "/v1/chat/completions", [("Host", "[fd00::1]-shadow:8000")]),
    ("no port", "/v1/chat/completions", [("Host", "SVC-Shadow")]),
    (
        "x-forwarded-host behind a Host rewrite",
        "/v1/chat/completions",
        [("Host", "specwatch:9402"), ("X-Forwarded-Host", "svc-shadow:8000, edge:443")],
    ),
    (
        "forwarded host=",
        "/v1/chat/completions",
        [("Host", "specwatch:9402"), ("Forwarded", 'for=10.0.0.1;host="svc:8000-shadow"')],
    ),
    (
        ":authority as an absolute-form target",
        "http://svc-shadow:8000/v1/chat/completions",
        [("Host", "specwatch:9402")],
    ),
]

#: Authorities that name no mirrored copy: 421.
NOT_MIRRORED = ["svc:8000", "shadow-api:80", "svc:8000-shadowed", "svc-shadow:0", "-shadow:80"]
#: An absolute-form target whose authority names no mirrored copy: 421.
NOT_MIRRORED_TARGETS = ["http://svc:8000/v1/chat/completions"]


async def test_each_mirrored_form_is_admitted_and_others_refused() -> None:
    """With mirror_require_shadow_host, every form above is admitted (202) and delivered as a
    pair, and each authority that is no mirrored copy answers 421 not_shadow_host, counted."""
    async with (
        serve_arm(FakeArm()) as su,
        serve_arm(FakeArm()) as fu,
        sidecar(_settings(su, fu, mirror_require_shadow_host=True, queue_size=32)) as (
            url,
            pipe,
            pairs,
            _,
            _,
        ),
    ):
        port = int(url.rsplit(":", 1)[1])
        for what, target, headers in MIRRORED:
            assert await _post(port, target, headers) == (202, {"shadow": "admitted"}), what
        for host in NOT_MIRRORED:
            got = await _post(port, "/v1/chat/completions", [("Host", host)])
            assert got == (421, {"shadow": "not_shadow_host"}), host
        for target in NOT_MIRRORED_TARGETS:
            got = await _post(port, target, [("Host", "specwatch:9402")])
            assert got == (421, {"shadow": "not_shadow_host"}), target
        for _ in range(200):
            if len(pairs) == len(MIRRORED):
                break
            await asyncio.sleep(0.05)
        m = pipe.metrics()
    assert len(pairs) == len(MIRRORED)
    refused = len(NOT_MIRRORED) + len(NOT_MIRRORED_TARGETS)
    assert m.ingest_errors == {("mirror", "not_shadow_host"): refused}


@pytest.mark.parametrize(
    ("authority", "origin"),
    [
        ("svc-shadow:8000", ShadowOrigin("svc", 8000)),
        ("svc:8000-shadow", ShadowOrigin("svc", 8000)),
        ("svc-shadow", ShadowOrigin("svc", None)),
        ("API-SHADOW:80", ShadowOrigin("api", 80)),
        ("a.ns.svc.cluster.local-shadow:8000", ShadowOrigin("a.ns.svc.cluster.local", 8000)),
        ("[fd00::1]-shadow:8000", ShadowOrigin("[fd00::1]", 8000)),
        ("[fd00::1]:8000-shadow", ShadowOrigin("[fd00::1]", 8000)),
        ("svc:8000", None),
        ("shadow-api:80", None),
        ("svc:70000-shadow", None),
        ("svc-shadow:port", None),
        ("-shadow", None),
        ("", None),
        (None, None),
    ],
)
def test_shadow_origin(authority: str | None, origin: ShadowOrigin | None) -> None:
    """The live host and port from both suffix forms (Envoy's on the host name, and after the
    port); a port outside 1..65535, an empty host or no suffix is no mirrored copy."""
    assert shadow_origin(authority) == origin
