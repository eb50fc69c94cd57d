"""Live requests into the shadow chain (mirror, proxy, canary); may import shadow, http1, core."""
