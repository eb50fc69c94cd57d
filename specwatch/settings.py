"""Settings: one frozen object built once (env ``SPECWATCH_``, nested ``__``, an optional YAML or
TOML file, CLI flags over both) and passed down.

Precedence, highest first: CLI flags (constructor keyword arguments) > environment
(``SPECWATCH_SCRAPE__INTERVAL_SECONDS=2``, ``SPECWATCH_TARGETS='[{"name": "fly", ...}]'``) >
the ``--config`` file > defaults. Other groups (shadow, alerting, detect) are added as one field
each on :class:`Settings`.
"""

from __future__ import annotations

import contextvars
import json
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from specwatch.alerting import AlertingSettings
from specwatch.detect import DetectSettings
from specwatch.logs import redact_url
from specwatch.model import Limits, Role
from specwatch.shadow.settings import ShadowSettings
from specwatch.specdecode import SPEC_METHODS, regime_for_version


class ConfigError(ValueError):
    """A bad configuration value; ``str()`` is one line naming the field."""


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"90"``, ``"30s"``, ``"1m"``, ``"1.5h"``, ``"500ms"`` → seconds. Raises ``ValueError``."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 1m, 1h)")
    return float(m.group(1)) * _UNIT[m.group(2)]


_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def split_list(v: Any) -> Any:
    """A list given as one string: JSON (``["1m","5m"]``) or comma-separated (``1m,5m``)."""
    if isinstance(v, str):
        v = json.loads(v) if v.strip().startswith("[") else v.split(",")
    return v


def check_windows(v: tuple[str, ...]) -> tuple[str, ...]:
    """Window names: positive durations, unique, ``since_start`` not listed (always present)."""
    names = tuple(w.strip() for w in v)
    for w in names:
        if w == "since_start":
            raise ValueError("since_start is always present; do not list it")
        if parse_duration(w) <= 0:
            raise ValueError(f"window {w!r} must be longer than 0 s")
    if len(set(names)) != len(names):
        raise ValueError("window names must be unique")
    return names


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TargetSettings(_Frozen):
    """One vLLM server to scrape.

    ``url``: base URL or full ``/metrics`` URL (``/metrics`` is appended when the path is empty).
    ``role`` defaults to the name when the name is a role. Limits (``max_num_seqs``,
    ``max_num_batched_tokens``, ``num_speculative_tokens`` K, ``method``, ``parallel_drafting``,
    ``vllm_version``) feed the capacity / budget view. ``bearer_token`` is sent as
    ``Authorization: Bearer``; never logged or exported. Scrape interval/timeout override
    :class:`ScrapeSettings` when set.
    """

    name: str
    url: str
    role: Role | None = None
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    num_speculative_tokens: int | None = Field(default=None, gt=0)
    method: str | None = None
    parallel_drafting: bool = False
    vllm_version: str | None = None
    bearer_token: SecretStr | None = None
    scrape_interval_seconds: float | None = Field(default=None, gt=0)
    scrape_timeout_seconds: float | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be 1-64 characters of letters, digits, _ . : -")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip()
        m = re.match(r"^(https?)://([^/\s]+)(/\S*)?$", v)
        if m is None:
            raise ValueError("must be an http:// or https:// URL")
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
                    f"target {self.name!r}: role is required (standard|fly|baseline) "
                    "when the name is not a role"
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
        """The configured scheduler limits as a :class:`~specwatch.model.Limits`."""
        return Limits(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_speculative_tokens=self.num_speculative_tokens,
            method=self.method,
            parallel_drafting=self.parallel_drafting,
            vllm_version=self.vllm_version,
        )


class ScrapeSettings(_Frozen):
    """Scrape defaults: interval and timeout in seconds, body cap in bytes (decompressed)."""

    interval_seconds: float = Field(default=5.0, gt=0)
    timeout_seconds: float = Field(default=4.0, gt=0)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)


class ServerSettings(_Frozen):
    """Where specwatch serves ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/snapshot``."""

    host: str = "0.0.0.0"
    port: int = Field(default=9400, ge=0, le=65535)


