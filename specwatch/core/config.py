"""Building blocks shared by every settings group: durations, window names and the two fixed
names (``SINCE_START``, ``OVERALL``), list splitting.

Plain Python only, so the observe chain can read the window names without loading pydantic;
the frozen pydantic base of the settings groups is :class:`specwatch.core.frozen.Frozen`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"90"``, ``"30s"``, ``"1m"``, ``"1.5h"``, ``"500ms"`` → seconds. Raises ``ValueError``."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 1m, 1h)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the file (or pipe) at ``path``, reading at most ``limit`` + 1 of them, so a
    device such as ``/dev/zero`` or a runaway file cannot fill the memory. Raises ``OSError``
    as :func:`open` does, or ``ValueError`` ("larger than ``limit`` bytes") past ``limit``."""
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data


#: Default lower bounds of the running-request bands flips are broken down by
#: (``PairedSettings.load_bands``), here so the report reads them without loading pydantic.
DEFAULT_LOAD_BANDS: tuple[int, ...] = (0, 8, 32)

#: Default number of request categories that keep their own series
#: (``ShadowSettings.max_categories``; with ``other`` they are the K category tests of the
#: quality page, whose bound grows with K: see ``shadow/stats/policy.py``).
DEFAULT_MAX_CATEGORIES = 10

#: Default level and non-inferiority margin (a fraction) of the paired tests:
#: ``PairedSettings`` and every command's ``--alpha`` / ``--margin``.
DEFAULT_ALPHA = 0.05
DEFAULT_MARGIN = 0.01

#: Default mean run length of the quality change detector to a false alarm, in labelled pairs
#: (``PairedSettings.change_arl``): about 29 days at the default canary rate of 0.2 pairs/s.
DEFAULT_CHANGE_ARL = 500_000.0

#: Labels that tell HA Prometheus replicas apart (prometheus-operator's ``prometheus_replica``,
#: Thanos' and Cortex's ``replica``): a series that differs from another only in these is the same
#: sidecar's series read through two replicas (``specwatch fleet`` counts it once).
DEFAULT_REPLICA_LABELS: tuple[str, ...] = ("replica", "prometheus_replica")

#: The window that spans everything since the process (or the ledger) started; always present,
#: never listed.
SINCE_START = "since_start"

#: The category name under which every category is summed (shadow statistics, exported as
#: ``category="_all"``).
OVERALL = "_all"

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def split_list(v: Any) -> Any:
    """A list given as one string: JSON (``["1m","5m"]``) or comma-separated (``1m,5m``).
    Raises ValueError for JSON that does not parse or nests too deep for the parser."""
    if isinstance(v, str):
        try:
            v = json.loads(v) if v.strip().startswith("[") else v.split(",")
        except RecursionError:
            raise ValueError("not valid JSON: nested too deep") from None
    return v


def check_windows(v: tuple[str, ...]) -> tuple[str, ...]:
    """Window names: positive durations, unique, ``since_start`` not listed (always present)."""
    names = tuple(w.strip() for w in v)
    for w in names:
        if w == SINCE_START:
            raise ValueError(f"{SINCE_START} is always present; do not list it")
        if parse_duration(w) <= 0:
            raise ValueError(f"window {w!r} must be longer than 0 s")
    if len(set(names)) != len(names):
        raise ValueError("window names must be unique")
    return names
