"""An async load generator for OpenAI-compatible servers (the simulator or real vLLM).

Requests are drawn from categories: the canary categories (their items carry gold answers) and
``chat`` (free prompts). Closed loop (``concurrency`` requests in flight) or open loop
(``rate`` requests per second, Poisson arrivals, capped at ``concurrency`` in flight).
With ``fanout=True`` each request is sent to every target with the same seed (a paired arm
comparison); otherwise targets are used round-robin.

With ``mirror_url`` set, a share ``mirror_fraction`` of the requests is also copied to that
server the way Envoy's request mirroring does it (Istio ``mirror`` / Gateway API
``RequestMirror``): fire-and-forget (never awaited by the live request, at most
``mirror_max_in_flight`` copies in flight, further copies dropped and counted), with ``-shadow``
appended to the Host's name, and the request's category in ``X-Specwatch-Category``.

Usage::

    gen = LoadGenerator(["http://127.0.0.1:8001"], LoadConfig(concurrency=16, duration_s=10))
    stats = await gen.run()          # or: task = asyncio.create_task(gen.run()); gen.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.wire import CATEGORY_HEADER, SHADOW_HOST_SUFFIX
from specwatch.simulate.quiz import builtin_items, is_correct

_CHAT_PROMPTS = (
    "Summarise the plot of a short story about a lighthouse keeper.",
    "Write a haiku about autumn rain in the city.",
    "Explain what a hash table is to a new programmer.",
    "List three tips for writing clear commit messages.",
    "Describe the water cycle in two sentences.",
    "Suggest a name for a small bakery by the sea.",
)


#: The header a gateway (or this generator) sets on a mirrored copy to name its category.
MIRROR_CATEGORY_HEADER = CATEGORY_HEADER


def shadow_host(url: str) -> str:
    """The Host Envoy gives a mirrored copy of a request to ``url``: ``-shadow`` appended to the
    host name, the port kept (``http://10.0.0.5:8000`` → ``10.0.0.5-shadow:8000``)."""
    u = URL(url)
    name = f"{u.host or 'localhost'}{SHADOW_HOST_SUFFIX}"
    return f"{name}:{u.port}" if u.port is not None and not u.is_default_port() else name


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """Load shape.

    ``categories``: weight per category (``chat`` or a canary category); ``rate``: requests/s
    (None = closed loop); ``duration_s``/``max_requests``: stop conditions (either may be None);
    ``chat``: use ``/v1/chat/completions`` instead of ``/v1/completions``.
    Mirroring: ``mirror_url`` (base URL of the mirror receiver, e.g. specwatch's sidecar; None =
    off), ``mirror_fraction`` of requests copied (decided by a random source of its own, so the
    live sequence does not change), ``mirror_host`` (Host header; None: the last target's host
    with ``-shadow`` appended to its name, as Envoy does), ``mirror_max_in_flight`` copies in
    flight, ``mirror_timeout_s`` per copy.
    """

    concurrency: int = 8
    rate: float | None = None
    duration_s: float | None = 10.0
    max_requests: int | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    stream: bool = False
    chat: bool = False
    fanout: bool = False
    ignore_eos: bool = False
    model: str | None = None
    timeout_s: float = 60.0
    seed: int = 0
    mirror_url: str | None = None
    mirror_fraction: float = 1.0
    mirror_host: str | None = None
    mirror_max_in_flight: int = 64
    mirror_timeout_s: float = 5.0
    categories: dict[str, float] = field(
        default_factory=lambda: {
            "chat": 1.0,
            "arithmetic": 1.0,
            "multiplication": 1.0,
            "counting": 1.0,
            "conversion": 1.0,
        }
    )


@dataclass
class LoadStats:
    """Counts so far. ``errors`` by reason (``http_<status>``, ``timeout``, ``connect``);
    ``correct``/``graded`` count canary answers per target URL. Mirror copies: ``mirrored``
    (answered 2xx), ``mirror_failed`` (other status, timeout, connection error),
    ``mirror_dropped`` (not sent: ``mirror_max_in_flight`` copies already in flight)."""

    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0
    by_category: dict[str, int] = field(default_factory=dict)
    graded: dict[str, int] = field(default_factory=dict)
    correct: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    started: float = 0.0
    elapsed_s: float = 0.0
    mirrored: int = 0
    mirror_failed: int = 0
    mirror_dropped: int = 0

    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Job:
    """One request to send: prompt, category and gold (canary) or None."""

    prompt: str
    category: str
    gold: str | None
    seed: int


class LoadGenerator:
    """Sends generated traffic to ``targets`` (base URLs) until a stop condition or :meth:`stop`.

    ``session`` may be passed in (not closed here); ``mono_clock`` is monotonic seconds;
    ``on_result(url, job, body_or_None)`` is called after every response.
    """

    def __init__(
        self,
        targets: Sequence[str],
        config: LoadConfig | None = None,
        *,
        session: aiohttp.ClientSession | None = None,
        mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
        on_result: Callable[[str, Job, dict[str, Any] | None], None] | None = None,
    ) -> None:
        if not targets:
            raise ValueError("at least one target URL is needed")
        self.targets = [t.rstrip("/") for t in targets]
        self.config = config or LoadConfig()
        self.session = session
        self.mono_clock = mono_clock
        self.on_result = on_result
        self.stats = LoadStats()
        self._rng = random.Random(self.config.seed)
        self._stop = asyncio.Event()
        self._items: dict[str, list[dict[str, Any]]] = {}
        for item in builtin_items():
            self._items.setdefault(str(item["category"]), []).append(item)
        self._rr = 0
        self._launched = 0
        self._mirror_rng = random.Random(f"mirror:{self.config.seed}")
        self._mirror_session: aiohttp.ClientSession | None = None
        self._mirror_tasks: set[asyncio.Task[None]] = set()
        self.mirror_host = self.config.mirror_host or shadow_host(self.targets[-1])

    def stop(self) -> None:
        """Ask :meth:`run` to finish (requests in flight complete)."""
        self._stop.set()

    def next_job(self) -> Job:
        """Draw the next request (deterministic for a given config seed)."""
        cats = [c for c in self.config.categories if c == "chat" or c in self._items]
        weights = [self.config.categories[c] for c in cats]
        cat = self._rng.choices(cats, weights)[0]
        seed = self._rng.getrandbits(31)
        if cat == "chat":
            return Job(self._rng.choice(_CHAT_PROMPTS), cat, None, seed)
        item = self._rng.choice(self._items[cat])
        return Job(str(item["prompt"]), cat, str(item["gold"]), seed)

    def _body(self, job: Job) -> tuple[str, dict[str, Any]]:
        c = self.config
        body: dict[str, Any] = {
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "seed": job.seed,
            "stream": c.stream,
        }
        if c.model is not None:
            body["model"] = c.model
        if c.ignore_eos:
            body["ignore_eos"] = True
        if c.stream:
            body["stream_options"] = {"include_usage": True}
        if c.chat:
            body["messages"] = [{"role": "user", "content": job.prompt}]
            return "/v1/chat/completions", body
        body["prompt"] = job.prompt
        return "/v1/completions", body

    async def _send(self, session: aiohttp.ClientSession, url: str, job: Job) -> None:
        path, body = self._body(job)
        t0 = self.mono_clock()
        st = self.stats
        st.sent += 1
        st.by_category[job.category] = st.by_category.get(job.category, 0) + 1
        result: dict[str, Any] | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
            async with session.post(url + path, json=body, timeout=timeout) as resp:
                if resp.status != 200:
                    key = f"http_{resp.status}"
                    st.errors[key] = st.errors.get(key, 0) + 1
                    await resp.read()
                elif self.config.stream:
                    result = await _read_sse(resp, chat=self.config.chat)
                else:
                    raw = await resp.json()
                    choice = raw["choices"][0]
                    text = choice["message"]["content"] if self.config.chat else choice["text"]
                    result = {"text": text, "usage": raw.get("usage") or {}}
        except TimeoutError:
            st.errors["timeout"] = st.errors.get("timeout", 0) + 1
        except aiohttp.ClientError:
            st.errors["connect"] = st.errors.get("connect", 0) + 1
        if result is not None:
            st.ok += 1
            st.latencies_s.append(self.mono_clock() - t0)
            st.completion_tokens += int(result["usage"].get("completion_tokens", 0) or 0)
            if job.gold is not None:
                st.graded[url] = st.graded.get(url, 0) + 1
                if is_correct(str(result["text"]), job.gold):
                    st.correct[url] = st.correct.get(url, 0) + 1
        if self.on_result is not None:
            self.on_result(url, job, result)

    def _maybe_mirror(self, job: Job) -> None:
        """Copy ``job`` to the mirror receiver (fire-and-forget) when drawn."""
        c = self.config
        session = self._mirror_session
        if c.mirror_url is None or session is None:
            return
        if self._mirror_rng.random() >= c.mirror_fraction:
            return
        if len(self._mirror_tasks) >= c.mirror_max_in_flight:
            self.stats.mirror_dropped += 1
            return
        t = asyncio.create_task(self._mirror(session, c.mirror_url.rstrip("/"), job))
        self._mirror_tasks.add(t)
        t.add_done_callback(self._mirror_tasks.discard)

    async def _mirror(self, session: aiohttp.ClientSession, base: str, job: Job) -> None:
        path, body = self._body(job)
        headers = {"Host": self.mirror_host, MIRROR_CATEGORY_HEADER: job.category}
        st = self.stats
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.mirror_timeout_s)
            async with session.post(base + path, json=body, headers=headers, timeout=timeout) as r:
                await r.read()
                ok = 200 <= r.status < 300
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        if ok:
            st.mirrored += 1
        else:
            st.mirror_failed += 1

    async def _one(self, session: aiohttp.ClientSession) -> None:
        job = self.next_job()
        self._maybe_mirror(job)
        if self.config.fanout:
            await asyncio.gather(*(self._send(session, u, job) for u in self.targets))
        else:
            url = self.targets[self._rr % len(self.targets)]
            self._rr += 1
            await self._send(session, url, job)

    def _done(self, started: float) -> bool:
        c = self.config
        if self._stop.is_set():
            return True
        if c.duration_s is not None and self.mono_clock() - started >= c.duration_s:
            return True
        # jobs launched, not requests sent: a task created but not yet run has sent nothing
        return c.max_requests is not None and self._launched >= c.max_requests

    async def run(self) -> LoadStats:
        """Generate load until a stop condition; returns the final :class:`LoadStats`."""
        own = self.session is None
        session = self.session or aiohttp.ClientSession()
        if self.config.mirror_url is not None:  # its own connection pool: never delays live
            self._mirror_session = aiohttp.ClientSession()
        started = self.mono_clock()
        self.stats.started = started
        sem = asyncio.Semaphore(self.config.concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def guarded() -> None:
            try:
                await self._one(session)
            finally:
                sem.release()

        try:
            while not self._done(started):
                await sem.acquire()
                if self._done(started):
                    sem.release()
                    break
                t = asyncio.create_task(guarded())
                self._launched += 1
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                if self.config.rate is not None:
                    delay = self._rng.expovariate(self.config.rate)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            if self._mirror_tasks:  # copies are answered at once; give them a moment
                await asyncio.wait(set(self._mirror_tasks), timeout=self.config.mirror_timeout_s)
                for mt in self._mirror_tasks:
                    mt.cancel()
                await asyncio.gather(*self._mirror_tasks, return_exceptions=True)
            if self._mirror_session is not None:
                await self._mirror_session.close()
                self._mirror_session = None
            if own:
                await session.close()
        self.stats.elapsed_s = self.mono_clock() - started
        return self.stats


async def _read_sse(resp: aiohttp.ClientResponse, *, chat: bool) -> dict[str, Any]:
    """Read an OpenAI SSE stream: concatenated text and the usage chunk."""
    text: list[str] = []
    usage: dict[str, Any] = {}
    buf = b""
    async for data in resp.content.iter_any():
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return {"text": "".join(text), "usage": usage}
                obj = json.loads(payload)
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                    if piece:
                        text.append(piece)
    return {"text": "".join(text), "usage": usage}
