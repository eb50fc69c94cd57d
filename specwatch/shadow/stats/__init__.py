"""The paired, sequential and power statistics (pure functions); may import core."""
