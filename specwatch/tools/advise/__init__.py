"""``specwatch advise`` (tau per smaller K, budget per K); may import cli, observe, vllm, core.

:mod:`.advisor` is the math (a fact about vLLM's scheduler), :mod:`.command` the subcommand that
reads saved /metrics bodies.
"""
