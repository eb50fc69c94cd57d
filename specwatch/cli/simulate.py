"""``specwatch simulate``: a simulated vLLM server doing speculative decoding (no GPU).

Flags are named as vLLM names them. Prints ``specwatch simulate: listening on http://HOST:PORT``
once bound (``--port 0`` picks a free port); SIGTERM or Ctrl-C stops it cleanly (exit 0 after
SIGTERM; after Ctrl-C the entry point's ``specwatch simulate: interrupted`` and exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from typing import TYPE_CHECKING

from specwatch.core.helptext import plain_help
from specwatch.core.shutdown import ShutdownDeadline, StopSignal
from specwatch.simulate.config import Role, SimConfig, StepTimeModel
from specwatch.vllm.request_metrics import MODES

if TYPE_CHECKING:
    from specwatch.simulate.server import SimServer


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a simulated vLLM server with speculative decoding (standard, FLy or baseline)",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument("--role", choices=[r.value for r in Role], default="standard")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT exit within this many seconds (open requests get 40%% of it)",
    )
    p.add_argument("--served-model-name", default="sim-model")
    p.add_argument("--method", default="eagle3", help="speculative method (vLLM names)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-scheduled-tokens", type=int, default=None)
    p.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=None,
        help="refuse (HTTP 503) a request when this many are unfinished (default: no limit)",
    )
    p.add_argument(
        "--max-num-queued-tokens",
        type=int,
        default=None,
        help="refuse (HTTP 503) a request when the prompts still in prefill hold this many "
        "tokens (default: no limit)",
    )
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--no-enable-chunked-prefill", action="store_true")
    p.add_argument("--fly-window-size", type=int, default=None)
    p.add_argument("--fly-entropy-threshold", type=float, default=0.3)
    p.add_argument("--fly-entropy-top-k", type=int, default=3)
    p.add_argument("--draft-sample-method", choices=["greedy", "random"], default="greedy")
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--vllm-version", default="0.33.0", help="budget rules: 0.33, 0.32, <=0.25")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=128)
    p.add_argument(
        "--target-sharpness",
        type=float,
        default=8.0,
        help="entropy profile of the synthetic target (higher = lower entropy)",
    )
    p.add_argument(
        "--draft-noise",
        type=float,
        default=0.8,
        help="draft/target disagreement (higher = lower acceptance)",
    )
    p.add_argument("--step-time-base-ms", type=float, default=4.0)
    p.add_argument("--step-time-per-token-us", type=float, default=25.0)
    p.add_argument("--step-time-per-seq-us", type=float, default=20.0)
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply simulated step durations (0 = as fast as possible)",
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        choices=list(MODES),
        default="none",
        metavar="MODE",
        help="vLLM's flag: add metrics.speculative_decoding to replies (none, summary or detailed)",
    )
    p.add_argument("--num-gpu-blocks", type=int, default=16384)
    p.add_argument(
        "--tool-call-parser",
        default=None,
        help="vLLM's flag: answer tool_choice required/named (and auto, with "
        "--enable-auto-tool-choice) with a tool call; without it such requests get vLLM's 400",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='vLLM\'s flag: allow tool_choice "auto" (needs --tool-call-parser)',
    )
    p.add_argument(
        "--faults",
        default=None,
        help="initial faults as JSON, e.g. '{\"fly_entropy_threshold\": 0.05}'",
    )
    p.set_defaults(handler=main)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build a :class:`SimConfig` from parsed flags (raises ``ValueError`` when invalid)."""
    cfg = SimConfig(
        role=Role(args.role),
        served_model_name=args.served_model_name,
        method=args.method,
        num_speculative_tokens=args.num_speculative_tokens,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_scheduled_tokens=args.max_num_scheduled_tokens,
        max_num_queued_reqs=args.max_num_queued_reqs,
        max_num_queued_tokens=args.max_num_queued_tokens,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=not args.no_enable_chunked_prefill,
        fly_window_size=args.fly_window_size,
        fly_entropy_threshold=args.fly_entropy_threshold,
        fly_entropy_top_k=args.fly_entropy_top_k,
        draft_sample_method=args.draft_sample_method,
        data_parallel_size=args.data_parallel_size,
        vllm_version=args.vllm_version,
        seed=args.seed,
        vocab_size=args.vocab_size,
        target_sharpness=args.target_sharpness,
        draft_noise=args.draft_noise,
        step_time=StepTimeModel(
            base_s=args.step_time_base_ms / 1000.0,
            token_s=args.step_time_per_token_us / 1e6,
            seq_s=args.step_time_per_seq_us / 1e6,
        ),
        time_scale=args.time_scale,
        per_request_spec_decode_metrics=args.per_request_spec_decode_metrics,
        num_gpu_blocks=args.num_gpu_blocks,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
    )
    cfg.validate()
    return cfg


async def _serve(
    server: SimServer, host: str, port: int, grace: float, stopped_by: StopSignal
) -> None:
    from specwatch.simulate.launcher import serve  # the server stack loads only when serving

    handle = await serve(server, host=host, port=port, shutdown_timeout=grace * 0.4)
    print(f"specwatch simulate: listening on {handle.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # a simulated vLLM: it cuts its streams early
    deadline = ShutdownDeadline(grace * 0.95, stopped_by)

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.note(sig)
        deadline.start()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        await stop.wait()
    finally:
        # stop accepting, give open requests 40 % of the grace, then close them and stop the
        # engines; cut off at 70 %, leaving the rest for the interpreter to exit; ended at 95 %
        # if that hangs (Kubernetes kills at its grace period)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace * 0.7):
                await handle.stop()
            deadline.cleaned()


def _faults_json(text: str) -> dict[str, object]:
    """The ``--faults`` JSON object; ValueError naming ``--faults`` when it is not valid JSON,
    nests too deep for the parser, or is not an object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--faults: invalid JSON: {exc}") from None
    except RecursionError:
        raise ValueError("--faults: invalid JSON: nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError("--faults must be a JSON object")
    return value


def main(args: argparse.Namespace) -> int:
    # The simulator's server stack (aiohttp, numpy) loads only here.
    from specwatch.simulate import faults as faults_mod
    from specwatch.simulate.server import SimServer

    try:
        cfg = config_from_args(args)
        server_faults: dict[str, object] = _faults_json(args.faults) if args.faults else {}
    except ValueError as exc:
        print(f"specwatch simulate: {exc}", file=sys.stderr)
        return 2

    stopped_by = StopSignal()

    async def run() -> None:
        server = SimServer(cfg)
        faults_mod.apply_patch(server.faults, server_faults)
        await _serve(server, args.host, args.port, args.shutdown_timeout, stopped_by)

    try:
        asyncio.run(run())
    except faults_mod.FaultError as exc:
        print(f"specwatch simulate: {exc}", file=sys.stderr)
        return 2
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        print(
            f"specwatch simulate: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 2
    stopped_by.end()  # Ctrl-C: the entry point's one line and exit 130, after the same stop
    return 0
