"""Live requests into the shadow chain (mirror, proxy, canary); may import shadow, core."""
