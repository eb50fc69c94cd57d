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
    DEFAULT_CHANGE_ARL,
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
    """Where one replay arm is sent (the fields say how)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    url: str
    """OpenAI-compatible base URL of the arm's server, without `/v1`
    (`http://vllm-std:8000`); may be left out when `target` is given."""
    target: str | None = None
    """Name of the observe target that is the same server: its URL is used when `url` is
    absent, and its load drives the load-aware pause."""
    token: str | None = Field(default=None, repr=False)
    """Sent as `Authorization: Bearer` on replays to this arm; never logged."""
    model: str | None = None
    """Replaces the request's `model` field on replays, when the two servers serve the model
    under different names."""
    timeout_seconds: float = Field(default=120.0, gt=0)
    """A replay to this arm that takes longer than this many seconds is abandoned and
    counted."""
    keepalive_seconds: float = Field(default=4.0, gt=0)
    """How long an idle connection to this arm is kept; keep it below the server's idle
    timeout (vLLM: 5 s) so a closing socket is never reused."""

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

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Turn shadow replay on; needs `shadow.standard` and `shadow.fly`."""
    modes: tuple[IngestMode, ...] = ("mirror",)
    """Where requests to replay come from: `mirror` (copies sent by a mesh or nginx to the
    mirror port), `proxy` (specwatch forwards live traffic) and/or `canary` (a fixed prompt
    set)."""

    # sampler
    sample_probability: float = Field(default=0.05, ge=0.0, le=1.0)
    """Fraction of incoming requests replayed, chosen by a hash of the request (the same
    request is always in or out)."""
    sample_salt: str = ""
    """Mixed into the sampling hash; change it to sample a different subset of requests."""
    category_quota_per_second: dict[str, float] = Field(default_factory=dict)
    """Most replays per second per request category (`{"chat": 1.0}`); categories not listed
    use `default_category_quota_per_second`."""
    default_category_quota_per_second: float | None = Field(default=None, gt=0)
    """Quota per second of each category absent from `category_quota_per_second`; unset: no
    quota."""
    category_quota_burst: float = Field(default=5.0, ge=1.0)
    """How many replays a category may take at once above its quota (token-bucket size)."""
    max_categories: int = Field(default=DEFAULT_MAX_CATEGORIES, ge=0, le=1000)
    """Most request categories given their own series; the rest are counted as `other`.
    Bounds metric cardinality. Each series (and `other`) is also a category test of the quality
    page, whose per-category bound grows with their number (680 at the default 10)."""
    category_window_seconds: float = Field(default=600.0, gt=0)
    """Time scale, in seconds, over which category volumes are compared when a new category
    competes for a slot."""
    category_takeover_ratio: float = Field(default=1.5, ge=1.0)
    """A new category takes the weakest kept category's slot when its recent volume is at
    least this many times the weakest one's."""
    category_takeover_seconds: float = Field(default=120.0, ge=0)
    """... and has stayed so for this many seconds in a row."""
    category_takeover_min_requests: float = Field(default=10.0, ge=0)
    """... and has at least this many recent requests."""
    queue_size: int = Field(default=256, ge=1)
    """Most sampled requests waiting for replay; more are dropped and counted."""
    max_shadow_rps: float = Field(default=5.0, gt=0)
    """Most replays started per second, all arms together; the main guard on GPU load added
    by the shadow side."""
    max_in_flight: int = Field(default=4, ge=1)
    """Most replays running at once."""
    pause_on_waiting: bool = True
    """Pause replays while any arm's server has requests waiting, so the shadow side never
    queues ahead of live traffic."""
    pause_running_fraction: float = Field(default=0.8, gt=0.0, le=1.0)
    """Also pause while an arm runs at least this fraction of its `max_num_seqs`."""
    load_state_max_age_seconds: float = Field(default=30.0, gt=0)
    """Pause too when an arm's last good scrape is older than this many seconds (its load is
    unknown); keep it a few scrape intervals."""
    max_queue_age_seconds: float = Field(default=60.0, gt=0)
    """A sampled request that waited longer than this many seconds is dropped instead of
    replayed."""

    # replay arms
    standard: ArmEndpoint | None = None
    """The arm without FLy (the reference)."""
    fly: ArmEndpoint | None = None
    """The arm with FLy speculation (the candidate)."""
    noise: ArmEndpoint | None = None
    """Optional second endpoint measuring the noise floor (see `noise_kind`)."""
    noise_kind: NoiseKind = "off"
    """`off`; `standard`: replay each request twice to the standard arm (or to `noise`) to
    measure agreement by chance; `baseline`: `noise` is a target-only server."""
    baseline: ArmEndpoint | None = None
    """Optional server without speculation; the standard arm is compared with it on greedy
    requests (the lossless check)."""
    stream_arms: tuple[Literal["standard", "fly", "noise", "baseline"], ...] = ()
    """Arms that only answer streaming requests; their replays are sent as streams and
    parsed."""
    max_tokens_cap: int = Field(default=512, ge=1)
    """Replays ask for at most this many tokens (`max_tokens` / `max_completion_tokens` is
    lowered to it)."""
    replay_extra_body: dict[str, Any] = Field(default_factory=dict)
    """JSON fields added to every replayed request body."""
    marker_header: str = SHADOW_MARKER_HEADER
    """Header set to `1` on every shadow request, so servers and meshes can tell replays
    from live traffic."""

    # mirror: its own listener, never the /metrics port (anyone who can scrape must not be able
    # to inject requests that are replayed to the GPU arms)
    mirror_listen_host: str = "0.0.0.0"
    """Address the mirror listener binds (never the `/metrics` port: who can scrape must not
    be able to inject replays)."""
    mirror_listen_port: int = Field(default=9402, ge=0, le=65535)
    """Port mirrored copies are sent to; 0 picks a free port."""
    mirror_max_body_bytes: int = Field(default=16 << 20, ge=1024)
    """Mirrored bodies larger than this many bytes are refused (`too_large`)."""
    mirror_require_shadow_host: bool = False
    """Accept mirrored copies only when their Host ends in `-shadow` (what Envoy and Istio
    mirroring set)."""

    # proxy
    proxy_listen_host: str = "0.0.0.0"
    """Address the proxy listener binds (proxy mode)."""
    proxy_listen_port: int = Field(default=9401, ge=0, le=65535)
    """Port live traffic is sent to in proxy mode; 0 picks a free port."""
    proxy_upstream: str | None = None
    """The server the proxy forwards live traffic to (`http://vllm:8000`); required in proxy
    mode."""
    proxy_max_body_bytes: int = Field(default=16 << 20, ge=1024)
    """Largest request body the proxy forwards, in bytes; larger requests are refused."""
    proxy_connect_timeout_seconds: float = Field(default=10.0, gt=0)
    """Seconds the proxy waits to connect to the upstream."""
    proxy_total_timeout_seconds: float | None = Field(default=None, gt=0)
    """Longest a proxied request may take in all, in seconds; unset: no limit."""
    proxy_stream_idle_timeout_seconds: float | None = Field(default=60.0, gt=0)
    """A proxied stream silent for this many seconds is cut; unset: never."""

    # canary
    canary_file: str | None = None
    """JSONL file of canary requests replayed in `canary` mode."""
    canary_builtin: bool = False
    """Also replay the built-in canary prompts in `canary` mode (with or without
    `canary_file`)."""
    canary_rate_per_second: float = Field(default=0.2, gt=0)
    """Canary requests sent per second."""
    canary_min_rate_per_second: float = Field(default=0.01, ge=0)
    """Canary requests still replayed per second while replays pause for load (requests waiting
    or running near `max_num_seqs`, never a stale load reading), so the quality verdict keeps
    moving when live traffic starves the shadow side; 0 turns the trickle off. Never more than
    `canary_rate_per_second` (the lower of the two is used): one short request every 100 s
    adds next to nothing to a busy server."""
    canary_loop: bool = True
    """Start the canary file again when it ends (false: send it once)."""
    canary_model: str | None = None
    """`model` of canary requests whose line names none (and of the built-in set); unset:
    left out."""

    # ledger hint (read by the ledger owner)
    store_text: bool = False
    """Store prompt and completion text in the ledger (off: only hashes and outcomes). Mind
    what your prompts contain."""

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
    """The paired-outcome ledger (SQLite, WAL) and its retention. Prompt and completion text are
    stored only with ``shadow.store_text``; a ledger found corrupt stops pairing and is moved
    aside at the next start."""

    path: str = "specwatch-ledger.sqlite"
    """SQLite file of the ledger; relative paths are under the working directory (the
    container's is `/var/lib/specwatch`)."""
    max_age_seconds: float | None = Field(default=30 * 86400.0, gt=0)
    """Rows older than this many seconds are deleted; unset: kept."""
    max_rows: int | None = Field(default=5_000_000, gt=0)
    """Oldest rows beyond this count are deleted; unset: kept."""
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"
    """SQLite `synchronous` mode: `NORMAL` survives a crash of specwatch, `FULL` also a
    power loss, `OFF` neither."""
    integrity_check_seconds: float | None = Field(default=3600.0, gt=0)
    """Seconds between SQLite quick integrity checks (in a worker thread); a corrupt ledger
    stops pairing and is moved aside at the next start. Unset: never."""


