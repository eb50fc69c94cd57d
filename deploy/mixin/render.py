"""Render specwatch's Prometheus mixin: rule templates + thresholds → rules file and PrometheusRule.

Inputs, each defined once:

- ``rules/<area>.yaml.tmpl`` (areas in :data:`AREAS` order): plain ``groups:`` YAML with
  ``%(name)s`` placeholders; any other ``%`` (``printf "%.3f"``) is left alone.
- thresholds: every numeric field of ``specwatch.alerts.settings.DetectSettings()`` under its
  field name (``*_for`` seconds as Prometheus durations, ``600.0`` → ``10m``), and
  ``e_value_bound`` = ``1 / specwatch.shadow.settings.PairedSettings().alpha`` (0.05 → 20).
- ``config.yaml`` ``_config``: rule-only knobs (camelCase keys), the PromQL selectors
  ``vllmSelector`` / ``specwatchSelector`` (label matchers added to every ``vllm:*`` /
  ``specwatch_*`` series; an empty one leaves the selector out, see :func:`drop_empty_matchers`)
  and ``runbookURLPattern``, which gives every alert its ``runbook_url`` (``%s`` = the alert name
  in lower case).

Outputs (checked in; ``--check`` and a test keep them current): ``specwatch.rules.yaml`` (plain
``groups:``, what Prometheus and promtool load) and ``prometheusrule.yaml`` (the same groups as a
prometheus-operator ``PrometheusRule``). Run from the repository root::

    python -m deploy.mixin.render          # rewrite both files
    python -m deploy.mixin.render --check  # exit 1 if either is out of date

Exit codes: 0 ok, 1 out of date (``--check``), 2 unreadable or invalid template or config.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from specwatch.alerts.settings import DetectSettings
from specwatch.shadow.settings import PairedSettings

__all__ = [
    "AREAS",
    "CONFIG",
    "DEFAULT_MANIFEST",
    "DEFAULT_RULES",
    "MIXIN_DIR",
    "TEMPLATES_DIR",
    "alert_rules",
    "drop_empty_matchers",
    "dump_yaml",
    "fill",
    "load_config",
    "load_rules",
    "main",
    "placeholders",
    "prometheus_duration",
    "render_prometheusrule",
    "render_rules",
    "rendered_files",
    "threshold_values",
]

MIXIN_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = MIXIN_DIR / "rules"
CONFIG = MIXIN_DIR / "config.yaml"
DEFAULT_RULES = MIXIN_DIR / "specwatch.rules.yaml"
DEFAULT_MANIFEST = MIXIN_DIR / "prometheusrule.yaml"

#: Rule template areas, in the order their groups appear in the rendered file.
AREAS = ("spec_decode", "fly", "quality", "self")

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

_HEADER = (
    "# Generated from deploy/mixin/rules/*.yaml.tmpl, deploy/mixin/config.yaml and specwatch's\n"
    "# DetectSettings / PairedSettings defaults by `python -m deploy.mixin.render`.\n"
    "# Do not edit by hand; edit the templates or settings and regenerate.\n"
)


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (PromQL) as ``|`` blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_BlockDumper.add_representer(str, _str_representer)


def prometheus_duration(seconds: float) -> str:
    """Seconds as the shortest exact Prometheus duration: 600 → ``10m``, 3600 → ``1h``.

    Raises ``ValueError`` for a negative or fractional number of seconds.
    """
    if seconds < 0 or seconds != int(seconds):
        raise ValueError(f"{seconds!r} s is not a whole, non-negative number of seconds")
    whole = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _number(value: float) -> str:
    """A threshold as PromQL text: ``0.8``, ``20``, ``3.09`` (``%g``, no trailing ``.0``)."""
    return f"{value:g}"


def threshold_values(
    detect: DetectSettings | None = None, paired: PairedSettings | None = None
) -> dict[str, float]:
    """Placeholder name → number taken from the Python settings (defaults when not given).

    Keys: every int/float field of ``DetectSettings`` (seconds for ``*_for``) and
    ``e_value_bound`` = 1 / ``PairedSettings.alpha``.
    """
    detect = detect if detect is not None else DetectSettings()
    paired = paired if paired is not None else PairedSettings()
    values: dict[str, float] = {}
    for name in type(detect).model_fields:
        value = getattr(detect, name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[name] = float(value)
    values["e_value_bound"] = 1.0 / paired.alpha
    return values


def load_config(path: Path = CONFIG) -> dict[str, Any]:
    """The ``_config`` mapping of ``config.yaml``; ``ValueError`` when absent or not a mapping."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    config = doc.get("_config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: no _config mapping")
    return config


