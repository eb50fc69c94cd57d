"""The one pair-status rule (shadow/classify.py), as seen by the pipeline counters, compare and the
tally."""

from __future__ import annotations

import ast

from specwatch.shadow.classify import EXCLUDED_REASONS, classify, classify_pair, failure_class
from specwatch.shadow.compare import compare
from specwatch.shadow.ledger import LedgerRow
from specwatch.shadow.summary import tally_rows
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.fakes import REPO

_PKG = REPO / "specwatch"


def _req(gold: str | None = None) -> ShadowRequest:
    return ShadowRequest(
        path="/v1/completions",
        body={"prompt": "q"},
        request_hash="h1",
        received_at=1000.0,
        source=Source.CANARY if gold is not None else Source.MIRROR,
        category="math",
        item_id="q1" if gold is not None else None,
        gold=gold,
    )


def _ok(arm: Arm, text: str = "4") -> ArmResult:
    return ArmResult(arm=arm, ok=True, latency_seconds=0.1, status=200, text=text)


def _failed(arm: Arm, status: int, error: str) -> ArmResult:
    return ArmResult(arm=arm, ok=False, latency_seconds=0.1, status=status, error=error)


def test_standard_503_is_standard_http_5xx_in_counters_and_compare() -> None:
    """A standard-arm 503 is ``unpaired/standard_http_5xx`` for the pipeline counters
    (classify_pair) and for what the ledger stores (compare): the class form, never ``_503``."""
    pair = ReplayPair(_req(), _failed(Arm.STANDARD, 503, "http_503"), _ok(Arm.FLY))
    assert classify_pair(pair) == ("unpaired", "standard_http_5xx")
    out = compare(pair)
    assert (out.status, out.reason) == ("unpaired", "standard_http_5xx")


def test_noise_400_keeps_the_pair_paired_and_is_no_noise_flip() -> None:
    """A noise arm answering 400 neither excludes the fly/standard pair nor counts as a noise
    flip or agreement: the pair tallies one ``agree`` and no ``noise_*``/``flip_*`` count."""
    noise = _failed(Arm.NOISE, 400, "bad_request")
    pair = ReplayPair(_req(), _ok(Arm.STANDARD), _ok(Arm.FLY), noise)
    assert classify_pair(pair) == ("paired", None)
    out = compare(pair)
    assert (out.status, out.reason) == ("paired", None)
    assert out.noise is not None
    assert out.noise.agrees is None
    assert out.noise.correct is None
    tally = tally_rows([LedgerRow.from_outcome(out)])["math"]
    assert tally.agree == 1
    assert (tally.noise_agree, tally.noise_disagree) == (0, 0)
    assert (tally.flip_fly_only, tally.flip_noise_only, tally.flip_both, tally.flip_neither) == (
        0,
        0,
        0,
        0,
    )


def test_rule_order_checker_then_refusal_then_failure() -> None:
    """Bad checker beats a refusal, a refusal (even on FLy) beats a standard failure, the
    standard arm is named before FLy, and a bare 422 is ``bad_request``."""
    std_timeout = ArmResult(Arm.STANDARD, False, 5.0, error="timeout")
    fly_422 = ArmResult(Arm.FLY, False, 0.1, status=422, error="http_422")
    fly_conn = ArmResult(Arm.FLY, False, 0.1, error="connect")
    assert classify(_ok(Arm.STANDARD), fly_422, checker_ok=False) == ("excluded", "bad_checker")
    assert classify(std_timeout, fly_422) == ("excluded", "bad_request")
    assert classify(std_timeout, fly_conn) == ("unpaired", "standard_timeout")
    assert classify(_ok(Arm.STANDARD), fly_conn) == ("unpaired", "fly_connect")
    assert set(EXCLUDED_REASONS) == {"unsupported_parameter", "bad_request", "bad_checker"}


def test_failure_class_maps_http_errors_to_their_class() -> None:
    """``http_503`` → ``http_5xx``, ``http_404`` → ``http_4xx``, other names kept, none →
    ``error``."""
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="http_503")) == "http_5xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="http_404")) == "http_4xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, status=502)) == "http_5xx"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1, error="too_large")) == "too_large"
    assert failure_class(ArmResult(Arm.FLY, False, 0.1)) == "error"


def test_no_other_module_assigns_a_pair_status() -> None:
    """Only classify.py produces the ``"unpaired"``/``"excluded"`` status literals in specwatch/
    (other modules may compare against them, not return or assign them)."""
    offenders = []
    for path in _PKG.rglob("*.py"):
        if path.name == "classify.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Tuple) and len(node.elts) == 2):
                continue
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in ("unpaired", "excluded"):
                offenders.append(f"{path.relative_to(_PKG)}:{node.lineno}")
    assert offenders == []
