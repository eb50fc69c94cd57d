"""Run ``specwatch demo --no-ui`` in a child process, inject a fault, time its alert.

A test helper: :func:`fault_to_alert` starts the demo at its defaults (any free port), reads
the URLs it prints, waits ``warmup_s`` of normal traffic, posts the fault to the named
simulator's ``/admin/faults`` and polls ``/api/v1/snapshot`` until an alert named ``alert``
fires (or ``timeout_s`` passes); it returns the seconds from the fault to the alert, the
alert's labels and what the demo printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True, slots=True)
class FaultRun:
    """``seconds`` from the fault to the alert (``None``: it did not fire in time), the firing
    alert's ``labels`` and the demo's ``output``."""

    seconds: float | None
    labels: dict[str, str]
    output: str


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def fault_to_alert(
    role: str,
    fault: dict[str, Any],
    alert: str,
    *,
    warmup_s: float,
    timeout_s: float,
    extra: tuple[str, ...] = (),
) -> FaultRun:
    """See the module docstring; ``role`` is ``standard`` or ``fly``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "specwatch", "demo", "--no-ui", "--port", "0", *extra]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    urls: dict[str, str] = {}
    try:
        for line in proc.stdout:
            lines.append(line)
            words = line.split()
            if line.startswith("  snapshot:"):
                urls["snapshot"] = words[1]
            elif line.startswith("  standard simulator:"):
                urls["standard"] = words[2]
            elif line.startswith("  fly simulator:"):
                urls["fly"] = words[2]
            elif line.startswith("  stop:"):
                break
        time.sleep(warmup_s)
        if fault:
            _post(urls[role] + "/admin/faults", fault)
        injected = time.monotonic()
        while time.monotonic() - injected < timeout_s:
            doc = _get(urls["snapshot"])
            for a in doc["alerts"]:
                if a["labels"].get("alertname") == alert:
                    return FaultRun(time.monotonic() - injected, dict(a["labels"]), "".join(lines))
            time.sleep(1.0)
        return FaultRun(None, {}, "".join(lines))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        lines.append(rest or "")
