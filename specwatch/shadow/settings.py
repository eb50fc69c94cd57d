"""Settings of the shadow I/O chain (ingest, sampler, replay, canary).

``ShadowSettings`` is a plain pydantic model so the core settings (pydantic-settings) can nest it
as one group (``SPECWATCH_SHADOW__...`` environment variables or a YAML ``shadow:`` block).
Durations are seconds, rates per second, sizes bytes.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from specwatch.core.config import (
    DEFAULT_ALPHA,
    DEFAULT_LOAD_BANDS,
    DEFAULT_MARGIN,
    DEFAULT_MAX_CATEGORIES,
    SINCE_START,
    check_windows,
    parse_duration,
    split_list,
)
from specwatch.core.frozen import Frozen
from specwatch.core.wire import SHADOW_MARKER_HEADER

IngestMode = Literal["mirror", "proxy", "canary"]
NoiseKind = Literal["off", "standard", "baseline"]


class ArmEndpoint(BaseModel):
    """Where one replay arm is sent.

    ``url`` is the OpenAI-compatible base URL without ``/v1`` (``http://vllm-std:8000``); ``target``
    names the observe target of the same server (used by ``load_state`` for the load-aware pause);
    ``token`` is sent as ``Authorization: Bearer <token>`` when set; ``model`` overrides the
    request's ``model`` field when set (the two servers may serve the model under different names).
    ``keepalive_seconds`` is how long the replay client keeps an idle connection to this arm: keep
    it below the server's idle timeout (vLLM closes idle connections after
    ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default), so the client never reuses a socket the
    server is closing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    target: str | None = None
    token: str | None = Field(default=None, repr=False)
    model: str | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    keepalive_seconds: float = Field(default=4.0, gt=0)

    @field_validator("url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("arm url must start with http:// or https://")
        return v.rstrip("/")


class ShadowSettings(BaseModel):
    """The shadow I/O group.

    Sampler: ``sample_probability`` p in [0, 1] decided by the request hash;
    ``category_quota_per_second`` (token bucket per category, burst ``category_quota_burst``);
    ``max_categories`` distinct request categories keep their own series (the ledger's largest
    at start, then new ones while there is room), every other category is counted as ``other``;
    slots are kept by volume: a category outside the set takes the weakest kept one's slot when
    its requests over ``category_window_seconds`` (decayed) are at least
    ``category_takeover_ratio`` times the weakest one's and at least
    ``category_takeover_min_requests``, for ``category_takeover_seconds`` in a row;
    ``queue_size`` bounded queue; ``max_shadow_rps`` and ``max_in_flight`` caps; load-aware pause
    when any arm has waiting > 0 (``pause_on_waiting``) or running >= ``pause_running_fraction`` *
    max_num_seqs.

    Mirror: mirrored copies are received on their own listener, ``mirror_listen_host``:
    ``mirror_listen_port`` (default 9402; 0 = any free port), never on the ``/metrics`` port;
    bodies over ``mirror_max_body_bytes`` (16 MiB) are refused (``too_large``). The proxy's body
    limit ``proxy_max_body_bytes`` is 16 MiB as well (bodies over it are relayed, not copied).
    The proxy (for users without a mesh) is an aiohttp streaming proxy on the sidecar's loop.

    Replay: arms ``standard``, ``fly`` and optional ``noise`` (``noise_kind``: ``standard`` = a
    second replay to the standard arm's endpoint unless ``noise`` is given, ``baseline`` = a
    target-only endpoint given in ``noise``); ``baseline`` an optional server without
    speculation: the standard arm is compared with it on greedy requests (the lossless check,
    whose noise floor is the noise arm's agreement with the baseline, so point ``noise`` at a
    second no-speculation server or at the baseline itself); ``max_tokens_cap`` caps
    ``max_tokens``/``max_completion_tokens``; ``marker_header`` is set to ``1`` on every shadow
    request; ``stream_arms`` names arms that only answer streams (their replay is parsed with
    :mod:`specwatch.shadow.sse`).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    modes: tuple[IngestMode, ...] = ("mirror",)

    # sampler
    sample_probability: float = Field(default=0.05, ge=0.0, le=1.0)
    sample_salt: str = ""
    category_quota_per_second: dict[str, float] = Field(default_factory=dict)
    default_category_quota_per_second: float | None = Field(default=None, gt=0)
    category_quota_burst: float = Field(default=5.0, ge=1.0)
    max_categories: int = Field(default=DEFAULT_MAX_CATEGORIES, ge=0, le=1000)
    category_window_seconds: float = Field(default=600.0, gt=0)
    category_takeover_ratio: float = Field(default=1.5, ge=1.0)
    category_takeover_seconds: float = Field(default=120.0, ge=0)
    category_takeover_min_requests: float = Field(default=10.0, ge=0)
    queue_size: int = Field(default=256, ge=1)
    max_shadow_rps: float = Field(default=5.0, gt=0)
    max_in_flight: int = Field(default=4, ge=1)
    pause_on_waiting: bool = True
    pause_running_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    load_state_max_age_seconds: float = Field(default=30.0, gt=0)
    max_queue_age_seconds: float = Field(default=60.0, gt=0)
    pause_poll_seconds: float = Field(default=0.5, gt=0)

    # replay arms
    standard: ArmEndpoint | None = None
    fly: ArmEndpoint | None = None
    noise: ArmEndpoint | None = None
    noise_kind: NoiseKind = "off"
    baseline: ArmEndpoint | None = None
    stream_arms: tuple[Literal["standard", "fly", "noise", "baseline"], ...] = ()
    max_tokens_cap: int = Field(default=512, ge=1)
    replay_extra_body: dict[str, Any] = Field(default_factory=dict)
    marker_header: str = SHADOW_MARKER_HEADER

    # mirror: its own listener, never the /metrics port (anyone who can scrape must not be able
    # to inject requests that are replayed to the GPU arms)
    mirror_listen_host: str = "0.0.0.0"
    mirror_listen_port: int = Field(default=9402, ge=0, le=65535)
    mirror_max_body_bytes: int = Field(default=16 << 20, ge=1024)
    mirror_require_shadow_host: bool = False

    # proxy
    proxy_listen_host: str = "0.0.0.0"
    proxy_listen_port: int = Field(default=9401, ge=0, le=65535)
    proxy_upstream: str | None = None
    proxy_max_body_bytes: int = Field(default=16 << 20, ge=1024)
    proxy_connect_timeout_seconds: float = Field(default=10.0, gt=0)
    proxy_total_timeout_seconds: float | None = Field(default=None, gt=0)
    proxy_stream_idle_timeout_seconds: float | None = Field(default=60.0, gt=0)

    # canary
    canary_file: str | None = None
    canary_builtin: bool = False
    canary_rate_per_second: float = Field(default=0.2, gt=0)
    canary_loop: bool = True
    canary_model: str | None = None

    # ledger hint (read by the ledger owner)
    store_text: bool = False

    @field_validator("proxy_upstream")
    @classmethod
    def _upstream(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError("proxy_upstream must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("marker_header")
    @classmethod
    def _header(cls, v: str) -> str:
        if not v or any(c in v for c in " :\r\n\t"):
            raise ValueError("marker_header must be a header token")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ShadowSettings:
        if self.enabled and (self.standard is None or self.fly is None):
            raise ValueError("shadow.enabled needs both shadow.standard and shadow.fly")
        if self.noise_kind == "baseline" and self.noise is None:
            raise ValueError("noise_kind=baseline needs shadow.noise (the baseline endpoint)")
        if self.enabled and "proxy" in self.modes and self.proxy_upstream is None:
            raise ValueError("proxy mode needs shadow.proxy_upstream")
        if (
            self.enabled
            and "canary" in self.modes
            and self.canary_file is None
            and not self.canary_builtin
        ):
            raise ValueError("canary mode needs shadow.canary_file or shadow.canary_builtin")
        return self

    def noise_endpoint(self) -> ArmEndpoint | None:
        """The endpoint of the noise arm, or ``None`` when the noise arm is off."""
        if self.noise_kind == "off":
            return None
        if self.noise is not None:
            return self.noise
        return self.standard


class LedgerSettings(Frozen):
    """The paired-outcome ledger (SQLite, WAL): ``path`` (relative paths are under the working
    directory; the container's is ``/var/lib/specwatch``), retention ``max_age_seconds`` and
    ``max_rows`` (``None`` = keep), ``synchronous`` (SQLite; ``FULL`` also survives power loss).
    Prompt and completion text are stored only with ``shadow.store_text``. While running,
    SQLite's quick integrity check runs every ``integrity_check_seconds`` in a worker thread
    (``None``: never); a ledger found corrupt stops pairing and is moved aside at the next
    start."""

    path: str = "specwatch-ledger.sqlite"
    max_age_seconds: float | None = Field(default=30 * 86400.0, gt=0)
    max_rows: int | None = Field(default=5_000_000, gt=0)
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    integrity_check_seconds: float | None = Field(default=3600.0, gt=0)


class PairedSettings(Frozen):
    """Paired statistics over the ledger: ``alpha`` (test level; e-value alarm at 1/alpha),
        ``margin`` (non-inferiority margin on the net loss, a fraction: 0.01 = one point),
        ``detect_net_loss`` (the net loss ``questions_needed`` is sized for, power ``power``),
        ``windows`` (rolling windows; ``since_start`` = the whole ledger is always added; the
        defaults include the alert detectors' ``flip_window`` 1h and ``shadow_stalled_window`` 15m;
        kept in memory in 10-second buckets, so a window reaches back up to 10 s further than its
        length), ``refresh_seconds`` (how often the statistics are published: the in-memory tallies
        are updated per stored pair, the ledger is read only at start), ``load_bands``
        (lower bounds of the running-request bands flips are split by: ``0,8,32`` gives ``0-7``,
        ``8-31``, ``32+``), ``change_arl`` (the change detector's threshold: its mean run length
    to a false alarm under no loss is at least this many labelled pairs)."""

    alpha: float = Field(default=DEFAULT_ALPHA, gt=0.0, lt=1.0)
    margin: float = Field(default=DEFAULT_MARGIN, ge=0.0, lt=1.0)
    detect_net_loss: float = Field(default=0.02, gt=0.0, lt=1.0)
    power: float = Field(default=0.8, gt=0.0, lt=1.0)
    change_arl: float = Field(default=50_000.0, gt=1.0)
    windows: Annotated[tuple[str, ...], NoDecode] = ("15m", "1h", "24h")
    refresh_seconds: float = Field(default=2.0, gt=0)
    load_bands: Annotated[tuple[int, ...], NoDecode] = DEFAULT_LOAD_BANDS

    @field_validator("load_bands", mode="before")
    @classmethod
    def _split_bands(cls, v: Any) -> Any:
        return split_list(v)

    @field_validator("load_bands")
    @classmethod
    def _check_bands(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or v[0] != 0 or any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError("load_bands must start at 0 and increase (e.g. 0,8,32)")
        return v

    @field_validator("windows", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return split_list(v)

    @field_validator("windows")
    @classmethod
    def _check(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_windows(v)

    @property
    def window_seconds(self) -> dict[str, float | None]:
        """Window name → seconds, with ``since_start`` → ``None`` (every ledger row)."""
        out: dict[str, float | None] = {w: parse_duration(w) for w in self.windows}
        out[SINCE_START] = None
        return out