def _params(config: Mapping[str, Any], thresholds: Mapping[str, float]) -> dict[str, str]:
    """Placeholder name → replacement text; ``ValueError`` if a config key shadows a threshold."""
    clash = set(config) & set(thresholds)
    if clash:
        raise ValueError(f"config.yaml keys {sorted(clash)} clash with settings fields")
    params = {
        name: prometheus_duration(v) if name.endswith("_for") else _number(v)
        for name, v in thresholds.items()
    }
    params.update({k: str(v) for k, v in config.items() if isinstance(v, str | int | float)})
    return params


def placeholders(template: str) -> list[str]:
    """Names of the ``%(name)s`` placeholders of a template, in order of appearance."""
    return _PLACEHOLDER.findall(template)


def fill(template: str, params: Mapping[str, str]) -> str:
    """``template`` with each ``%(name)s`` replaced by ``params[name]``; ``KeyError`` if unknown."""
    return _PLACEHOLDER.sub(lambda m: params[m.group(1)], template)


def drop_empty_matchers(text: str) -> str:
    """Remove what an empty selector leaves: ``x{a="1", }`` → ``x{a="1"}``, ``x{}`` → ``x``."""
    return re.sub(r"\{\}", "", re.sub(r",\s*\}", "}", text))


def _add_runbook_links(groups: list[dict[str, Any]], pattern: str) -> None:
    """Set every alert's ``runbook_url`` from ``pattern``; ``ValueError`` if a template set one."""
    for group in groups:
        for rule in group.get("rules", []):
            if "alert" not in rule:
                continue
            annotations = rule.setdefault("annotations", {})
            if "runbook_url" in annotations:
                raise ValueError(f"{rule['alert']}: runbook_url comes from runbookURLPattern")
            annotations["runbook_url"] = pattern % rule["alert"].lower()


def render_rules(
    templates_dir: Path = TEMPLATES_DIR,
    config: Mapping[str, Any] | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The rules document ``{"groups": [...]}`` from the area templates, in :data:`AREAS` order.

    Raises ``KeyError`` for an unknown placeholder, ``ValueError`` for a template that is not a
    ``groups:`` document or sets its own ``runbook_url``, ``OSError`` for a missing template.
    """
    config = config if config is not None else load_config()
    params = _params(config, thresholds if thresholds is not None else threshold_values())
    groups: list[dict[str, Any]] = []
    for area in AREAS:
        path = templates_dir / f"{area}.yaml.tmpl"
        doc = yaml.safe_load(drop_empty_matchers(fill(path.read_text(encoding="utf-8"), params)))
        if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
            raise ValueError(f"{path}: not a Prometheus rules template (no groups list)")
        groups.extend(doc["groups"])
    _add_runbook_links(groups, str(config["runbookURLPattern"]))
    return {"groups": groups}


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
    """YAML text of a generated file: header comment, keys in insertion order, PromQL as blocks."""
    body = yaml.dump(dict(doc), Dumper=_BlockDumper, sort_keys=False, width=120)
    return _HEADER + body


def rendered_files(
    templates_dir: Path = TEMPLATES_DIR, config_path: Path = CONFIG
) -> dict[str, str]:
    """File name → text of both outputs: ``specwatch.rules.yaml`` and ``prometheusrule.yaml``."""
    config = load_config(config_path)
    rules = render_rules(templates_dir, config)
    manifest = render_prometheusrule(
        rules,
        name=str(config.get("prometheusRuleName", "specwatch")),
        labels=config.get("prometheusRuleLabels"),
    )
    return {DEFAULT_RULES.name: dump_yaml(rules), DEFAULT_MANIFEST.name: dump_yaml(manifest)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.mixin.render", description=__doc__)
    parser.add_argument("--templates", type=Path, default=TEMPLATES_DIR)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--output-dir", type=Path, default=MIXIN_DIR)
    parser.add_argument("--check", action="store_true", help="fail if an output is stale")
    args = parser.parse_args(argv)
    try:
        files = rendered_files(args.templates, args.config)
    except (OSError, KeyError, yaml.YAMLError, ValueError) as exc:
        print(f"render.py: {exc!r}", file=sys.stderr)
        return 2
    stale = False
    for name, text in files.items():
        out: Path = args.output_dir / name
        if args.check:
            current = out.read_text(encoding="utf-8") if out.exists() else ""
            if current != text:
                print(f"render.py: {out} is out of date; regenerate it", file=sys.stderr)
                stale = True
        else:
            out.write_text(text, encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
