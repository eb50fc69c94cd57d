"""The aiohttp app, its wiring, the config checks; may import settings and everything below it."""
