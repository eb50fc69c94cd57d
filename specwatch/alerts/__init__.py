"""Detectors, pending timers, Alertmanager delivery; may import observe, shadow, vllm, core."""
