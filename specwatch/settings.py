"""Settings: one frozen object built once (env ``SPECWATCH_``, nested ``__``, an optional YAML or
TOML file, CLI flags over both) and passed down.

Precedence, highest first: CLI flags (constructor keyword arguments) > environment
(``SPECWATCH_SCRAPE__INTERVAL_SECONDS=2``, ``SPECWATCH_TARGETS='[{"name": "fly", ...}]'``) >
the ``--config`` file > defaults. Other groups (shadow, alerting, detect) are added as one field
each on :class:`Settings`.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import re
import tomllib
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import parse_qsl, urlsplit

import yaml
from pydantic import (
    BaseModel,
    Field,
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

from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.core.config import check_windows, parse_duration, read_bounded, split_list
from specwatch.core.frozen import Frozen
from specwatch.core.listen import ListenLimits
from specwatch.core.logs import mask_secrets, redact_url
from specwatch.core.pod import PodSettings
from specwatch.core.wire import server_base
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings


class ConfigError(ValueError):
    """A bad configuration value; ``str()`` is one line naming the field, with credentials
    (URL passwords, tokens) masked as ``**********`` (:func:`~specwatch.core.logs.mask_secrets`)
    since it is printed to the terminal and to logs."""

    def __init__(self, message: str) -> None:
        super().__init__(mask_secrets(message))


class ServerSettings(Frozen):
    """Where specwatch serves ``/metrics``, ``/healthz``, ``/readyz``, ``/api/v1/snapshot``,
    and the limits of its listeners (main, mirror, proxy): a connection must send its request
    head within ``header_timeout_seconds``, may pause its body at most
    ``body_timeout_seconds`` and must send the whole body within ``body_deadline_seconds``
    (a body trickled a byte a second times out); at most ``max_connections`` are open at once,
    at most ``max_connections_per_client`` of them from one client address (more get 503);
    JSON bodies nest at most ``json_max_depth`` deep (deeper: 400 ``too_deep``); idle
    keep-alive connections close after ``keepalive_timeout_seconds``. On SIGTERM specwatch answers
    ``/readyz`` 503, stops accepting on the proxy and mirror ports, lets live proxied streams
    and replays in flight run until ``shutdown_timeout_seconds`` less a close reserve (10 %, at
    most 1 s), cuts or abandons (counted) what is left, saves its state and exits within
    ``shutdown_timeout_seconds``; ``pod`` says whether that fits the pod's grace period."""

    host: str = "0.0.0.0"
    """Address the main listener (`/metrics`, `/healthz`, `/readyz`, `/api/v1/snapshot`)
    binds; `127.0.0.1` keeps it inside the pod."""
    port: int = Field(default=9477, ge=0, le=65535)
    """Port of the main listener; 0 picks a free port."""
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    """A client must send its whole request head within this many seconds, or the connection
    is closed (all specwatch listeners)."""
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    """Longest pause, in seconds, allowed while a client sends a request body."""
    body_deadline_seconds: float = Field(default=120.0, gt=0)
    """A request body must arrive whole within this many seconds, however steadily it
    trickles."""
    max_connections: int = Field(default=1024, ge=1)
    """Most connections open at once per listener; more get 503 and are closed."""
    max_connections_per_client: int = Field(default=512, ge=1)
    """Most open connections from one client address; more are answered 503. Lower it if one
    client can crowd out the others."""
    json_max_depth: int = Field(default=64, ge=1, le=10000)
    """Deepest nesting accepted in a JSON request body; deeper bodies get 400 `too_deep`."""
    keepalive_timeout_seconds: float = Field(default=15.0, gt=0)
    """Idle keep-alive connections are closed after this many seconds."""
    shutdown_timeout_seconds: float = Field(default=10.0, gt=0)
    """On SIGTERM, specwatch drains streams and replays, saves its state and exits within
    this many seconds; keep it below the pod's grace period (see `pod`)."""

    @property
    def limits(self) -> ListenLimits:
        """The listener limits as a :class:`~specwatch.core.listen.ListenLimits`."""
        return ListenLimits(
            header_timeout_seconds=self.header_timeout_seconds,
            body_timeout_seconds=self.body_timeout_seconds,
            body_deadline_seconds=self.body_deadline_seconds,
            max_connections=self.max_connections,
            max_connections_per_client=self.max_connections_per_client,
            json_max_depth=self.json_max_depth,
            keepalive_timeout_seconds=self.keepalive_timeout_seconds,
        )


