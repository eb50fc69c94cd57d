"""Offline readers of saved files; may import cli, settings, alerts, observe, shadow, core.

:mod:`.paired_test` (exact McNemar and non-inferiority over two runs' per-item correctness,
read by :mod:`.inputs`), :mod:`.bench_result` (vllm bench serve result files),
:mod:`.record` (running servers' /metrics saved as timelines) and :mod:`.replay` (every
detector over saved timelines on a simulated clock).
"""
