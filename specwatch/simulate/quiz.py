"""Built-in canary items whose correctness depends on the generated tokens.

Each item is a question with a numeric gold answer. The synthetic target model "knows" the items:
for a canary prompt, after its reasoning tokens it writes ``answer: `` and then digits; at each
answer digit the gold digit has target probability ``p_correct ** (1/len(gold))``, so at
temperature 1 the answer read from the text is right with probability ``p_correct`` (calibrated
per item). A few items are *hard* (the target's most likely digit is a distractor, so even greedy
decoding is wrong). The draft model pulls some items towards the distractor digit
(``draft_confusion``); FLy's waivers can then accept a wrong digit that standard decoding rejects,
so FLy-vs-standard flips are real and per item.

Public API: :func:`builtin_items` (dicts with ``id, prompt, gold, category, checker``, plus
``p_correct`` and ``draft_confusion``), :func:`extract_answer`, :func:`is_correct`,
:func:`params_for_prompt` (used by the engine).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.core.canary_file import write_items
from specwatch.simulate.lm import MAX_ANSWER_DIGITS, SeqParams

#: Checker spec (``exact|regex:<pattern>|json:<path>|math``, as in ``specwatch.shadow.values``).
ANSWER_PATTERN = r"answer:\s*(\d+)"
CHECKER = "regex:" + ANSWER_PATTERN
_ANSWER_RE = re.compile(ANSWER_PATTERN)
_SUFFIX = " Think briefly, then finish with 'answer: <number>'."
_LETTER_WORDS = [
    "apple",
    "banana",
    "cherry",
    "dragon",
    "eleven",
    "forest",
    "guitar",
    "harbor",
    "island",
    "jungle",
    "kettle",
    "lantern",
    "meadow",
    "notebook",
    "orange",
    "pepper",
    "quartz",
    "rabbit",
    "saddle",
    "teacup",
    "umbrella",
    "violin",
    "walnut",
    "xylophone",
    "yogurt",
    "zebra",
    "anchor",
    "blossom",
    "candle",
    "dolphin",
    "engine",
    "falcon",
    "glacier",
    "hammock",
    "igloo",
    "jacket",
    "kingdom",
    "lobster",
    "magnet",
    "nectar",
    "oyster",
    "pillow",
    "quiver",
    "rocket",
    "sparrow",
    "thunder",
    "unicorn",
    "volcano",
    "whistle",
    "yellow",
    "zipper",
    "acorn",
    "bridge",
    "castle",
    "desert",
    "ember",
    "feather",
    "giraffe",
    "horizon",
    "lemonade",
]


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class QuizItem:
    """One of the synthetic LM's known questions (written out as a canary line by :meth:`as_dict`):
    ``p_correct`` is the calibrated probability that a temperature-1 sample
    (standard or baseline) answers right; ``draft_confusion`` the draft's pull to a wrong digit."""

    id: str
    prompt: str
    gold: str
    category: str
    p_correct: float
    draft_confusion: float
    hard: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "gold": self.gold,
            "category": self.category,
            "checker": CHECKER,
            "p_correct": self.p_correct,
            "draft_confusion": self.draft_confusion,
        }


def _calibrate(item_id: str) -> tuple[float, float, bool]:
    h = _h("calib:" + item_id)
    u1 = (h & 0xFFFF) / 65536.0
    u2 = ((h >> 16) & 0xFFFF) / 65536.0
    u3 = ((h >> 32) & 0xFFFF) / 65536.0
    hard = u1 < 0.12
    # hard items: per-digit gold mass 0.25-0.45 (a distractor is the argmax); easy: p 0.6-0.98
    p = 0.25 + 0.2 * u2 if hard else 0.6 + 0.38 * u2
    confusion = 0.0 if u3 < 0.45 else 0.3 + 0.6 * (u3 - 0.45) / 0.55
    return p, round(confusion, 4), hard