class LogSettings(Frozen):
    """Log level and format (``json`` one object per line, ``plain``, or ``auto``: plain on a
    terminal, JSON otherwise), for every process of
    ``specwatch run`` and the configuration warnings it logs at start."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severe log level written: `DEBUG`, `INFO`, `WARNING` or `ERROR` (any case)."""
    format: Literal["auto", "json", "plain"] = "auto"
    """`json`: one JSON object per line (for log collectors); `plain`: text for a terminal;
    `auto`: `plain` when stderr is a terminal, else `json`."""

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


_ARMS = ("standard", "fly", "noise", "baseline")


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
    without ``url`` is sent to that target's base URL), ``ledger``, ``paired``, ``pod`` (the
    pod's termination grace period and container order, :mod:`specwatch.core.pod`).
    """

    model_config = SettingsConfigDict(
        env_prefix="SPECWATCH_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    targets: tuple[TargetSettings, ...] = ()
    """The vLLM (or SGLang) servers to scrape, each a mapping with the keys listed under
    `targets[]`; in the environment a JSON list."""
    windows: Annotated[tuple[str, ...], NoDecode] = ("1m", "5m", "15m")
    """Rolling windows the observe gauges are computed over (durations such as `1m`, `5m`;
    `since_start` is always added)."""
    scrape: ScrapeSettings = ScrapeSettings()
    """How often and how much specwatch reads each target's `/metrics`, and how many series
    one target may make it keep."""
    server: ServerSettings = ServerSettings()
    """The main listener (metrics, health, snapshot) and the limits every specwatch listener
    applies to its clients."""
    log: LogSettings = LogSettings()
    """Log level and format of every specwatch process."""
    alerting: AlertingSettings = AlertingSettings()
    """Delivery of alerts to Alertmanager: where, with what credentials, how often, and the
    labels that say which pod sent them."""
    detect: DetectSettings = DetectSettings()
    """Thresholds and `for` durations of the built-in detectors. The defaults equal the
    constants of the shipped Prometheus rules (`deploy/`); change both together."""
    shadow: ShadowSettings = ShadowSettings()
    """Shadow replay: which requests are copied (sampling, quotas, load-aware pause), where
    they come from (mirror, proxy, canary) and the arms they are replayed to."""
    ledger: LedgerSettings = LedgerSettings()
    """The SQLite ledger of paired outcomes: where it lives and how much of it is kept."""
    paired: PairedSettings = PairedSettings()
    """The paired statistics over the ledger: test level, margin, windows and how often they
    are published."""
    pod: PodSettings = PodSettings()
    """The pod's termination settings as its manifest sets them, so specwatch can check at
    start that its shutdown fits the grace period."""

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
                shadow[arm] = {**ep, "url": server_base(urls[ep["target"]])}
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

    def secret_values(self) -> list[str]:
        """Every configured credential as plain text (target bearer tokens and URL passwords,
        shadow arm tokens and URL passwords, Alertmanager token, password and URL passwords, URL
        query values), for
        :class:`~specwatch.core.logs.SecretFilter`; never log or export the result."""
        out: list[str] = []
        urls: list[str] = [t.url for t in self.targets] + list(self.alerting.urls)
        for t in self.targets:
            if t.bearer_token is not None:
                out.append(t.bearer_token.get_secret_value())
        for secret in (self.alerting.bearer_token, self.alerting.basic_password):
            if secret is not None:
                out.append(secret.get_secret_value())
        for arm in _ARMS:
            ep = getattr(self.shadow, arm)
            if ep is not None:
                urls.append(ep.url)
                if ep.token:
                    out.append(ep.token)
        if self.shadow.proxy_upstream:
            urls.append(self.shadow.proxy_upstream)
        for url in urls:
            out.extend(_url_secrets(url))
        return [s for s in dict.fromkeys(out) if len(s) >= 4]

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


def _url_secrets(url: str) -> list[str]:
    """The password and query values of ``url`` (what :func:`redact_url` hides)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password] if password else []
    found += [v for _, v in parse_qsl(parts.query, keep_blank_values=False)]
    return found


