"""Mirror ingest: fire-and-forget copies sent by the mesh (Envoy/Istio/Gateway API).

:class:`MirrorIngest` gives ``POST /v1/completions`` and ``POST /v1/chat/completions`` routes to
mount
on the sidecar's app. The mesh sends copies with the Host (``:authority``) suffixed ``-shadow``
(Envoy
``request_mirror_policies``). The handler answers ``202 {"shadow": "<admitted|reason>"}`` at once;
it
never awaits a replay. Requests already carrying the shadow marker header are never re-ingested.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from specwatch.core.wire import CATEGORY_HEADER, SHADOW_MARKER_HEADER, is_shadow_host
from specwatch.shadow.ingest.offer import SHADOW_PATHS, IngestCounters, Offer, Offerer
from specwatch.shadow.values import Source

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def mirror_routes(handler: Handler) -> list[web.RouteDef]:
    """The one mirror route table: ``POST`` on every path in ``SHADOW_PATHS`` (sorted), answered by
    ``handler``. Used by :meth:`MirrorIngest.routes` (a pipeline mounted directly) and by the shadow
    component, which mounts the routes before its pipeline exists and delegates to it."""
    return [web.post(p, handler) for p in sorted(SHADOW_PATHS)]


class MirrorIngest:
    """Receiver of mirrored requests. Mount with ``app.add_routes(mirror.routes())``.

    Answers ``202`` with ``{"shadow": "<admitted|not_sampled|queue_full|...>"}``; ``413`` over
    ``max_body_bytes``; ``400`` for a body that is not a JSON object; ``421`` when
    ``require_shadow_host`` is set and the Host lacks the ``-shadow`` suffix; ``208`` for a request
    already carrying the marker header (skipped). ``clock`` gives unix seconds for ``received_at``.
    """

    def __init__(
        self,
        offer: Offer,
        *,
        counters: IngestCounters,
        clock: Callable[[], float],
        salt: str = "",
        max_body_bytes: int = 1 << 20,
        require_shadow_host: bool = False,
        marker_header: str = SHADOW_MARKER_HEADER,
    ) -> None:
        self._offerer = Offerer(offer, counters, clock, salt)
        self.counters = counters
        self._max = max_body_bytes
        self._require_host = require_shadow_host
        self._marker = marker_header

    def routes(self) -> list[web.RouteDef]:
        """``POST`` routes for every shadowed path, answered by :meth:`handle`."""
        return mirror_routes(self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        src = Source.MIRROR.value
        if request.headers.get(self._marker):
            self.counters.skipped_marked += 1
            return web.json_response({"shadow": "skipped_marked"}, status=208)
        if self._require_host and not is_shadow_host(request.host):
            self.counters.errors[(src, "not_shadow_host")] += 1
            return web.json_response({"shadow": "not_shadow_host"}, status=421)
        cl = request.content_length
        if cl is not None and cl > self._max:
            self.counters.received[src] += 1
            self.counters.errors[(src, "too_large")] += 1
            return web.json_response({"shadow": "too_large"}, status=413)
        buf = bytearray()
        async for chunk in request.content.iter_any():
            buf += chunk
            if len(buf) > self._max:
                self.counters.received[src] += 1
                self.counters.errors[(src, "too_large")] += 1
                return web.json_response({"shadow": "too_large"}, status=413)
        result = self._offerer.offer_raw(
            Source.MIRROR, request.path, bytes(buf), request.headers.get(CATEGORY_HEADER)
        )
        status = 400 if result in ("invalid_json", "too_deep", "not_object") else 202
        return web.json_response({"shadow": result}, status=status)