@functools.cache
def _items() -> tuple[QuizItem, ...]:
    out: list[QuizItem] = []

    def add(category: str, idx: int, question: str, gold: int) -> None:
        item_id = f"{category}-{idx:03d}"
        p, conf, hard = _calibrate(item_id)
        p = round(p ** len(str(gold)) if hard else p, 6)
        out.append(QuizItem(item_id, question + _SUFFIX, str(gold), category, p, conf, hard))

    for i in range(60):
        a, b = 11 + (i * 37) % 480, 7 + (i * 53) % 490
        add("arithmetic", i, f"What is {a} + {b}?", a + b)
    for i in range(60):
        a, b = 2 + (i * 7) % 29, 3 + (i * 11) % 27
        add("multiplication", i, f"What is {a} times {b}?", a * b)
    for i, word in enumerate(_LETTER_WORDS[:60]):
        add("counting", i, f"How many letters are in the word '{word}'?", len(word))
    for i in range(60):
        hours = 2 + i
        if i % 2 == 0:
            add("conversion", i, f"How many minutes are in {hours} hours?", 60 * hours)
        else:
            add("conversion", i, f"How many hours are in {hours} days?", 24 * hours)
    return tuple(out)


def builtin_items() -> list[dict[str, Any]]:
    """The built-in canary set (240 items in 4 categories), as dicts
    ``{id, prompt, gold, category, checker, p_correct, draft_confusion}``."""
    return [item.as_dict() for item in _items()]


@functools.cache
def _by_prompt() -> dict[str, QuizItem]:
    return {item.prompt: item for item in _items()}


def item_for_prompt(prompt: str) -> QuizItem | None:
    """The canary item whose prompt is exactly ``prompt`` (stripped), or None."""
    return _by_prompt().get(prompt.strip())


def extract_answer(text: str) -> str | None:
    """The first ``answer: <digits>`` in ``text``, or None."""
    m = _ANSWER_RE.search(text)
    return None if m is None else m.group(1)


def is_correct(text: str, gold: str) -> bool:
    """True when the answer read from ``text`` equals ``gold``."""
    return extract_answer(text) == gold


def params_for_prompt(prompt: str, *, answer_mass: float = 0.85) -> SeqParams:
    """Synthetic-model parameters for a prompt: calibrated for canary items, hashed otherwise."""
    key = prompt.strip()
    salt = _h("prompt:" + key)
    item = _by_prompt().get(key)
    if item is not None:
        gold = item.gold[:MAX_ANSWER_DIGITS]
        gm = item.p_correct ** (1.0 / len(gold))
        dm = min(0.98 - gm, gm + 0.2) if item.hard else (1.0 - gm) * 0.6
        confusion = item.draft_confusion
    else:
        gold = str(salt % 1000)
        gm = answer_mass
        dm = (1.0 - gm) * 0.5
        confusion = 0.3 * ((salt >> 20) % 4) / 3.0
    return SeqParams(
        salt=salt,
        gold=gold,
        gold_mass=gm,
        distractor_mass=max(dm, 0.0),
        draft_confusion=confusion,
        reason_len=6 + (salt >> 8) % 25,
        tail_len=6 + (salt >> 16) % 11,
    )


def canary_rows(
    *, variants: int, temperature: float, seed: int | None = None
) -> Iterator[dict[str, Any]]:
    """The 240 built-in items as canary JSONL rows (``id, prompt, gold, category, checker,
    max_tokens, temperature``), ``variants`` times over.

    Variant ``v`` asks for ``max_tokens`` 64 + v, so every row is a different request and gets
    its own replay seed (from the request hash): a fresh sample per pair at temperature > 0,
    not the same answer again. With ``seed`` each pass is shuffled so categories mix.
    """
    rng = random.Random(seed) if seed is not None else None
    items = builtin_items()
    for v in range(variants):
        order = list(items)
        if rng is not None:
            rng.shuffle(order)
        for it in order:
            yield {
                "id": f"{it['id']}-v{v}",
                "prompt": it["prompt"],
                "gold": it["gold"],
                "category": it["category"],
                "checker": it["checker"],
                "max_tokens": 64 + v,
                "temperature": temperature,
            }


def write_canary_jsonl(
    path: Path,
    *,
    variants: int,
    temperature: float,
    seed: int | None = None,
    limit: int | None = None,
) -> int:
    """Write :func:`canary_rows` (at most ``limit`` rows) to ``path`` in the canary JSONL format
    (:mod:`specwatch.core.canary_file`); returns the row count. Blocking (file write); raises
    ``OSError``."""
    rows = canary_rows(variants=variants, temperature=temperature, seed=seed)
    return write_items(path, rows, limit=limit)
