"""No function in the package takes more than :data:`MAX_PARAMETERS` parameters (group the rest
in a frozen value).

Counted from the source (AST), every ``def`` and ``async def`` including nested ones and
methods: each named parameter (positional-only, positional, keyword-only) counts one, except a
leading ``self`` or ``cls``; ``*args`` counts one and ``**kwargs`` counts one. :data:`KNOWN`
lists the functions still over the limit with their count today: one may only shrink, and an
entry whose function is gone or back within the limit must be removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fakes import REPO

MAX_PARAMETERS = 8

#: ``path:qualified name`` -> parameters today, for functions still over the limit (each in a
#: part of the package being rewritten or moved elsewhere: fix it there, then drop the entry).
KNOWN: dict[str, int] = {
    "specwatch/alerts/component.py:AlertingComponent.__init__": 9,
    "specwatch/alerts/alertmanager.py:AlertLoop.__init__": 9,
    "specwatch/shadow/ledger/ledger.py:Ledger.__init__": 9,
}


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of ``fn`` as this module counts them (see the module docstring)."""
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    named = len(names) + len(a.kwonlyargs)
    if names and names[0] in ("self", "cls"):
        named -= 1
    return named + (a.vararg is not None) + (a.kwarg is not None)


def _functions(
    tree: ast.AST, prefix: str = ""
) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            out.append((name, node))
            out.extend(_functions(node, f"{name}.<locals>."))
        elif isinstance(node, ast.ClassDef):
            out.extend(_functions(node, f"{prefix}{node.name}."))
        else:
            out.extend(_functions(node, prefix))
    return out


def over_limit(root: Path) -> dict[str, int]:
    """``path:qualified name`` -> parameters of every function under ``root/specwatch`` over
    :data:`MAX_PARAMETERS`."""
    found: dict[str, int] = {}
    for path in sorted((root / "specwatch").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for name, fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            n = parameter_count(fn)
            if n > MAX_PARAMETERS:
                found[f"{rel}:{name}"] = n
    return found


def test_the_count_follows_the_stated_rule() -> None:
    """Worked by hand: ``self`` is not counted; ``a, b, /, c, *rest, d, **kw`` are six; a
    function's first parameter named otherwise counts; a nested function is found by its
    qualified name."""
    src = (
        "class C:\n"
        "    def m(self, a, b, /, c, *rest, d, **kw):\n"
        "        def inner(x, y): ...\n"
        "def f(me, a): ...\n"
    )
    got = {name: parameter_count(fn) for name, fn in _functions(ast.parse(src))}
    assert got == {"C.m": 6, "C.m.<locals>.inner": 2, "f": 2}


def test_no_function_takes_more_than_eight_parameters() -> None:
    """Every function over the limit is a known one, none grew, and no entry is stale."""
    found = over_limit(REPO)
    new = {k: n for k, n in found.items() if k not in KNOWN}
    grew = {k: (KNOWN[k], n) for k, n in found.items() if k in KNOWN and n > KNOWN[k]}
    stale = sorted(k for k in KNOWN if k not in found)
    assert new == {}, f"more than {MAX_PARAMETERS} parameters: group them in a frozen value"
    assert grew == {}
    assert stale == [], "back within the limit (or gone): remove from KNOWN"
