"""The pod specwatch runs in, as far as its shutdown is concerned, and the start-up check that
the shutdown budget fits it.

Kubernetes sends SIGTERM after the container's ``preStop`` hook and SIGKILL
``terminationGracePeriodSeconds`` (G) after the pod began terminating; the Downward API
exposes neither that number nor the container order, so the manifests set them as settings
(``pod.termination_grace_period_seconds``, ``pod.container``; the shipped ones do, next to the
fields they copy, and a deploy test keeps the two equal).

:func:`shutdown_fit` is the pure check: with budget T (``server.shutdown_timeout_seconds``),
preStop P (``pod.pre_stop_seconds``) and :data:`KILL_MARGIN_SECONDS` M, specwatch needs
P + T + M <= G. Its problems (each a setting to change and a one-line message):

- P + T + M > G: the kubelet kills specwatch before its drain ends (streams cut, replays
  uncounted, alert state and ledger rows not saved);
- a native sidecar (``pod.container: native_sidecar``) whose main containers take
  ``pod.main_exit_seconds`` (E) to exit: it gets SIGTERM only then, so E + P + T + M > G
  leaves too little of the grace period after vLLM exits (with G 30 s and vLLM exiting at
  27 s, 3 s remain for the 10 s default budget);
- a regular container (``pod.container: container``) with the shadow proxy on and
  P + T + M < G: the vLLM containers get SIGTERM at the same moment and may serve until G, but
  specwatch stops proxying at P + T less its close reserve, so streams vLLM would finish are
  cut. A native sidecar (an init container with ``restartPolicy: Always``) gets SIGTERM only
  after the vLLM containers exited, so their streams are over by then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from specwatch.core.frozen import Frozen
from specwatch.core.shutdown import close_reserve_seconds

__all__ = ["KILL_MARGIN_SECONDS", "FitProblem", "PodSettings", "shutdown_fit"]

#: Kept between specwatch's exit (at most the budget + 0.3 s after SIGTERM) and SIGKILL.
KILL_MARGIN_SECONDS = 1.0

Container = Literal["native_sidecar", "container", "standalone"]


class PodSettings(Frozen):
    """The pod's termination, as its manifest sets it (``None``: not known, nothing checked)."""

    termination_grace_period_seconds: float | None = Field(default=None, ge=0)
    """The pod's `terminationGracePeriodSeconds`; unset: the shutdown fit is not checked."""
    pre_stop_seconds: float = Field(default=0.0, ge=0)
    """How long specwatch's `preStop` hook runs before SIGTERM (0: none)."""
    container: Container | None = None
    """How specwatch runs in the pod: `native_sidecar` (init container with `restartPolicy:
    Always`), `container` (beside the vLLM ones) or `standalone`."""
    main_exit_seconds: float | None = Field(default=None, ge=0)
    """As a native sidecar: seconds after termination begins by which the main (vLLM)
    containers have exited (their preStop plus their own drain); specwatch gets SIGTERM only
    then. Unset: not checked."""


@dataclass(frozen=True, slots=True)
class FitProblem:
    """One way the shutdown budget does not fit the pod: the ``setting`` to change, a one-line
    ``message`` and the numbers (seconds) it was worked from."""

    setting: str
    message: str
    needed: float
    grace: float


def shutdown_fit(pod: PodSettings, *, budget: float, proxy: bool) -> list[FitProblem]:
    """The problems of shutting down within ``budget`` seconds in ``pod`` (see the module
    docstring); ``proxy``: live streams pass through specwatch (shadow proxy mode). Pure."""
    grace = pod.termination_grace_period_seconds
    if grace is None:
        return []
    pre = pod.pre_stop_seconds
    needed = pre + budget + KILL_MARGIN_SECONDS
    fits_in = max(0.0, grace - pre - KILL_MARGIN_SECONDS)
    out: list[FitProblem] = []
    after = pod.main_exit_seconds
    if pod.container == "native_sidecar" and after is not None and after + needed > grace:
        left = max(0.0, grace - after)
        out.append(
            FitProblem(
                "server.shutdown_timeout_seconds",
                f"as a native sidecar specwatch gets SIGTERM only after the vLLM containers "
                f"exit ({after:g} s into terminationGracePeriodSeconds {grace:g} s): {left:g} s "
                f"remain for {budget:g} s + preStop {pre:g} s + {KILL_MARGIN_SECONDS:g} s margin "
                f"= {needed:g} s; lower it to {max(0.0, left - pre - KILL_MARGIN_SECONDS):g} s "
                f"or raise terminationGracePeriodSeconds to {after + needed:g} s",
                after + needed,
                grace,
            )
        )
    elif needed > grace:
        out.append(
            FitProblem(
                "server.shutdown_timeout_seconds",
                f"{budget:g} s + preStop {pre:g} s + {KILL_MARGIN_SECONDS:g} s margin = "
                f"{needed:g} s does not fit terminationGracePeriodSeconds {grace:g} s: the "
                f"kubelet kills specwatch before its drain ends; lower it to {fits_in:g} s or "
                "raise the grace period",
                needed,
                grace,
            )
        )
    elif pod.container == "container" and proxy and needed < grace:
        cut = pre + budget - close_reserve_seconds(budget)
        out.append(
            FitProblem(
                "pod.container",
                f"a regular container gets SIGTERM with the vLLM containers, which may serve "
                f"until {grace:g} s, but streams through the proxy are cut {cut:g} s after "
                f"termination begins; run specwatch as a native sidecar (initContainers, "
                f"restartPolicy: Always) or set server.shutdown_timeout_seconds to {fits_in:g}",
                needed,
                grace,
            )
        )
    return out
