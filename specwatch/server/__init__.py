"""The aiohttp app, wiring, fleet server; may import settings and everything below it."""
