"""What specwatch reads and writes on the wire: header names, Envoy's ``-shadow`` host suffix, base
URLs.

A gateway that mirrors traffic (Envoy ``request_mirror_policies``) appends
:data:`SHADOW_HOST_SUFFIX` to the
mirrored copy's host name; it (or the load generator) may name the request's category in
:data:`CATEGORY_HEADER`; every request specwatch replays carries :data:`SHADOW_MARKER_HEADER` so a
proxy in
front of the arms never mirrors a replay again."""

from __future__ import annotations

#: The header that names a mirrored request's category (``math``, ``code``, …); absent →
#: ``default``.
CATEGORY_HEADER = "X-Specwatch-Category"

#: The default header specwatch sets on its own replays (``shadow.marker_header``); requests
#: carrying it
#: are never sampled again.
SHADOW_MARKER_HEADER = "X-Specwatch-Shadow"

#: The suffix Envoy appends to the host name of a mirrored copy (``api:8000`` →
#: ``api-shadow:8000``).
SHADOW_HOST_SUFFIX = "-shadow"


def is_shadow_host(host: str | None) -> bool:
    """True when the Host's name part (port removed) ends in :data:`SHADOW_HOST_SUFFIX`,
    case-insensitive.

    ``"api-shadow:8000"`` → True; ``"shadow-api:80"``, ``""`` and ``None`` → False. Never raises."""
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.lower().endswith(SHADOW_HOST_SUFFIX)


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
