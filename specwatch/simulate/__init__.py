"""A faithful vLLM speculative-decoding simulator (``specwatch simulate``).

Layout: :mod:`.engine` (synthetic target/draft LM and the verification rules),
:mod:`.scheduler` (vLLM's step-filling walk, budgets, step-time model, simulated and real time),
:mod:`.metrics` (vLLM 0.33 ``/metrics``), :mod:`.server` (vLLM's HTTP surface and the admin API),
:mod:`.faults`, :mod:`.canary` (items with gold answers), :mod:`.loadgen` and :mod:`.launcher`.

Imports nothing from the sidecar except :mod:`specwatch.core` and :mod:`specwatch.vllm`.
"""
