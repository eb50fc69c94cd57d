"""The simulator against the real vLLM on every request field and route the installed vLLM has.

The fields come from the installed vLLM's request models (run under its own python), the routes
from the running server's ``/openapi.json``; :func:`tests.vllm_surface.cases` makes one request
per field and per route. Each goes to the real speculative server (the session's one start) and
to the simulator set up like it, and :func:`tests.vllm_conformance.compare` lists what a client
could tell apart (status, headers, keys and types, error objects, SSE framing and order). The
differences must be exactly the rows of ``docs/simulate.md``'s surface table: a difference not
in the table fails, and so does a row that no longer differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from specwatch.simulate.launcher import start_simulator
from tests.vllm_conformance import REAL_LIKE, deviations, send
from tests.vllm_surface import (
    SURFACE_HEADING,
    cases,
    differences_of,
    request_surface,
    routes,
    stale_rows,
    uncovered,
    unexplained_by,
)

from .servers import VllmServer


async def _send_all(base: str, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for kind, request in requests.items():
            out[kind] = await send(session, base, request)
    return out


async def test_every_field_and_route_answers_like_the_real_server(
    vllm_spec_server: VllmServer, vllm_python: Path
) -> None:
    """Every request field and route of the installed vLLM has a case (or the test names it);
    the simulator's answers differ from the real server's exactly where the surface table of
    docs/simulate.md says, row for row."""
    surface = request_surface(vllm_python)
    served = routes(json.loads(vllm_spec_server.get("/openapi.json")))
    assert uncovered(surface, served) == []
    requests = cases(surface, served)
    real = await _send_all(vllm_spec_server.url, requests)
    handle = await start_simulator(REAL_LIKE)
    try:
        sim = await _send_all(handle.url, requests)
    finally:
        await handle.stop()
    found = differences_of(requests, real, sim)
    table = deviations(heading=SURFACE_HEADING)
    print(f"{len(requests)} cases; differences:\n" + "\n".join(found))
    assert len(requests) >= 150
    assert unexplained_by(found, table) == []
    assert stale_rows(found, table) == []
