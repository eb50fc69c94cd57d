"""A faithful vLLM speculative-decoding simulator (``specwatch simulate``); may import core, vllm.

Layout: :mod:`.config` (flags named as vLLM names them, fault state), :mod:`.lm` (synthetic
target and draft LMs and the verification rules), :mod:`.engine_core` (vLLM's step loop: the
step-filling walk, admission, chunked prefill, the step-time model), :mod:`.metrics` (vLLM 0.33
``/metrics``), :mod:`.server` (vLLM's HTTP surface and the admin API), :mod:`.requests` (a
request body read as vLLM's frontend reads it), :mod:`.openai_errors` (vLLM's error replies,
word for word),
:mod:`.replies` (log-probabilities, prompt token ids, tool calls), :mod:`.faults`,
:mod:`.quiz` (canary items with gold answers), :mod:`.loadgen` and :mod:`.launcher`.

Imports nothing from the sidecar except :mod:`specwatch.core` and :mod:`specwatch.vllm`.
"""