class LogSettings(_Frozen):
    """Log level and format (``json`` one object per line, or ``plain``)."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "plain"] = "json"

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


class LedgerSettings(_Frozen):
    """The paired-outcome ledger (SQLite, WAL): ``path`` (relative paths are under the working
    directory; the container's is ``/var/lib/specwatch``), retention ``max_age_seconds`` and
    ``max_rows`` (``None`` = keep), ``synchronous`` (SQLite; ``FULL`` also survives power loss).
    Prompt and completion text are stored only with ``shadow.store_text``."""

    path: str = "specwatch-ledger.sqlite"
    max_age_seconds: float | None = Field(default=30 * 86400.0, gt=0)
    max_rows: int | None = Field(default=5_000_000, gt=0)
    synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "NORMAL"


class PairedSettings(_Frozen):
    """Paired statistics over the ledger: ``alpha`` (test level; e-value alarm at 1/alpha),
    ``margin`` (non-inferiority margin on the net loss, a fraction: 0.01 = one point),
    ``detect_net_loss`` (the net loss ``questions_needed`` is sized for, power ``power``),
    ``windows`` (rolling windows; ``since_start`` = the whole ledger is always added; the
    defaults include the alert detectors' ``flip_window`` 1h and ``shadow_stalled_window`` 15m),
    ``refresh_seconds`` (how often statistics are rebuilt from the ledger)."""

    alpha: float = Field(default=0.05, gt=0.0, lt=1.0)
    margin: float = Field(default=0.01, ge=0.0, lt=1.0)
    detect_net_loss: float = Field(default=0.02, gt=0.0, lt=1.0)
    power: float = Field(default=0.8, gt=0.0, lt=1.0)
    windows: Annotated[tuple[str, ...], NoDecode] = ("15m", "1h", "24h")
    refresh_seconds: float = Field(default=2.0, gt=0)

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
        out["since_start"] = None
        return out


_ARMS = ("standard", "fly", "noise")


def _metrics_base(url: str) -> str:
    """A target's ``/metrics`` URL → the server's base URL (what replay arms are sent to)."""
    return url[: -len("/metrics")] if url.endswith("/metrics") else url.rstrip("/")


_FILE_DATA: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "specwatch_config_file", default=None
)


class _FileSource(PydanticBaseSettingsSource):
    """Values read from the ``--config`` file (lowest priority above defaults)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


class Settings(BaseSettings):
    """All of specwatch's configuration (frozen).

    ``targets``: the vLLM servers. ``windows``: rolling window names (durations such as ``1m``;
    ``since_start`` is always added). Groups: ``scrape``, ``server``, ``log``, ``alerting``
    (Alertmanager delivery), ``detect`` (detector thresholds and windows), ``shadow``
    (:class:`~specwatch.shadow.settings.ShadowSettings`; an arm given as ``{"target": NAME}``
    without ``url`` is sent to that target's base URL), ``ledger``, ``paired``.
    """

    model_config = SettingsConfigDict(
        env_prefix="SPECWATCH_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    targets: tuple[TargetSettings, ...] = ()
    windows: Annotated[tuple[str, ...], NoDecode] = ("1m", "5m", "15m")
    scrape: ScrapeSettings = ScrapeSettings()
    server: ServerSettings = ServerSettings()
    log: LogSettings = LogSettings()
    alerting: AlertingSettings = AlertingSettings()
    detect: DetectSettings = DetectSettings()
    shadow: ShadowSettings = ShadowSettings()
    ledger: LedgerSettings = LedgerSettings()
    paired: PairedSettings = PairedSettings()

    @model_validator(mode="before")
    @classmethod
    def _arm_urls(cls, data: Any) -> Any:
        """Fill ``shadow.<arm>.url`` from the named target when only ``target`` is given."""
        if not isinstance(data, dict) or not isinstance(data.get("shadow"), dict):
            return data
        urls: dict[str, str] = {}
        for t in data.get("targets") or ():
            if isinstance(t, TargetSettings):
                urls[t.name] = t.url
            elif isinstance(t, dict) and isinstance(t.get("name"), str):
                try:
                    urls[t["name"]] = TargetSettings._url(str(t.get("url", "")))
                except ValueError:
                    continue  # reported by the target's own validation
        shadow = dict(data["shadow"])
        for arm in _ARMS:
            ep = shadow.get(arm)
            if isinstance(ep, dict) and "url" not in ep and ep.get("target") is not None:
                if ep["target"] not in urls:
                    raise ValueError(f"shadow.{arm}.target: no target named {ep['target']!r}")
                shadow[arm] = {**ep, "url": _metrics_base(urls[ep["target"]])}
        return {**data, "shadow": shadow}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @field_validator("windows", mode="before")
    @classmethod
    def _split_windows(cls, v: Any) -> Any:
        return split_list(v)

    @field_validator("windows")
    @classmethod
    def _windows(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_windows(v)

    @model_validator(mode="after")
    def _unique_targets(self) -> Settings:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError("target names must be unique")
        for arm in _ARMS:
            ep = getattr(self.shadow, arm)
            if ep is not None and ep.target is not None and ep.target not in names:
                raise ValueError(f"shadow.{arm}.target: no target named {ep.target!r}")
        return self

    @property
    def window_seconds(self) -> dict[str, float]:
        """Window name → length in seconds (without ``since_start``)."""
        return {w: parse_duration(w) for w in self.windows}

    def interval_for(self, target: TargetSettings) -> float:
        """Scrape interval of ``target`` (its own, else the default)."""
        return target.scrape_interval_seconds or self.scrape.interval_seconds

    def timeout_for(self, target: TargetSettings) -> float:
        """Scrape timeout of ``target`` (its own, else the default)."""
        return target.scrape_timeout_seconds or self.scrape.timeout_seconds

    def redacted(self) -> dict[str, Any]:
        """The effective configuration as JSON-able data with secrets shown as ``**********``
        (target bearer tokens and shadow arm tokens)."""
        out = self.model_dump(mode="json")
        _redact_urls(out)
        for arm in _ARMS:
            ep = out["shadow"].get(arm)
            if isinstance(ep, dict) and ep.get("token") is not None:
                ep["token"] = "**********"
        return out


#: Keys whose values are URLs (or lists of URLs) shown only through :func:`redact_url`.
_URL_KEYS = frozenset({"url", "urls", "proxy_upstream", "generator_url"})


def _redact_urls(node: Any) -> None:
    """Replace, in place, URL passwords and query values under :data:`_URL_KEYS`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _URL_KEYS and isinstance(value, str):
                node[key] = redact_url(value)
            elif key in _URL_KEYS and isinstance(value, list):
                node[key] = [redact_url(v) if isinstance(v, str) else v for v in value]
            else:
                _redact_urls(value)
    elif isinstance(node, list):
        for item in node:
            _redact_urls(item)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML, TOML or JSON config file into a dict; :class:`ConfigError` if bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        line = _error_line(exc)
        raise ConfigError(f"config file {path}{f':{line}' if line else ''}: not valid") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    return data


def _error_line(exc: Exception) -> int | None:
    if isinstance(exc, json.JSONDecodeError):
        return exc.lineno
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    m = re.search(r"line (\d+)", str(exc))
    return int(m.group(1)) if m else None


def parse_target_spec(spec: str) -> dict[str, Any]:
    """Short form ``NAME=URL[,key=value...]`` → a target mapping.

    Example: ``fly=http://h:8001,max_num_seqs=128,method=eagle3,num_speculative_tokens=3``.
    Raises :class:`ConfigError`.
    """
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ConfigError(f"--target {spec!r}: expected NAME=URL[,key=value...]")
    url, *extras = rest.split(",")
    out: dict[str, Any] = {"name": name.strip(), "url": url.strip()}
    for item in extras:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--target {name}: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _loc(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc) or "settings"


def format_validation_error(exc: ValidationError) -> str:
    """One line naming the first failing field: ``config error: targets.0.url: must be ...``."""
    first = exc.errors()[0]
    msg = str(first["msg"]).removeprefix("Value error, ")
    return f"config error: {_loc(first['loc'])}: {msg}"


def load_settings(
    *, config_file: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Build :class:`Settings` from defaults < file < environment < ``overrides`` (CLI).

    Nested groups merge field by field; ``targets`` given at a higher level replace the lower.
    Raises :class:`ConfigError` with one line naming the field.
    """
    data = read_config_file(config_file) if config_file is not None else {}
    token = _FILE_DATA.set(data)
    try:
        return Settings(**dict(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except SettingsError as exc:  # an environment value that is not valid JSON
        m = re.search(r'field "([^"]+)"', str(exc))
        field = m.group(1) if m else "environment"
        raise ConfigError(
            f"config error: {field}: SPECWATCH_{field.upper()} is not valid JSON"
        ) from None
    finally:
        _FILE_DATA.reset(token)


def iter_targets(settings: Settings) -> Iterator[TargetSettings]:
    """Targets in configuration order."""
    yield from settings.targets
