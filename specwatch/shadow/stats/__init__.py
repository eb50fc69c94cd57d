"""The paired, sequential and power statistics (pure functions); may import core.

:func:`first_alarms` is the public entry point for checking the live alarms from outside."""

from specwatch.shadow.stats.alarms import first_alarms as first_alarms
