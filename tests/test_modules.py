"""The modules of specwatch/ as a newcomer walks them: imports form a DAG (no cycle, not even a
type-only one), no module is over 900 lines, and every package's ``__init__.py`` says in its first
line what the package is and what it may import.

import-linter checks the direction between packages; the cycle check here looks at every module
against every other, counting each ``import`` statement wherever it stands: at the top, under
``if TYPE_CHECKING:`` and inside functions. A cycle that only type checkers follow still ties two
modules into one unit a reader has to hold at once, and it becomes a real import cycle the day
one annotation is evaluated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.fakes import REPO

PACKAGE = "specwatch"

#: The most lines one module may have.
MAX_MODULE_LINES = 900

#: The top-level packages (and the ``settings`` module) a "may import" line can name.
LAYERS = (
    "core",
    "vllm",
    "observe",
    "shadow",
    "alerts",
    "export",
    "settings",
    "server",
    "demo",
    "cli",
    "simulate",
    "tools",
)


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


def test_no_module_is_over_900_lines() -> None:
    """Every module of specwatch/ has at most 900 lines; all offenders are listed, largest first."""
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
        for p in (REPO / PACKAGE).rglob("*.py")
    }
    over = sorted(((n, p) for p, n in sizes.items() if n > MAX_MODULE_LINES), reverse=True)
    assert over == [], f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(
        f"{p}: {n}" for n, p in over
    )


def allowed_by_the_note() -> dict[str, tuple[frozenset[str], str]]:
    """docs/architecture.md's table "What each package may import": package -> (the packages
    named before any "not", the cell's text)."""
    note = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = note.split("## What each package may import", 1)[1].split("\n## ", 1)[0]
    table: dict[str, tuple[frozenset[str], str]] = {}
    for row in re.findall(r"^\| `([\w_]+)`[^|]*\| (.*) \|$", section, flags=re.M):
        package, cell = row
        named = re.findall(r"`(\w+)`", re.split(r"\(not\b", cell)[0])
        table[package] = (frozenset(named), cell)
    return table


def may_import(line: str) -> tuple[frozenset[str], str] | None:
    """The packages or modules a docstring line says may be imported (named after "may import",
    before any "not": ``core``, ``shadow.values``, ``shadow.{values,tally}`` for two modules),
    and the text after "may import"; ``None`` without the phrase."""
    if "may import" not in line:
        return None
    rest = line.split("may import", 1)[1]
    allowed = re.split(r"\bnot\b", rest)[0]
    allowed = re.sub(
        r"(\w+(?:\.\w+)*)\.\{([\w, ]+)\}",
        lambda m: ", ".join(f"{m[1]}.{part.strip()}" for part in m[2].split(",")),
        allowed,
    )
    names = re.findall(r"\w+(?:\.\w+)*", allowed)
    return frozenset(n for n in names if n.split(".")[0] in LAYERS), rest


def test_may_import_reads_packages_modules_and_exclusions() -> None:
    """Packages, dotted modules and a brace pair are read; what follows "not" and words that
    are no package are left out."""
    said = may_import("Ledger; may import core, shadow.{values,tally} (not observe).")
    assert said == (
        frozenset({"core", "shadow.values", "shadow.tally"}),
        " core, shadow.{values,tally} (not observe).",
    )
    assert may_import("Demo; may import server and everything below it, and simulate.") == (
        frozenset({"server", "simulate"}),
        " server and everything below it, and simulate.",
    )
    assert may_import("Shared building blocks.") is None


def first_docstring_line(path: Path) -> str | None:
    """The first line of the module's docstring as written (``None`` without a docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree, clean=False)
    return None if doc is None else doc.strip().splitlines()[0]


def test_every_package_says_its_role_and_what_it_may_import() -> None:
    """Each ``__init__.py`` under specwatch/ opens with one line: the package's role, then "may
    import ...". A top-level package names exactly the packages docs/architecture.md's table
    gives it ("nothing" for core and the root); a sub-package names a subset of its parent's,
    and its modules import nothing outside what it names (the package itself aside)."""
    table = allowed_by_the_note()
    graph = import_graph(REPO)
    problems: list[str] = []
    for init in sorted((REPO / PACKAGE).rglob("__init__.py")):
        name = module_name(init, REPO)
        where = str(init.relative_to(REPO))
        line = first_docstring_line(init)
        said = None if line is None else may_import(line)
        if line is None or said is None:
            problems.append(f"{where}: no first docstring line saying what it may import")
            continue
        named, rest = said
        parts = name.split(".")
        if len(parts) == 1 or parts[1] == "core":
            if not rest.strip().startswith("nothing"):
                problems.append(f"{where}: says {rest!r}, the table says nothing from specwatch")
            continue
        top = parts[1]
        expected, cell = table[top]
        if len(parts) == 2:
            if named != expected or (
                "everything below it" in cell and "everything below it" not in rest
            ):
                problems.append(f"{where}: says {rest!r}, the table says {cell!r}")
            continue
        beyond = sorted(n for n in named if n.split(".")[0] not in expected | {top})
        if beyond:
            problems.append(f"{where}: names {beyond} beyond {top}'s")
        prefixes = [f"{PACKAGE}.{n}" for n in named] + [name]
        for module in sorted(m for m in graph if m == name or m.startswith(name + ".")):
            for target in sorted(graph[module]):
                if not any(target == p or target.startswith(p + ".") for p in prefixes):
                    problems.append(f"{where}: {module} imports {target}, not in {rest!r}")
    assert problems == [], "\n".join(problems)


def test_package_docstrings_name_only_modules_that_exist() -> None:
    """A package docstring's ``:mod:`` references (``.sub`` relative or ``specwatch.x`` absolute)
    name modules that exist, and a docstring with a ``Layout:`` map names every module of its
    package, so the map cannot go stale when a module is renamed or added."""
    modules = set(import_graph(REPO))
    problems: list[str] = []
    for init in sorted((REPO / PACKAGE).rglob("__init__.py")):
        name = module_name(init, REPO)
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        refs = re.findall(r":mod:`~?([\w.]+)`", doc)
        named = {name + ref if ref.startswith(".") else ref for ref in refs}
        problems += [f"{name}: names {m}, which does not exist" for m in sorted(named - modules)]
        if "Layout:" in doc:
            children = {m for m in modules if m.rsplit(".", 1)[0] == name}
            problems += [f"{name}: its layout leaves out {m}" for m in sorted(children - named)]
    assert problems == [], "\n".join(problems)
