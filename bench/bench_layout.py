"""Size of the package as a newcomer reads it: the largest modules and the largest classes.

    python bench/bench_layout.py [--top 5] [--json]

Walks every ``*.py`` under ``specwatch/`` and prints the ``--top`` modules by line count and the
``--top`` classes by lines (from the ``class`` line, decorators included, to the class's last
line, as :mod:`ast` places them) with their method counts. Import time is
``bench/bench_import.py``'s job; the before/after figures of a layout change quote both.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specwatch"


@dataclass(frozen=True)
class Module:
    """One module: its path relative to the repository root and its line count."""

    path: str
    lines: int


@dataclass(frozen=True)
class Class:
    """One class: where it is, how many lines it spans and how many methods it defines."""

    path: str
    name: str
    lines: int
    methods: int


def modules(root: Path) -> list[Module]:
    """Every module under ``root``, largest first."""
    found = [
        Module(str(p.relative_to(root.parent)), len(p.read_text(encoding="utf-8").splitlines()))
        for p in sorted(root.rglob("*.py"))
    ]
    return sorted(found, key=lambda m: (-m.lines, m.path))


def classes(root: Path) -> list[Class]:
    """Every class (nested ones too) under ``root``, largest first."""
    found: list[Class] = []
    for p in sorted(root.rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            last = node.end_lineno if node.end_lineno is not None else node.lineno
            methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            found.append(
                Class(str(p.relative_to(root.parent)), node.name, last - first + 1, methods)
            )
    return sorted(found, key=lambda c: (-c.lines, c.path, c.name))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--top", type=int, default=5, help="how many modules and classes")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args()
    mods = modules(PACKAGE)[: opts.top]
    cls = classes(PACKAGE)[: opts.top]
    if opts.json:
        out = {"modules": [asdict(m) for m in mods], "classes": [asdict(c) for c in cls]}
        print(json.dumps(out, indent=2))
        return
    print(f"{'largest modules':58} {'lines':>6}")
    for m in mods:
        print(f"{m.path:58} {m.lines:>6}")
    print(f"\n{'largest classes':58} {'lines':>6} {'methods':>8}")
    for c in cls:
        print(f"{c.path + ':' + c.name:58} {c.lines:>6} {c.methods:>8}")


if __name__ == "__main__":
    main()
