"""Observe chain: fetch, parse, window, health, tracker; may import vllm, core (not shadow)."""
