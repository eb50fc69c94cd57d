"""The Snapshot, its metric families and JSON; may import alerts, observe, shadow, vllm, core."""
