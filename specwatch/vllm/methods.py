"""Speculative-decoding methods: which vLLM accepts, their per-request slots, version regimes.

Per-method extra batch slots (S) and KV lookahead slots (L), the static reservation of
v0.20-v0.25, and which token-budget regime a vLLM version uses. Shared by the sidecar and
the simulator. Sources (vLLM v0.33.0): ``vllm/config/speculative.py:2058-2096`` (S),
``vllm/config/vllm.py:626-652`` (L), ``vllm/config/vllm.py:_set_max_num_scheduled_tokens``
(static reservation). The budget limits built from these live in :mod:`specwatch.vllm.budget`.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

#: Methods vLLM V1 accepts (``SpeculativeMethod``); ``*_mtp`` model types normalise to ``mtp``.
SPEC_METHODS: frozenset[str] = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "suffix",
        "draft_model",
        "custom_class",
        "eagle",
        "eagle3",
        "mtp",
        "dflash",
        "dspark",
    }
)

#: Methods whose drafter runs a separate query pass and get the v0.33 admission cap B // L.
ADMISSION_CAPPED_METHODS: frozenset[str] = frozenset({"dflash", "dspark"})

#: Methods that force ``parallel_drafting`` on.
FORCED_PARALLEL_METHODS: frozenset[str] = frozenset({"dflash", "dspark"})


class BudgetRegime(enum.StrEnum):
    """Which scheduler token accounting a vLLM version uses."""

    #: v0.33+: per-request input budget, v0.33 S table, dflash/dspark admission cap.
    V0_33 = "0.33"
    #: v0.26-v0.32: per-request input budget, older S (dflash K, dspark K-1), no admission cap.
    V0_32 = "0.32"
    #: v0.20-v0.25: static reservation T = B - S_old * N.
    STATIC = "static"


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)")


def regime_for_version(version: str | None) -> BudgetRegime:
    """Map a vLLM version string (``"0.33.0"``, ``"v0.25.1"``) to its budget regime.

    ``None`` means "current" (v0.33 rules). Raises ``ValueError`` on an unreadable string.
    """
    if version is None:
        return BudgetRegime.V0_33
    if version in {r.value for r in BudgetRegime}:
        return BudgetRegime(version)
    m = _VERSION_RE.match(version.strip())
    if m is None:
        raise ValueError(f"unreadable vLLM version {version!r}")
    major, minor = int(m.group(1)), int(m.group(2))
    if major > 0 or minor >= 33:
        return BudgetRegime.V0_33
    if minor >= 26:
        return BudgetRegime.V0_32
    return BudgetRegime.STATIC


@dataclass(frozen=True, slots=True)
class Slots:
    """Per-request slot costs of one method.

    ``extra_batch_slots`` is S (rows the drafter adds per request inside
    ``max_num_batched_tokens``);
    ``lookahead_slots`` is L (KV slots reserved past the target's query).
    """

    extra_batch_slots: int
    lookahead_slots: int


def method_slots(
    method: str,
    k: int,
    *,
    parallel_drafting: bool = False,
    regime: BudgetRegime = BudgetRegime.V0_33,
    dspark_sample_from_anchor: bool = False,
) -> Slots:
    """S and L for ``method`` with K = ``k`` draft tokens (table in vllm-metrics.md §9).

    dspark defaults to fill-in sampling (``sample_from_anchor=False``: L = K + 1).
    Raises ``ValueError`` for an unknown method or K < 1.
    """
    if method not in SPEC_METHODS:
        raise ValueError(f"unknown speculative method {method!r}")
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    parallel = parallel_drafting or method in FORCED_PARALLEL_METHODS
    if method in {"eagle", "eagle3"}:
        return Slots(k - 1 if parallel else 0, k)
    if method == "mtp":
        return Slots(0, k)
    if method in {"ngram", "ngram_gpu", "suffix", "custom_class"}:
        return Slots(0, 0)
    if method == "draft_model":
        return Slots(k if parallel else 1, k)
    if method == "dflash":
        return Slots(k if regime is not BudgetRegime.V0_33 else 0, k + 1)
    # dspark
    lookahead = k if dspark_sample_from_anchor else k + 1
    return Slots(k - 1 if regime is not BudgetRegime.V0_33 else 0, lookahead)


def static_reservation_slots(method: str, k: int, *, parallel_drafting: bool = False) -> int:
    """S_old of the v0.20-v0.25 static reservation: (K-1 if parallel) + (1 if draft_model).

    dflash reserved K-1 (PR #51256 later made it K); dspark is parallel, so K-1.
    """
    parallel = parallel_drafting or method in FORCED_PARALLEL_METHODS
    return (k - 1 if parallel else 0) + (1 if method == "draft_model" else 0)
