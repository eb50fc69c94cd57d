"""Helpers for the end-to-end shadow tests: simulators, the sidecar app on port 0, and the
statistics worked out independently from the ledger rows (scipy)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import binomtest

from specwatch.server.app import build_app
from specwatch.server.wiring import ShadowPlug
from specwatch.settings import Settings
from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.quiz import write_canary_jsonl


def write_canary(path: Path, *, variants: int, temperature: float) -> int:
    """The simulator's 240 canary items, ``variants`` times (``max_tokens`` 64 + v makes each
    variant a different request, hence a different replay seed). Returns the item count."""
    return write_canary_jsonl(path, variants=variants, temperature=temperature)


@asynccontextmanager
async def simulators(
    fly_threshold: float = 0.3,
    *,
    noise: bool = False,
    standard: SimConfig | None = None,
    spec_metrics: str = "summary",
) -> AsyncIterator[dict[str, SimulatorHandle]]:
    """In-process standard and FLy simulators (time_scale 0), and a second standard one as the
    noise arm when ``noise``; ``standard`` replaces the standard simulator's config;
    ``spec_metrics`` is the FLy simulator's ``--per-request-spec-decode-metrics`` (as the shipped
    deployment runs vLLM) and the standard one's unless ``standard`` is given."""
    std = standard or SimConfig(
        role=Role.STANDARD, time_scale=0.0, per_request_spec_decode_metrics=spec_metrics
    )
    fly = SimConfig(
        role=Role.FLY,
        time_scale=0.0,
        fly_entropy_threshold=fly_threshold,
        per_request_spec_decode_metrics=spec_metrics,
    )
    sims = {"standard": await start_simulator(std), "fly": await start_simulator(fly)}
    if noise:
        sims["noise"] = await start_simulator(SimConfig(role=Role.STANDARD, time_scale=0.0))
    try:
        yield sims
    finally:
        for s in sims.values():
            await s.stop()


def settings_for(
    sims: Mapping[str, SimulatorHandle],
    ledger: Path,
    *,
    scrape_interval: float = 1.0,
    **shadow: Any,
) -> Settings:
    """Settings scraping the simulators every ``scrape_interval`` s, arms by target name."""
    targets = [
        {
            "name": name,
            "url": s.url,
            "role": "standard" if name == "noise" else name,
            "max_num_seqs": 256,
        }
        for name, s in sims.items()
    ]
    sh: dict[str, Any] = {
        "enabled": True,
        "sample_probability": 1.0,
        "max_shadow_rps": 2000.0,
        "max_in_flight": 16,
        "queue_size": 10_000,
        "canary_rate_per_second": 400.0,
        "canary_loop": False,
        "standard": {"target": "standard"},
        "fly": {"target": "fly"},
        "mirror_listen_host": "127.0.0.1",
        "mirror_listen_port": 0,
    }
    if "noise" in sims:
        sh["noise"] = {"target": "noise"}
        sh["noise_kind"] = "standard"
    sh.update(shadow)
    return Settings.model_validate(
        {
            "targets": targets,
            "scrape": {"interval_seconds": scrape_interval, "timeout_seconds": 2.0},
            "shadow": sh,
            "ledger": {"path": str(ledger)},
            "paired": {"windows": ["1h"], "refresh_seconds": 0.2},
        }
    )


@dataclass
class Sidecar:
    url: str
    component: ShadowComponent
    client: aiohttp.ClientSession

    @property
    def mirror_url(self) -> str:
        """The mirror listener's base URL (its own port, not :attr:`url`'s)."""
        return f"http://127.0.0.1:{self.component.mirror_port}"

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """``/metrics`` parsed with prometheus_client's parser: (sample name, labels) → value."""
        async with self.client.get(self.url + "/metrics") as r:
            text = await r.text()
        out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out


@asynccontextmanager
async def sidecar(settings: Settings) -> AsyncIterator[Sidecar]:
    """The specwatch app (scraping on) with the shadow component, served on port 0; a mirror
    listener left at its default address moves to 127.0.0.1 port 0, so tests never meet on
    the fixed default port."""
    sh = settings.shadow
    if sh.mirror_listen_port == type(sh).model_fields["mirror_listen_port"].default:
        moved = sh.model_copy(update={"mirror_listen_host": "127.0.0.1", "mirror_listen_port": 0})
        settings = settings.model_copy(update={"shadow": moved})
    plug = ShadowPlug(settings)
    comp = plug.component
    app = build_app(settings, components=[plug])
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as client:
            yield Sidecar(f"http://127.0.0.1:{server.port}", comp, client)
    finally:
        await server.close()


async def until(cond: Callable[[], bool], limit: float = 60.0) -> None:
    """Poll ``cond`` every 20 ms (raises TimeoutError after ``limit`` s)."""

    async def wait() -> None:
        while not cond():  # noqa: ASYNC110 (polls plain counters)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(wait(), timeout=limit)


def canary_done(comp: ShadowComponent, items: int) -> bool:
    """Every canary item offered and every admitted one replayed and compared."""
    pipe = comp.pipeline
    if pipe is None or pipe.canary is None:
        return False
    m = pipe.metrics()
    replayed = sum(comp.statistics.counters.by_status().values())
    return pipe.canary.passes == 1 and m.queue_depth == 0 and replayed == m.admitted


async def read_rows(path: Path) -> list[LedgerRow]:
    """Every ledger row (a separate connection: what an independent reader sees)."""
    async with Ledger(path) as led:
        return await led.query()


@dataclass(frozen=True)
class Expected:
    n: int
    lost: int
    gained: int
    p_two_sided: float
    p_loss: float


def expected(rows: Iterable[LedgerRow], category: str | None = None) -> Expected:
    """Lost/gained over labelled paired rows and the exact McNemar p from scipy's binomtest."""
    n = lost = gained = 0
    for r in rows:
        if category is not None and r.category != category:
            continue
        if r.status != "paired" or r.standard_correct is None or r.fly_correct is None:
            continue
        n += 1
        lost += int(r.standard_correct and not r.fly_correct)
        gained += int(r.fly_correct and not r.standard_correct)
    d = lost + gained
    two = binomtest(lost, d, 0.5).pvalue if d else 1.0
    loss = binomtest(lost, d, 0.5, alternative="greater").pvalue if d else 1.0
    return Expected(n, lost, gained, float(two), float(loss))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
