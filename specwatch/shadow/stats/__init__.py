"""The paired, sequential and power statistics (pure functions); may import core.

:func:`first_pages` (the alerting policy replayed on a sequence of pairs) and
:func:`first_alarms` (each statistic's own first crossing) are the public entry points for
checking the live alarms from outside."""

from specwatch.shadow.stats.alarms import first_alarms as first_alarms
from specwatch.shadow.stats.policy import first_pages as first_pages
