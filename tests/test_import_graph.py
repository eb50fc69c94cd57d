"""The modules of specwatch/ import one another in a DAG: no cycle, not even a type-only one.

import-linter checks the direction between packages; this checks every module against every
other, counting each ``import`` statement wherever it stands: at the top, under
``if TYPE_CHECKING:`` and inside functions. A cycle that only type checkers follow still ties two
modules into one unit a reader has to hold at once, and it becomes a real import cycle the day
one annotation is evaluated.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.fakes import REPO

PACKAGE = "specwatch"


def module_name(path: Path, root: Path) -> str:
    """``specwatch/shadow/ledger.py`` -> ``specwatch.shadow.ledger``; a package is its folder."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The absolute names one import statement in module ``here`` asks for.

    ``import a.b`` asks for ``a.b``; ``from a import b, c`` asks for ``a.b`` and ``a.c`` (kept
    only where they are modules, see :func:`import_graph`) besides ``a`` itself; relative imports
    are resolved against ``here``.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = here.split(".") if is_package else here.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (every import statement in its file)."""
    files = {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = imported(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # ``from pkg import sub`` imports the module pkg.sub; ``from mod import name``
                # imports mod: keep the most specific name that is a module of the package.
                base, *members = targets
                modules = [m for m in members if m in files]
                targets = modules if modules and len(modules) == len(members) else [base, *modules]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through every strongly connected component of size > 1.

    Tarjan's algorithm, iterative; the cycle shown is a shortest one from the component's
    alphabetically first module back to itself.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return sorted(_shortest_cycle(graph, c) for c in components)


def _shortest_cycle(graph: Mapping[str, Iterable[str]], component: set[str]) -> list[str]:
    """Breadth-first from the component's first module back to it, inside the component."""
    first = min(component)
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt not in component:
                    continue
                if nxt == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [*reversed(path), first]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {first} in its component")


def write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_no_import_cycle_in_the_package() -> None:
    """No module of specwatch/ reaches itself through imports, type-only and local ones included;
    each cycle found is printed as ``a -> b -> a``."""
    graph = import_graph(REPO)
    assert len(graph) > 100
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_graph_counts_type_checking_local_and_relative_imports(tmp_path: Path) -> None:
    """A hand-made package: imports under ``if TYPE_CHECKING:``, inside a function, relative
    (``from . import x``, ``from .x import y``) and ``from pkg import module`` are all edges, and
    ``from module import name`` is an edge to the module, not to a member."""
    write(
        tmp_path,
        {
            "specwatch/__init__.py": "",
            "specwatch/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from specwatch.b import B\n"
            ),
            "specwatch/b.py": "def f():\n    from . import c\n",
            "specwatch/c.py": "from .sub.d import thing\n",
            "specwatch/sub/__init__.py": "from . import d\n",
            "specwatch/sub/d.py": "import os\nfrom specwatch import a\nthing = 1\n",
        },
    )
    assert import_graph(tmp_path) == {
        "specwatch": set(),
        "specwatch.a": {"specwatch.b"},
        "specwatch.b": {"specwatch.c"},
        "specwatch.c": {"specwatch.sub.d"},
        "specwatch.sub": {"specwatch.sub.d"},
        "specwatch.sub.d": {"specwatch.a"},
    }
    assert cycles(import_graph(tmp_path)) == [
        ["specwatch.a", "specwatch.b", "specwatch.c", "specwatch.sub.d", "specwatch.a"]
    ]


def test_cycles_reports_each_component_once() -> None:
    """Two separate cycles are two reports (the shortest loop from each one's first module); a
    chain that only leads into a cycle is not part of it."""
    graph = {
        "a": {"b"},
        "b": {"a", "c"},
        "c": set(),
        "x": {"y"},
        "y": {"z"},
        "z": {"x", "y"},
        "entry": {"x"},
    }
    assert cycles(graph) == [["a", "b", "a"], ["x", "y", "z", "x"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
