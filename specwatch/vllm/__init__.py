"""vLLM facts: metric families, spec methods, budget limits, the K advisor; may import core."""
