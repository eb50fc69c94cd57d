"""Shadow chain: ingest, replay, compare, ledger; may import vllm, http1, core (not observe)."""
