"""Settings the observe chain reads: the vLLM targets and the scrape defaults."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from specwatch.core.config import NAME_RE
from specwatch.core.frozen import Frozen
from specwatch.core.roles import Role
from specwatch.observe.values import Limits
from specwatch.vllm.methods import SPEC_METHODS, regime_for_version
from specwatch.vllm.sglang import EngineKind


class TargetSettings(Frozen):
    """One vLLM (or SGLang) server to scrape. Its limits feed the capacity and budget views
    (:attr:`limits`); each field says what it is (and ``docs/settings.md`` lists them).
    """

    name: str
    """Name of the target, used in metric labels: 1-64 letters, digits, `_ . : -`. A name
    that is a role (`standard`, `fly`, `baseline`, `prefill`, `decode`) sets the role too."""
    url: str
    """Base URL of the server (`http://vllm:8000`) or its full metrics URL; `/metrics` is
    added when the path is empty."""
    role: Role | None = None
    """What the server is in the comparison: `standard`, `fly` or `baseline`, or in
    disaggregated serving `prefill` (never expected to speculate) or `decode` (compared with
    the `baseline` target); needed when the name is not a role."""
    max_num_seqs: int | None = Field(default=None, gt=0)
    """The server's `--max-num-seqs` (SGLang: `max_running_requests`); enables the capacity
    and budget views."""
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    """The server's `--max-num-batched-tokens` token budget per step; enables the budget
    view."""
    num_speculative_tokens: int | None = Field(default=None, gt=0)
    """Draft length K (`num_speculative_tokens`; SGLang: `speculative_num_draft_tokens` -
    1)."""
    method: str | None = None
    """Speculative method (`eagle`, `eagle3`, `mtp`, `ngram`, ...); `*_mtp` is read as
    `mtp`."""
    parallel_drafting: bool = False
    """True when the drafter proposes all K tokens in one pass (parallel drafting); changes
    the budget arithmetic."""
    drafter_max_model_len: int | None = Field(default=None, gt=0)
    """The drafter's own context limit in tokens (its `max_model_len`; 2048 for stock EAGLE-3
    heads). vLLM zero-fills the drafts of a step whose longest sequence plus K no longer fits
    it; with it set, an acceptance drop on long prompts is named `drafter_context_limit`."""
    dynamic_k: bool = False
    """True when the server shortens drafts as the batch grows
    (`num_speculative_tokens_per_batch_size`): a mean draft length below K is then by design,
    not the token budget."""
    structured_output: bool = False
    """True when the traffic uses structured output (grammars, JSON schemas): vLLM subtracts the
    draft tokens the grammar invalidates, so a mean draft length below K is by design."""
    vllm_version: str | None = None
    """vLLM version of the server (`0.10.1`), when its metrics cannot tell; picks the metric
    regime."""
    engine: EngineKind | None = None
    """`vllm` or `sglang`; unset: told from each scraped page."""
    bearer_token: SecretStr | None = None
    """Sent as `Authorization: Bearer` on every scrape; never logged or exported. Do not
    combine with a `user:password` URL."""
    scrape_interval_seconds: float | None = Field(default=None, gt=0)
    """This target's scrape interval, overriding `scrape.interval_seconds`."""
    scrape_timeout_seconds: float | None = Field(default=None, gt=0)
    """This target's scrape timeout, overriding `scrape.timeout_seconds`."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, _ . : -")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        m = re.match(r"^(https?)://([^/\s]+)(/\S*)?$", v)
        if m is None:
            raise ValueError("must be an http:// or https:// URL")
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as exc:
            raise ValueError(f"not a valid URL: {exc}") from None
        if not parts.hostname:
            raise ValueError("not a valid URL: no host")
        if not m.group(3) or m.group(3) == "/":
            return f"{m.group(1)}://{m.group(2)}/metrics"
        return v

    @field_validator("method")
    @classmethod
    def _method(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        if v.endswith("_mtp"):
            v = "mtp"
        if v not in SPEC_METHODS:
            raise ValueError(f"unknown method; one of {', '.join(sorted(SPEC_METHODS))}")
        return v

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None:
            regime_for_version(v)
        return v

    @model_validator(mode="after")
    def _role(self) -> TargetSettings:
        if self.role is None:
            try:
                object.__setattr__(self, "role", Role(self.name))
            except ValueError:
                raise ValueError(
                    f"target {self.name!r}: role is required "
                    "(standard|fly|baseline|prefill|decode) when the name is not a role"
                ) from None
        if self.bearer_token is not None and urlsplit(self.url).password is not None:
            raise ValueError(
                f"target {self.name!r}: bearer_token and a user:password in the url both set "
                "(HTTP allows one Authorization header); keep one"
            )
        return self

    @property
    def effective_role(self) -> Role:
        """The role (inferred from the name when not given)."""
        assert self.role is not None  # set by the validator
        return self.role

    @property
    def limits(self) -> Limits:
        """The configured scheduler limits as a :class:`~specwatch.observe.values.Limits`."""
        return Limits(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_speculative_tokens=self.num_speculative_tokens,
            method=self.method,
            parallel_drafting=self.parallel_drafting,
            vllm_version=self.vllm_version,
            engine=self.engine,
        )


class ScrapeSettings(Frozen):
    """Scrape defaults, and the bounds on how many series one target may make specwatch keep
    (series already tracked keep their place; further ones are dropped and counted)."""

    interval_seconds: float = Field(default=5.0, gt=0)
    """Seconds between two scrapes of each target. Lower it for quicker detection, raise it
    to load the server less."""
    timeout_seconds: float = Field(default=4.0, gt=0)
    """A scrape that takes longer than this many seconds fails (counted); keep it below the
    interval."""
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Largest `/metrics` page read, in bytes after decompression; a larger page is refused
    and counted."""
    max_models_per_target: int = Field(default=8, ge=1, le=1000)
    """Most distinct `model_name` values kept per target; more are dropped from each page
    and counted (`model_cap`). Raise it for a server with many LoRA adapters."""
    max_engines_per_target: int = Field(default=64, ge=1, le=10000)
    """Most (model_name, engine) pairs kept per target; more are dropped and counted
    (`engine_cap`). Raise it for very wide data-parallel servers."""
    stale_series_seconds: float = Field(default=1800.0, gt=0)
    """State of a (model_name, engine) not seen for this many seconds is forgotten, freeing
    its place."""
