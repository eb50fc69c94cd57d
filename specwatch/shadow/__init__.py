"""Shadow chain: ingest, sample, replay, compare, ledger; may import vllm, core (not observe)."""