#: Largest config file read: settings are kilobytes; a device or runaway file is refused.
MAX_CONFIG_BYTES = 1 << 20


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML, TOML or JSON config file into a dict; :class:`ConfigError` if bad."""
    try:
        text = read_bounded(path, MAX_CONFIG_BYTES).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        at = exc.object.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"config file {path}:{at}: not UTF-8 (byte {exc.object[exc.start]:#04x})"
        ) from None
    except ValueError as exc:  # past MAX_CONFIG_BYTES
        raise ConfigError(f"config file {path}: {exc}") from None
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        line = _error_line(exc)
        where = f"{path}:{line}" if line else str(path)
        raise ConfigError(f"config file {where}: {_error_reason(exc)}") from None
    except RecursionError:  # the YAML, TOML and JSON parsers recurse per nesting level
        raise ConfigError(f"config file {path}: nested too deep") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    return data


def _error_reason(exc: Exception) -> str:
    """What the parser found wrong, in its words, one line without the position."""
    if isinstance(exc, json.JSONDecodeError):
        reason = exc.msg
    elif isinstance(exc, yaml.MarkedYAMLError):
        reason = ": ".join(p for p in (exc.context, exc.problem) if p) or "not valid YAML"
    else:
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
    return " ".join(reason.split()) or "not valid"


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


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (list indexes skipped), or ``None``."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        found = _first_model(field.annotation)
        if found is None:
            return None
        model = found
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def close_field(loc: Sequence[int | str], root: type[BaseModel] | None = None) -> str | None:
    """The known setting closest to the unknown one at ``loc`` (``targt`` → ``targets``), by
    :func:`difflib.get_close_matches` among the fields of the model holding it; ``None`` when
    nothing is close."""
    if not loc or not isinstance(loc[-1], str):
        return None
    model = _model_at(root or Settings, loc[:-1])
    if model is None:
        return None
    names = list(model.model_fields)
    match = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return match[0] if match else None


#: Settings that existed once and are fixed inside specwatch now: path → what replaced them.
#: An old config file or environment that still sets one fails with this line, not with a
#: guess at a near name.
REMOVED_SETTINGS: Mapping[str, str] = {
    "alerting.lease_factor": "the endsAt lease is always 4 x max(resend, evaluation interval)",
    "alerting.retry_initial_backoff": "retries wait 0.5 s, doubling",
    "alerting.retry_max_backoff": "retries wait at most 8 s",
    "shadow.pause_poll_seconds": "a load pause is re-checked every 0.5 s",
    "shadow.proxy_own_thread": "the proxy runs on the sidecar's event loop (aiohttp)",
    "shadow.proxy_own_process": "the proxy runs in the sidecar's process (aiohttp)",
    "shadow.proxy_uvloop": "the proxy runs on the sidecar's event loop (aiohttp)",
}


def format_validation_error(exc: ValidationError) -> str:
    """One line naming the first failing field: ``config error: targets.0.url: must be ...``;
    an unknown field names the closest known one (``did you mean 'targets'?``), a removed one
    (:data:`REMOVED_SETTINGS`) says it is no longer a setting."""
    first = exc.errors()[0]
    msg = str(first["msg"]).removeprefix("Value error, ")
    removed = REMOVED_SETTINGS.get(_loc(first["loc"]))
    if first["type"] == "extra_forbidden" and removed is not None:
        msg = f"no longer a setting ({removed}); remove it"
    elif first["type"] == "extra_forbidden":
        near = close_field(first["loc"])
        msg = "unknown setting" + (f"; did you mean {near!r}?" if near else "")
    return f"config error: {_loc(first['loc'])}: {msg}"


def load_settings(
    *,
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    only: Collection[str] | None = None,
) -> Settings:
    """Build :class:`Settings` from defaults < file < environment < ``overrides`` (CLI).

    Nested groups merge field by field; ``targets`` given at a higher level replace the lower.
    ``only``: read just these top-level groups of the file (a command that uses a few groups
    ignores the others, e.g. ``replay`` ignores ``shadow``). Raises :class:`ConfigError` with
    one line naming the field.
    """
    data = read_config_file(config_file) if config_file is not None else {}
    if only is not None:
        data = {k: v for k, v in data.items() if k in only}
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
    except RecursionError:  # pydantic-settings' JSON parse of an environment value
        raise ConfigError(
            "config error: environment: a SPECWATCH_* value is JSON nested too deep to parse"
        ) from None
    finally:
        _FILE_DATA.reset(token)


def iter_targets(settings: Settings) -> Iterator[TargetSettings]:
    """Targets in configuration order."""
    yield from settings.targets
