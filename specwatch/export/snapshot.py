"""The one published value: :class:`Snapshot` of the observe view, shadow stats and alert state.

It lives in ``export`` because export is the lowest layer that sees all three parts. The server
builds it (:mod:`specwatch.server.wiring`) and keeps it in a :class:`specwatch.core.store.Store`;
the ``/metrics`` collector and ``/api/v1/snapshot`` read it. Immutable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specwatch.observe.values import ObserveView, PairView, TargetSnapshot, WindowName

if TYPE_CHECKING:
    from specwatch.alerts.values import AlertingState
    from specwatch.shadow.published import ShadowStats

__all__ = ["Snapshot", "SnapshotGetter"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything specwatch publishes at one moment.

    ``observe``: scraped targets and pair views. ``shadow``: the shadow chain's last statistics
    (``None`` when shadow is off or before its first refresh). ``alerts``: the alert loop's last
    state (``None`` when alerting is not running yet).
    """

    observe: ObserveView
    shadow: ShadowStats | None = None
    alerts: AlertingState | None = None

    @property
    def generated_at(self) -> float:
        """Unix seconds of the observe view's last rebuild."""
        return self.observe.generated_at

    @property
    def targets(self) -> Mapping[str, TargetSnapshot]:
        """``observe.targets``: every scraped target by name."""
        return self.observe.targets

    @property
    def pair(self) -> Mapping[WindowName, PairView]:
        """``observe.pair``: FLy vs standard by window."""
        return self.observe.pair


#: Returns the current snapshot (what collectors and routes call; no I/O).
SnapshotGetter = Callable[[], Snapshot]
