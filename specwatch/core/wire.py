"""What specwatch reads and writes on the wire: header names, the ``-shadow`` host suffix of
mirrored copies and the origin they name, base URLs.

A gateway that mirrors traffic (Envoy ``request_mirror_policies``) appends
:data:`SHADOW_HOST_SUFFIX` to the
mirrored copy's host name; it (or the load generator) may name the request's category in
:data:`CATEGORY_HEADER`; every request specwatch replays carries :data:`SHADOW_MARKER_HEADER` so a
proxy in
front of the arms never mirrors a replay again."""

from __future__ import annotations

from dataclasses import dataclass

#: The header that names a mirrored request's category (``math``, ``code``, …); absent →
#: ``default``.
CATEGORY_HEADER = "X-Specwatch-Category"

#: The default header specwatch sets on its own replays (``shadow.marker_header``); requests
#: carrying it
#: are never sampled again.
SHADOW_MARKER_HEADER = "X-Specwatch-Shadow"

#: The suffix a mesh appends to the Host (``:authority``) of a mirrored copy: Envoy since 2018
#: (``request_mirror_policies``, so Istio ``mirror`` and the Gateway API ``RequestMirror``
#: filter) to the host name, ``api:8000`` → ``api-shadow:8000``; Envoy before that, and gateways
#: that append to the whole authority, after the port, ``api:8000`` → ``api:8000-shadow``.
SHADOW_HOST_SUFFIX = "-shadow"


@dataclass(frozen=True, slots=True)
class ShadowOrigin:
    """The live request's host (lower-cased) and port (``None`` when the authority has none)
    read from a mirrored copy's authority, :data:`SHADOW_HOST_SUFFIX` removed."""

    host: str
    port: int | None


def _port(text: str) -> int | None:
    """A decimal port 1..65535, else ``None``."""
    if not (0 < len(text) <= 5 and text.isascii() and text.isdigit()):
        return None
    port = int(text)
    return port if 0 < port <= 65535 else None


def shadow_origin(authority: str | None) -> ShadowOrigin | None:
    """The origin host and port of a mirrored copy's authority (a ``Host`` value), or ``None``
    when it carries no :data:`SHADOW_HOST_SUFFIX` (case-insensitive) in either form a mesh
    writes it: on the host name (``"svc-shadow:8000"``, ``"svc-shadow"``,
    ``"[fd00::1]-shadow:8000"``) or after the port (``"svc:8000-shadow"``,
    ``"[fd00::1]:8000-shadow"``). Both give ``ShadowOrigin("svc", 8000)``. A port that is not
    1..65535 or an empty host name is no origin. Never raises."""
    if not authority:
        return None
    text = authority.strip().lower()
    n = len(SHADOW_HOST_SUFFIX)
    if text.startswith("["):  # an IPv6 literal
        end = text.find("]")
        if end < 0:
            return None
        host, rest = text[: end + 1], text[end + 1 :]
        if rest.startswith(SHADOW_HOST_SUFFIX):
            rest = rest[n:]
        elif rest.endswith(SHADOW_HOST_SUFFIX):
            rest = rest[:-n]
        else:
            return None
        if len(host) < 3:
            return None
        if not rest:
            return ShadowOrigin(host, None)
        port = _port(rest[1:]) if rest.startswith(":") else None
        return ShadowOrigin(host, port) if port is not None else None
    name, colon, port_text = text.rpartition(":")
    if not colon:
        name, port_text = text, ""
    if port_text.endswith(SHADOW_HOST_SUFFIX) and colon:
        port = _port(port_text[:-n])
        return ShadowOrigin(name, port) if port is not None and name else None
    if not name.endswith(SHADOW_HOST_SUFFIX) or len(name) == n:
        return None
    if not colon:
        return ShadowOrigin(name[:-n], None)
    port = _port(port_text)
    return ShadowOrigin(name[:-n], port) if port is not None else None


def server_base(url: str) -> str:
    """A vLLM server's ``/metrics`` URL (or its base URL) → its base URL, without a trailing slash.

    ``"http://h:8000/metrics"``, ``"http://h:8000/metrics/"`` and ``"http://h:8000/"`` all give
    ``"http://h:8000"``: the URL replay arms are sent to, and the key that matches an arm to a
    scraped
    target. Pure string work; never raises."""
    u = url.rstrip("/")
    if u.endswith("/metrics"):
        u = u[: -len("/metrics")].rstrip("/")
    return u
