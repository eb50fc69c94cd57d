"""The settings reference page, ``docs/settings.md``, written from
:class:`~specwatch.settings.Settings`.

Every leaf field of every group becomes one row: its path in a config file, its type and
bounds, its default, its environment variable and its description (the docstring under the
field). A field without a docstring is an error, so a new setting cannot go undocumented.

Regenerate the page with ``python -m specwatch.settings_doc --write``; a test fails while the
checked-in page differs from what this module writes.
"""

from __future__ import annotations

import enum
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from specwatch.settings import Settings

#: Where the page lives, relative to the repository root.
DOC_PATH = Path("docs/settings.md")

#: The command that rewrites :data:`DOC_PATH` (named in the test's failure message).
REGENERATE = "python -m specwatch.settings_doc --write"

_INTRO = """\
# Settings reference

<!-- Written by `{regenerate}` from the code; do not edit by hand. -->

Every setting of `specwatch run`, group by group. Set them in a YAML, TOML or JSON file given
with `--config` (nested as the paths show: `scrape.interval_seconds` is `interval_seconds`
under `scrape:`), or in the environment (`SPECWATCH_` + the path in capitals, groups joined by
`__`; lists and mappings as JSON, `windows` and `paired.windows` also as `1m,5m`). The
environment wins over the file, and command-line flags win over both. Durations are seconds,
sizes bytes, rates per second, unless the name says otherwise. An unknown or misspelt field is
an error that names the field.
"""

_TARGETS = (
    "The keys of each entry of `targets`: a list in the config file, a JSON list in"
    " `SPECWATCH_TARGETS`, or `--target NAME=URL[,key=value...]` on the command line."
)


def _type_name(annotation: Any) -> str:
    """A short, readable name of a field's type: ``float``, ``"json" | "plain"``,
    ``list of str``."""
    if annotation is type(None):
        return "none"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f'"{a}"' for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (tuple, list):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f'"{m.value}"' for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {"SecretStr": "secret", "PosixPath": "path", "Path": "path", "Any": "any"}
    name = getattr(annotation, "__name__", str(annotation))
    return names.get(name, name)


def _bounds(field: FieldInfo) -> str:
    """The numeric bounds of a field (``> 0``, ``0 to 1``), or ``""``."""
    lo = hi = ""
    for m in field.metadata:
        if isinstance(m, annotated_types.Gt):
            lo = f"> {m.gt}"
        elif isinstance(m, annotated_types.Ge):
            lo = f">= {m.ge}"
        elif isinstance(m, annotated_types.Lt):
            hi = f"< {m.lt}"
        elif isinstance(m, annotated_types.Le):
            hi = f"<= {m.le}"
    return ", ".join(b for b in (lo, hi) if b)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    text = json.dumps(to_jsonable_python(value))
    return f"`{text}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings group a field holds (``X`` or ``X | None``), or ``None`` for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        found = [a for a in get_args(annotation) if a is not type(None)]
        if len(found) == 1:
            return _model_of(found[0])
    return None


def _description(path: str, field: FieldInfo) -> str:
    if not field.description:
        raise ValueError(f"setting {path} has no description (a docstring under the field)")
    return " ".join(field.description.split()).replace("|", "\\|")


def _rows(model: type[BaseModel], path: str, env: str) -> Iterator[tuple[str, ...]]:
    """Rows (path, type, default, environment, description) of ``model``'s leaf fields; fields
    of one model class that repeat (the shadow arms) share rows, ``shadow.{standard|fly}.url``."""
    siblings: dict[type[BaseModel], list[str]] = {}
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            siblings.setdefault(sub, []).append(name)
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is None:
            here = f"{path}{name}"
            kind = _type_name(field.annotation)
            bounds = _bounds(field)
            kind = f"{kind} ({bounds})" if bounds else kind
            var = f"`{env}{name.upper()}`" if env else "in `SPECWATCH_TARGETS`"
            yield (f"`{here}`", kind, _default(field), var, _description(here, field))
            continue
        names = siblings[sub]
        here = f"{path}{name}"
        var = f"`{env}{name.upper()}`" if env else "in `SPECWATCH_TARGETS`"
        default = "unset" if field.default is None else "keys below"
        yield (f"`{here}`", "mapping", default, var, _description(here, field))
        if name != names[-1]:
            continue
        key = names[0] if len(names) == 1 else "{" + "\\|".join(names) + "}"
        env_key = key.upper() if len(names) == 1 else "{" + "\\|".join(names).upper() + "}"
        sub_env = f"{env}{env_key}__" if env else ""
        yield from _rows(sub, f"{path}{key}.", sub_env)


def _table(rows: Iterator[tuple[str, ...]]) -> list[str]:
    out = [
        "| Setting | Type | Default | Environment | What it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def render() -> str:
    """The whole page as Markdown."""
    lines = [_INTRO.format(regenerate=REGENERATE)]
    top = [(n, f) for n, f in Settings.model_fields.items() if _model_of(f.annotation) is None]
    lines += ["## Top level", ""]
    lines += _table(
        (
            f"`{n}`",
            _type_name(f.annotation),
            _default(f),
            f"`SPECWATCH_{n.upper()}`",
            _description(n, f),
        )
        for n, f in top
    )
    target = _target_model()
    lines += ["", "## `targets[]`: each vLLM server", "", _TARGETS, ""]
    lines += _table(_rows(target, "targets[].", ""))
    for name, field in Settings.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is None:
            continue
        lines += ["", f"## `{name}`", "", _description(name, field), ""]
        lines += _table(_rows(sub, f"{name}.", f"SPECWATCH_{name.upper()}__"))
    return "\n".join(lines) + "\n"


def _target_model() -> type[BaseModel]:
    (found,) = (m for m in get_args(Settings.model_fields["targets"].annotation) if _model_of(m))
    model = _model_of(found)
    assert model is not None
    return model


def main(argv: list[str] | None = None) -> int:
    """``--write``: rewrite :data:`DOC_PATH`; otherwise print the page."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--write"]:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    elif args:
        print(f"usage: {REGENERATE} (or no argument to print the page)", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
