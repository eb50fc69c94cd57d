"""Render specwatch's Prometheus rules as a prometheus-operator ``PrometheusRule``.

``deploy/prometheus/specwatch.rules.yaml`` (plain ``groups:``) is the only source; this module
wraps it as ``monitoring.coreos.com/v1`` ``PrometheusRule`` whose ``spec`` equals the file.

Run from the repository root::

    PYTHONPATH=. python -m specwatch.mixin          # rewrite deploy/prometheus/prometheusrule.yaml
    PYTHONPATH=. python -m specwatch.mixin --check  # exit 1 if the manifest is out of date

Exit codes: 0 ok, 1 out of date (``--check``), 2 unreadable rules file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_MANIFEST",
    "DEFAULT_RULES",
    "alert_rules",
    "dump_yaml",
    "load_rules",
    "main",
    "render_prometheusrule",
]

_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RULES = _ROOT / "deploy" / "prometheus" / "specwatch.rules.yaml"
DEFAULT_MANIFEST = _ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"

_HEADER = (
    "# Generated from deploy/prometheus/specwatch.rules.yaml by `python -m specwatch.mixin`.\n"
    "# Do not edit by hand; edit the rules file and regenerate.\n"
)


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (PromQL) as ``|`` blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_BlockDumper.add_representer(str, _str_representer)


def load_rules(path: Path = DEFAULT_RULES) -> dict[str, Any]:
    """Parse a rules file; raise ``ValueError`` unless it is a mapping with a ``groups`` list."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise ValueError(f"{path}: not a Prometheus rules file (no top-level groups list)")
    return doc


def alert_rules(rules: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every alerting rule (``alert:`` entries) of a parsed rules file, in file order."""
    return [r for g in rules["groups"] for r in g.get("rules", []) if "alert" in r]


def render_prometheusrule(
    rules: Mapping[str, Any],
    *,
    name: str = "specwatch",
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ``PrometheusRule`` object whose ``spec`` is ``rules`` (``{"groups": [...]}``).

    ``labels`` default to ``app.kubernetes.io/name: specwatch`` and
    ``app.kubernetes.io/component: alerting``; add the label your Prometheus ``ruleSelector``
    wants (kube-prometheus-stack: ``release: <name>``) with a kustomize patch.
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(
        labels
        if labels is not None
        else {"app.kubernetes.io/name": "specwatch", "app.kubernetes.io/component": "alerting"}
    )
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": rules["groups"]},
    }


def dump_yaml(doc: Mapping[str, Any]) -> str:
    """YAML text of the manifest: header comment, keys in insertion order, PromQL as blocks."""
    body = yaml.dump(dict(doc), Dumper=_BlockDumper, sort_keys=False, width=120)
    return _HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.mixin", description=__doc__)
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    parser.add_argument("--output", type=Path, default=DEFAULT_MANIFEST)
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args(argv)
    try:
        rules = load_rules(args.rules)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        print(f"specwatch.mixin: {exc}", file=sys.stderr)
        return 2
    text = dump_yaml(render_prometheusrule(rules))
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"specwatch.mixin: {args.output} is out of date; regenerate it", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
