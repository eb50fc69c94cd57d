"""vLLM facts: metric families, spec methods, budget limits; may import core."""