class PairedSettings(Frozen):
    """Paired statistics over the ledger. Windows are kept in memory in 10-second buckets, so a
    window reaches back up to 10 s further than its length; the in-memory tallies are updated
    per stored pair and the ledger is read only at start."""

    alpha: float = Field(default=DEFAULT_ALPHA, gt=0.0, lt=1.0)
    """Level of the whole critical quality page: the chance that SpecQualityDrift ever fires
    while FLy loses nothing, every category and both hypotheses together, is at most alpha
    (docs/runbook.md, "The quality alerting policy"). Lower it for fewer false pages and slower
    detection."""
    margin: float = Field(default=DEFAULT_MARGIN, ge=0.0, lt=1.0)
    """Non-inferiority margin on the net loss, a fraction (0.01 = one point): losses below
    it are accepted."""
    detect_net_loss: float = Field(default=0.02, gt=0.0, lt=1.0)
    """The net loss `questions_needed` is sized for."""
    power: float = Field(default=0.8, gt=0.0, lt=1.0)
    """The power `questions_needed` is sized for."""
    change_arl: float = Field(default=DEFAULT_CHANGE_ARL, gt=1.0)
    """Threshold of the change detector (the warning SpecQualityChange): its mean run to a
    false alarm with no loss is at least this many labelled pairs (500,000: about 29 days at
    0.2 pairs/s). Raise it for fewer false warnings."""
    windows: Annotated[tuple[str, ...], NoDecode] = ("15m", "1h", "24h")
    """Rolling windows of the paired statistics (`since_start`, the whole ledger, is always
    added). Keep the detectors' `flip_window` and `shadow_stalled_window` among them: a
    detector window absent here reads `since_start` instead."""
    refresh_seconds: float = Field(default=2.0, gt=0)
    """Seconds between two publications of the paired statistics."""
    load_bands: Annotated[tuple[int, ...], NoDecode] = DEFAULT_LOAD_BANDS
    """Lower bounds of the running-request bands flips are split by: `0,8,32` gives `0-7`,
    `8-31`, `32+`."""

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
