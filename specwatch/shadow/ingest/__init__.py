"""Shadow ingest: how live requests enter the shadow chain (mirror, proxy, canary)."""
