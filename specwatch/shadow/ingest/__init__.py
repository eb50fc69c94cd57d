"""How live requests enter the shadow chain (mirror, proxy, canary); may import shadow, core."""
