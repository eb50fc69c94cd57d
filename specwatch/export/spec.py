"""One exported metric family's specification (:class:`MetricSpec`) and its constructors; the
families themselves are listed in :mod:`specwatch.export.catalogue`."""

from __future__ import annotations

from dataclasses import dataclass

#: The one label of a by-reason family.
REASON = ("reason",)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported family: ``name`` (counters without ``_total``), ``kind`` (``gauge`` or
    ``counter``), ``help``, ``labels`` (label names in order). ``open_labels``: samples carry
    these labels plus their own (``specwatch_alert_firing`` carries each alert's labels)."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    open_labels: bool = False

    @property
    def sample_name(self) -> str:
        """The exposed sample name: ``name`` plus ``_total`` for counters."""
        return self.name + "_total" if self.kind == "counter" else self.name


def _g(name: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", help_, labels)


def _c(name: str, help_: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "counter", help_, labels)
