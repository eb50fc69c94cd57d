"""Shadow chain: ingest, replay, compare, ledger; may import vllm, core (not observe)."""
