"""JSON reply shapes, for comparing the simulator's replies with real vLLM's field by field."""

from __future__ import annotations

import json
from typing import Any


def shape(value: Any) -> Any:
    """The shape of a decoded JSON value: an object maps each key to its value's shape, a list
    becomes the sorted distinct shapes of its items (``[]`` when empty), a scalar its JSON type
    name (``null``, ``bool``, ``int``, ``float``, ``str``)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        items = {json.dumps(shape(v), sort_keys=True) for v in value}
        return [json.loads(s) for s in sorted(items)]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def sse_data(raw: str) -> list[str]:
    """The ``data:`` payloads of an event stream, in order."""
    return [e[len("data: ") :] for e in raw.split("\n\n") if e.startswith("data: ")]


def stream_shape(raw: str) -> list[Any]:
    """The event sequence of a stream as shapes (``"[DONE]"`` kept as is), runs of equal
    consecutive shapes collapsed to one (the number of content chunks depends on the text)."""
    out: list[Any] = []
    for data in sse_data(raw):
        s = data if data == "[DONE]" else shape(json.loads(data))
        if not out or out[-1] != s:
            out.append(s)
    return out


def differences(a: Any, b: Any, path: str = "$") -> list[str]:
    """Every place where shapes ``a`` and ``b`` differ, as ``path: a-side vs b-side`` lines
    (a key only one side has is reported with ``<absent>`` on the other)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in list(a) + [k for k in b if k not in a]:
            if k not in b:
                out.append(f"{path}.{k}: {a[k]!r} vs <absent>")
            elif k not in a:
                out.append(f"{path}.{k}: <absent> vs {b[k]!r}")
            else:
                out.extend(differences(a[k], b[k], f"{path}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
