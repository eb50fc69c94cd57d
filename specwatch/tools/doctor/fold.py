"""``doctor``'s folding of failures one missing label explains (a Prometheus outside Kubernetes
has no ``namespace`` on any series, so every dashboard query selecting on it is empty): the
label leads as one line, its consequences are counted (:func:`fold_missing_labels`, used by
:func:`specwatch.tools.doctor.command.triage`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol, TypeVar


class Found(Protocol):
    """What a doctor finding has (:class:`specwatch.tools.doctor.command.Finding`)."""

    @property
    def status(self) -> str: ...
    @property
    def check(self) -> str: ...
    @property
    def message(self) -> str: ...


F = TypeVar("F", bound=Found)

#: A ``labels`` failure (:func:`specwatch.tools.doctor.stack.check_dashboard_labels`).
_MISSING_LABEL = re.compile(
    r"^(?P<dash>.+?): no series of (?P<metric>\S+) has label '(?P<label>[^']+)'"
)

#: Labels that prometheus-operator adds to every series it scrapes in Kubernetes and a
#: Prometheus outside Kubernetes does not (unless its scrape config sets them).
_KUBERNETES_LABELS = ("namespace", "pod", "container", "cluster")


def fold_missing_labels(
    findings: list[F], make: Callable[[str, str, str], F]
) -> tuple[list[F], list[F]]:
    """Fold the failures that one missing label explains: the ``labels`` failures about the
    same label (when there are several) become one line (how many metrics, which dashboards),
    and every dashboard failure whose query or variable selects on such a label is counted on
    one line after it.
    Returns (the other findings, the folded lines to print first: the root cause). A label
    Kubernetes' scrape adds (``namespace``...) says how to set it outside Kubernetes; ``role``
    on the vLLM series points to the role check's failure, which already names its fix.
    ``make(status, check, message)`` builds a finding."""
    missing: dict[str, tuple[list[str], list[str]]] = {}
    found: dict[str, list[F]] = {}
    rest: list[F] = []
    for f in findings:
        m = _MISSING_LABEL.match(f.message) if f.check == "labels" and f.status == "fail" else None
        if m is None:
            rest.append(f)
            continue
        found.setdefault(m["label"], []).append(f)
        metrics, dashes = missing.setdefault(m["label"], ([], []))
        for value, into in ((m["metric"], metrics), (m["dash"], dashes)):
            if value not in into:
                into.append(value)
    for label, alone in found.items():
        if len(alone) == 1:  # one metric: its own line says more than a summary would
            rest += alone
            del missing[label]
    if not missing:
        return findings, []

    def selects_on_missing(message: str) -> bool:
        return any(
            f"{label}=" in message or f"{label}!=" in message or f"${label} " in message
            for label in missing
        )

    follow = [f for f in rest if f.check == "dashboard" and f.status == "fail"]
    follow = [f for f in follow if selects_on_missing(f.message)]
    rest = [f for f in rest if f not in follow]
    role_failed = any(f.check == "role" and f.status == "fail" for f in rest)
    first: list[F] = []
    for label, (metrics, dashes) in missing.items():
        said = (
            f"no series of {len(metrics)} metric{'s' if len(metrics) != 1 else ''} has label "
            f"{label!r}, which the dashboards select on ({', '.join(dashes)}); e.g. {metrics[0]}"
        )
        if label in _KUBERNETES_LABELS:
            said += (
                f"; Prometheus outside Kubernetes? prometheus-operator sets {label!r} there; "
                "else set it in the scrape config (static_configs: labels) or a relabeling"
            )
        elif label == "role" and role_failed:
            said += "; it follows from the role failure below"
        first.append(make("fail", "labels", said))
    if follow:
        labels = ", ".join(repr(label) for label in missing)
        first.append(
            make(
                "fail",
                "dashboard",
                f"{len(follow)} dashboard queries and variables have no data: they follow from "
                f"the missing label{'s' if len(missing) > 1 else ''} {labels} above; fix "
                f"{'them' if len(missing) > 1 else 'it'} and run doctor again",
            )
        )
    return rest, first
