"""Mirror ingest: fire-and-forget copies sent by the mesh (Envoy/Istio/Gateway API).

:class:`MirrorIngest` answers ``POST /v1/completions`` and ``POST /v1/chat/completions`` on the
mirror's own listener (:class:`MirrorListener`, ``shadow.mirror_listen_port``, default 9402),
never on the sidecar's ``/metrics`` port: whoever can scrape must not be able to inject requests
that are replayed to the GPU arms (the shipped NetworkPolicy lets only the mesh reach the mirror
port). The mesh sends copies with the Host (``:authority``) suffixed ``-shadow`` (Envoy
``request_mirror_policies``), on the host name or after the port (:func:`mirrored_origin`).
The handler answers ``202 {"shadow": "<admitted|reason>"}`` at once;
it never awaits a replay. Requests already carrying the shadow marker header are never
re-ingested. The live request's ``X-Request-Id`` is kept with the pair.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError
from yarl import URL

from specwatch.core.clock import WallClock
from specwatch.core.listen import MAX_FIELD_BYTES, ListenerStats, ListenLimits
from specwatch.core.listen_http import GuardedSite, body_timeout_middleware
from specwatch.core.wire import (
    SHADOW_MARKER_HEADER,
    ShadowOrigin,
    shadow_origin,
)
from specwatch.shadow.ingest.offer import (
    REQUEST_ID_HEADER,
    SHADOW_PATHS,
    CopyHeaders,
    IngestCounters,
    Offer,
    Offerer,
    clean_request_id,
)
from specwatch.shadow.values import Source

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _forwarded_hosts(request: web.Request) -> list[str]:
    """The ``host=`` values of ``Forwarded`` (RFC 7239) and the values of ``X-Forwarded-Host``,
    nearest client first: a proxy between the mesh and specwatch that rewrites the Host keeps
    the mirrored copy's own there."""
    out: list[str] = []
    for element in request.forwarded:
        host = element.get("host")
        if host:
            out.append(host)
    for value in request.headers.getall(hdrs.X_FORWARDED_HOST, ()):
        out.extend(part.strip() for part in value.split(",") if part.strip())
    return out


def mirrored_origin(request: web.Request) -> ShadowOrigin | None:
    """The live request's host and port named by a mirrored copy, or ``None`` when nothing
    marks it as one (:func:`specwatch.core.wire.shadow_origin` in either suffix form).

    Read, first match wins: the authority of an absolute-form request target (what an
    HTTP/2 ``:authority`` becomes when a mesh forwards in that form; HTTP/1.1 says it overrides
    ``Host``), the ``Host`` header (Envoy and Istio write ``:authority`` there when they speak
    HTTP/1.1 to specwatch), then ``Forwarded: host=`` and ``X-Forwarded-Host`` (a proxy in
    between that rewrote the Host)."""
    forms: list[str] = []
    target = request.raw_path
    if target.lower().startswith(("http://", "https://")):
        try:
            authority = URL(target).raw_authority
        except ValueError:
            authority = ""  # an authority yarl cannot read names no mirrored copy
        forms.append(authority)
    host = request.headers.get(hdrs.HOST)
    if host is not None:
        forms.append(host)
    forms.extend(_forwarded_hosts(request))
    for form in forms:
        origin = shadow_origin(form)
        if origin is not None:
            return origin
    return None


def mirror_routes(handler: Handler) -> list[web.RouteDef]:
    """The one mirror route table: ``POST`` on every path in ``SHADOW_PATHS`` (sorted), answered by
    ``handler``. Used by :meth:`MirrorIngest.routes` (a pipeline mounted directly) and by the shadow
    component, which mounts the routes before its pipeline exists and delegates to it."""
    return [web.post(p, handler) for p in sorted(SHADOW_PATHS)]


