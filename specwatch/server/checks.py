"""Checks of a whole configuration: settings that load one by one but leave a check blind.

:func:`check_settings` takes loaded :class:`~specwatch.settings.Settings` and returns
:class:`Finding` values (pure; no I/O), each naming the setting to change. ``specwatch run``
refuses to start on an ``error`` and prints each ``warning`` on stderr; ``specwatch doctor
--config FILE`` prints them all. The combinations:

- ``shadow.baseline`` with ``noise_kind: standard``: the noise arm speculates, so the lossless
  check compares two speculative answers (both arms flip alike) and can never alarm: error.
- ``shadow.baseline`` with ``noise_kind: off``: the lossless check has no noise floor and
  counts no pairs: error.
- shadow on without a noise arm: flip rates have no noise floor (``SpecFlipRateAboveNoise``
  cannot fire): warning.
- a shadow arm no scraped target serves: its replays never pause under that server's load:
  warning.
- targets with no ``fly`` or no ``standard`` role: the FLy vs standard comparison and its
  alerts have nothing to compare: warning (none when nothing is scraped at all).
- the shutdown budget does not fit the pod's termination grace period, or a regular-container
  sidecar cuts proxied streams the vLLM containers could still finish
  (:func:`shutdown_findings`, :func:`specwatch.core.pod.shutdown_fit`): warning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from specwatch.core.pod import shutdown_fit
from specwatch.core.roles import Role
from specwatch.server.wiring import arm_targets
from specwatch.settings import Settings

Level = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: its ``level``, the ``setting`` to change and a one-line ``message``."""

    level: Level
    setting: str
    message: str

    def line(self) -> str:
        """``error: shadow.noise_kind: ...``, the line the CLI prints."""
        return f"{self.level}: {self.setting}: {self.message}"


def shutdown_findings(settings: Settings) -> list[Finding]:
    """The warnings of :func:`~specwatch.core.pod.shutdown_fit` for ``settings`` (``pod``,
    ``server.shutdown_timeout_seconds``, whether the shadow proxy is on)."""
    proxy = settings.shadow.enabled and "proxy" in settings.shadow.modes
    problems = shutdown_fit(
        settings.pod, budget=settings.server.shutdown_timeout_seconds, proxy=proxy
    )
    return [Finding("warning", p.setting, p.message) for p in problems]


def check_settings(settings: Settings) -> list[Finding]:
    """Every :class:`Finding` of ``settings`` (errors first), see the module docstring."""
    out: list[Finding] = []
    sh = settings.shadow
    if sh.enabled:
        if sh.baseline is not None and sh.noise_kind == "standard":
            out.append(
                Finding(
                    "error",
                    "shadow.noise_kind",
                    "standard beside shadow.baseline: the noise arm speculates, so the "
                    "lossless check cannot tell speculation from noise; set noise_kind: "
                    "baseline and shadow.noise to a server without speculation (or the "
                    "baseline itself)",
                )
            )
        elif sh.baseline is not None and sh.noise_kind == "off":
            out.append(
                Finding(
                    "error",
                    "shadow.noise_kind",
                    "off beside shadow.baseline: the lossless check needs a noise arm and "
                    "would count no pairs; set noise_kind: baseline with shadow.noise",
                )
            )
        elif sh.noise_kind == "off":
            out.append(
                Finding(
                    "warning",
                    "shadow.noise_kind",
                    "off: no noise arm, so flip rates have no noise floor and "
                    "SpecFlipRateAboveNoise cannot fire; set noise_kind: standard",
                )
            )
        served = arm_targets(settings)
        arms = {"standard": sh.standard, "fly": sh.fly}
        for arm, ep in arms.items():
            if ep is not None and arm not in served and settings.targets:
                out.append(
                    Finding(
                        "warning",
                        f"shadow.{arm}",
                        f"no scraped target serves {ep.url}: replays to it never pause under "
                        f"its load; add it to targets or set shadow.{arm}.target",
                    )
                )
    roles = {t.effective_role for t in settings.targets}
    if roles:
        for role in (Role.STANDARD, Role.FLY):
            if role not in roles:
                out.append(
                    Finding(
                        "warning",
                        "targets",
                        f"no target with role {role.value}: the FLy vs standard comparison "
                        "(pair gauges, SpecFLyGainLost) has nothing to compare",
                    )
                )
    out.extend(shutdown_findings(settings))
    return sorted(out, key=lambda f: f.level != "error")
