"""The start-up check that the shutdown budget fits the pod's termination grace period and
container order, with hand-worked numbers (margin 1 s, close reserve min(1 s, 10 % of the
budget)), and the timeline the drain keeps to."""

from __future__ import annotations

import pytest

from specwatch.core.pod import KILL_MARGIN_SECONDS, PodSettings, shutdown_fit
from specwatch.core.shutdown import Drain, close_reserve_seconds
from specwatch.server.checks import check_settings
from specwatch.settings import Settings
from tests.fakes import FakeMonotonicClock


def test_the_budget_that_fits_leaves_the_margin() -> None:
    """Grace 60 s, preStop 5 s: 5 + 54 + 1 = 60 fits (no problem); 5 + 55 + 1 = 61 does not,
    and the message names the 54 s that would."""
    pod = PodSettings(
        termination_grace_period_seconds=60, pre_stop_seconds=5, container="container"
    )
    assert KILL_MARGIN_SECONDS == 1.0
    assert shutdown_fit(pod, budget=54, proxy=True) == []
    [problem] = shutdown_fit(pod, budget=55, proxy=True)
    assert (problem.setting, problem.needed, problem.grace) == (
        "server.shutdown_timeout_seconds",
        61.0,
        60.0,
    )
    assert "55 s + preStop 5 s + 1 s margin = 61 s does not fit" in problem.message
    assert "lower it to 54 s" in problem.message


def test_kubernetes_default_grace_with_a_long_budget() -> None:
    """The default 30 s grace, no preStop, a 30 s budget: 0 + 30 + 1 = 31 > 30, whatever the
    container order."""
    for container in ("native_sidecar", "container", "standalone", None):
        pod = PodSettings(termination_grace_period_seconds=30, container=container)
        [problem] = shutdown_fit(pod, budget=30, proxy=False)
        assert problem.needed == 31.0


def test_a_regular_container_with_the_proxy_cuts_streams_vllm_could_finish() -> None:
    """Grace 60 s, budget 10 s, regular container, proxy on: 11 s needed fits, but the vLLM
    containers may serve until 60 s while streams through the proxy are cut at 10 - 1 = 9 s;
    the message names 59 s. The same pod without the proxy, or as a native sidecar, is fine."""
    pod = PodSettings(termination_grace_period_seconds=60, container="container")
    [problem] = shutdown_fit(pod, budget=10, proxy=True)
    assert problem.setting == "pod.container"
    assert "may serve until 60 s" in problem.message
    assert "cut 9 s after" in problem.message
    assert problem.message.endswith("server.shutdown_timeout_seconds to 59")
    assert shutdown_fit(pod, budget=10, proxy=False) == []
    assert shutdown_fit(pod, budget=59, proxy=True) == []
    native = PodSettings(termination_grace_period_seconds=60, container="native_sidecar")
    assert shutdown_fit(native, budget=10, proxy=True) == []


def test_nothing_is_checked_without_the_grace_period() -> None:
    """No ``pod.termination_grace_period_seconds``: nothing known, no problem."""
    assert shutdown_fit(PodSettings(container="container"), budget=1e6, proxy=True) == []


def test_check_settings_reports_it_as_a_warning() -> None:
    """``specwatch doctor --config`` and ``specwatch run`` see it through check_settings."""
    s = Settings.model_validate(
        {
            "server": {"shutdown_timeout_seconds": 30},
            "pod": {"termination_grace_period_seconds": 30},
        }
    )
    [finding] = [f for f in check_settings(s) if f.setting == "server.shutdown_timeout_seconds"]
    assert finding.level == "warning"
    assert "31 s does not fit terminationGracePeriodSeconds 30 s" in finding.message


@pytest.mark.parametrize(("budget", "reserve"), [(10.0, 1.0), (60.0, 1.0), (5.0, 0.5)])
def test_the_close_reserve(budget: float, reserve: float) -> None:
    """10 % of the budget, at most 1 s."""
    assert close_reserve_seconds(budget) == pytest.approx(reserve)


def test_the_drain_timeline() -> None:
    """SIGTERM at 100 s with a 10 s budget: drain until 109 s, exit by 110 s; a second signal
    keeps the first start."""
    mono = FakeMonotonicClock(100.0)
    drain = Drain(10.0, mono)
    assert not drain.draining
    drain.begin()
    mono.t = 103.0
    drain.begin()
    assert (drain.until, drain.exit_by, drain.left(), drain.exit_left()) == (109, 110, 6, 7)
    mono.t = 109.5
    assert (drain.left(), drain.elapsed()) == (0.0, 9.5)