class MirrorIngest:
    """Receiver of mirrored requests. Mount with ``app.add_routes(mirror.routes())``.

    Answers ``202`` with ``{"shadow": "<admitted|not_sampled|queue_full|...>"}``; ``413`` over
    ``max_body_bytes`` (``too_large``); ``400`` for a body cut before its end
    (``incomplete_body``: counted, one WARNING line, no traceback), one its
    ``Content-Encoding`` cannot decode (``bad_encoding``, likewise) or one that is not a JSON
    object; ``421`` when
    ``require_shadow_host`` is set and the Host lacks the ``-shadow`` suffix; ``208`` for a request
    already carrying the marker header (skipped). ``wall_clock`` gives unix seconds for
    ``received_at``.
    """

    def __init__(
        self,
        offer: Offer,
        *,
        counters: IngestCounters,
        wall_clock: WallClock,
        salt: str = "",
        max_body_bytes: int = 16 << 20,
        require_shadow_host: bool = False,
        marker_header: str = SHADOW_MARKER_HEADER,
    ) -> None:
        self._offerer = Offerer(offer, counters, wall_clock, salt)
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
        if self._require_host and mirrored_origin(request) is None:
            self.counters.errors[(src, "not_shadow_host")] += 1
            return web.json_response({"shadow": "not_shadow_host"}, status=421)
        rid = clean_request_id(request.headers.get(REQUEST_ID_HEADER))
        cl = request.content_length
        if cl is not None and cl > self._max:
            return self._reject(src, "too_large", 413, rid)
        buf = bytearray()
        try:
            async for chunk in request.content.iter_any():
                buf += chunk
                if len(buf) > self._max:
                    return self._reject(src, "too_large", 413, rid)
        except (aiohttp.ClientPayloadError, ConnectionError) as exc:
            return self._reject(src, "incomplete_body", 400, rid, error=type(exc).__name__)
        except RequestPayloadError as exc:  # a body its Content-Encoding cannot decode
            # The rest of the body is unreadable: end the stream so aiohttp does not read it
            # again after the answer (that raised once more, logged with a traceback), and close
            # the connection after the answer.
            request.content.feed_eof()
            resp = self._reject(src, "bad_encoding", 400, rid, error=" ".join(str(exc).split()))
            resp.force_close()
            return resp
        if cl is not None and len(buf) < cl:
            return self._reject(src, "incomplete_body", 400, rid)
        result = self._offerer.offer_copy(
            Source.MIRROR, request.path, bytes(buf), CopyHeaders.of(request.headers)
        )
        refused = ("invalid_json", "too_deep", "too_many_keys", "not_object")
        status = 400 if result in refused else 202
        return web.json_response({"shadow": result}, status=status)

    def _reject(
        self, src: str, reason: str, status: int, request_id: str | None, error: str | None = None
    ) -> web.Response:
        self._offerer.reject(Source.MIRROR, reason, request_id=request_id, error=error)
        return web.json_response({"shadow": reason}, status=status)


class MirrorListener:
    """The mirror's own HTTP listener: ``routes`` (normally :func:`mirror_routes`) served on
    ``host:port`` (0 = any free port) by their own ``AppRunner``; :attr:`port` is the bound port
    once :meth:`start` returned. ``max_body_bytes`` bounds what aiohttp itself buffers."""

    def __init__(
        self,
        routes: list[web.RouteDef],
        *,
        max_body_bytes: int,
        listen: ListenLimits | None = None,
        listener: ListenerStats | None = None,
        shutdown_timeout_seconds: float = 4.0,
    ) -> None:
        self._routes = routes
        self._max = max_body_bytes
        self._listen = listen if listen is not None else ListenLimits()
        #: Counters of this listener (``mirror``): refused connections and requests.
        self.listener = listener if listener is not None else ListenerStats("mirror")
        self._shutdown_timeout = shutdown_timeout_seconds
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> int:
        """Bind and serve on the running loop; returns the port. Raises ``OSError`` when the
        address cannot be bound."""
        app = web.Application(
            client_max_size=self._max,
            middlewares=[body_timeout_middleware(self._listen, self.listener)],
        )
        app.add_routes(self._routes)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=self._shutdown_timeout,
            keepalive_timeout=self._listen.keepalive_timeout_seconds,
            max_line_size=MAX_FIELD_BYTES,
            max_field_size=MAX_FIELD_BYTES,
        )
        await self._runner.setup()
        try:
            await GuardedSite(
                self._runner, host, port, limits=self._listen, stats=self.listener
            ).start()
        except OSError:
            await self.stop()
            raise
        addrs = self._runner.addresses
        self.port = int(addrs[0][1]) if addrs else port
        return self.port

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
