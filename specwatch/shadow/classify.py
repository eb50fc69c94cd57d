"""The one pair-status rule: is a replayed pair ``paired``, ``unpaired`` or ``excluded``, and why.

Used by :func:`specwatch.shadow.compare.compare` (what the ledger stores and the outcome counters
export), by the pipeline's replay counters, and documented in ``docs/architecture.md``. Rules, in
order:

1. ``excluded`` / ``bad_checker``: the request's checker spec is invalid (compare passes
   ``checker_ok=False``); nothing about either arm can be judged.
2. ``excluded`` / ``unsupported_parameter`` or ``bad_request``: the **standard or FLy** arm refused
the
   request (400/422; ``unsupported_parameter`` when the replayer saw the message name an unknown
   parameter, any other failed 400/422 is ``bad_request``). Such a request says nothing about
   quality.
3. ``unpaired`` / ``<arm>_<class>``: the standard arm (checked first) or the FLy arm failed
otherwise.
   ``<class>`` is the HTTP class for status failures, ``http_5xx`` or ``http_4xx`` (a 503 is
   ``standard_http_5xx``, never ``standard_http_503``, so the reason set stays small and fixed),
   else
   the replayer's error name (``timeout``, ``connect``, ``in_band_error``, ``too_large``,
   ``truncated_stream``, ``invalid_body``; ``error`` when none was given). Never counted as a
   mismatch.
4. ``paired``: both the standard and the FLy arm answered.

The noise arm never decides the pair's status: a noise arm that fails (a 400 included) leaves the
fly/standard pair ``paired`` (its quality evidence is intact), and the noise arm's ``correct`` and
``agrees`` are ``None`` (see compare), so the pair counts neither as a noise flip nor as a noise
agreement: the noise-floor tallies only see noise arms that answered.
"""

from __future__ import annotations

import re
from typing import Literal

from specwatch.shadow.values import ArmResult, ReplayPair

PairStatus = Literal["paired", "unpaired", "excluded"]

#: Why a pair is excluded (``specwatch_shadow_excluded_total{reason}``, exported from 0):
#: an arm refused the request as one it does not support (400/422 naming a parameter) or as
#: otherwise bad (other 400/422), or the request's checker spec is invalid.
EXCLUDED_REASONS = ("unsupported_parameter", "bad_request", "bad_checker")

_REFUSED = ("unsupported_parameter", "bad_request")


def refusal(r: ArmResult) -> str | None:
    """The exclusion reason when the arm refused the request as bad, else ``None``.

    The replayer's ``unsupported_parameter`` / ``bad_request`` are kept; any other failed answer
    with
    status 400 or 422 is ``bad_request``."""
    if r.error in _REFUSED:
        return r.error
    if not r.ok and r.status in (400, 422):
        return "bad_request"
    return None


def failure_class(r: ArmResult) -> str:
    """A failed arm's error in the reason vocabulary: ``http_5xx``/``http_4xx`` for
    ``http_<status>``
    errors (and for a failed answer whose only clue is its status), else the error name, else
    ``error``."""
    err = r.error
    if err is None or err.startswith("http_"):
        code = r.status if err is None else _status_of(err)
        if code is not None and 500 <= code <= 599:
            return "http_5xx"
        if code is not None and 400 <= code <= 499:
            return "http_4xx"
    return err or "error"


def _status_of(err: str) -> int | None:
    tail = err.removeprefix("http_")
    return int(tail) if tail.isdigit() else None


def classify(
    standard: ArmResult, fly: ArmResult, *, checker_ok: bool = True
) -> tuple[PairStatus, str | None]:
    """``("paired", None)``, ``("excluded", reason)`` or ``("unpaired", reason)`` by the module's
    rules.

    ``checker_ok=False`` excludes the pair as ``bad_checker`` before the arms are looked at.
    Pure."""
    if not checker_ok:
        return "excluded", "bad_checker"
    refused = refusal(standard) or refusal(fly)
    if refused is not None:
        return "excluded", refused
    for a in (standard, fly):
        if not a.ok:
            return "unpaired", f"{a.arm.value}_{failure_class(a)}"
    return "paired", None


def classify_pair(pair: ReplayPair) -> tuple[PairStatus, str | None]:
    """:func:`classify` of the pair's standard and FLy arms (the noise arm never decides); pure."""
    return classify(pair.standard, pair.fly)


_UNSUPPORTED_PARAMETER = re.compile(
    r"not (?:yet )?supported|unsupported|unknown (?:field|param)|unrecognized"
    r"|extra (?:inputs|fields)|not permitted|not allowed|extra_forbidden",
    re.IGNORECASE,
)


def is_unsupported_parameter_message(message: str) -> bool:
    """True when a 400/422 error message says a request parameter is not supported: vLLM's
    "... are not yet supported ..." (sampling parameters it cannot honour with speculative
    decoding), "not supported", "unknown field", pydantic's "extra inputs are not permitted"."""
    return _UNSUPPORTED_PARAMETER.search(message) is not None
