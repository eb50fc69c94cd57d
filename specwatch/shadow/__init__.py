"""Shadow chain: ingest -> sample -> replay -> compare -> ledger -> stats."""
