"""``specwatch report``, HTML and plots from the pair ledger; may import shadow, vllm, core.

:mod:`.data` reads the ledger and the optional acceptance source and computes everything with
the shadow statistics (no statistics of its own); :mod:`.render` draws the plots with matplotlib
(the ``report`` extra, Agg backend) and writes ``index.html``; :mod:`.command` is the subcommand.
"""

from specwatch.core.config import SINCE_START

__all__ = ["MAX_POINTS", "REPORT_WINDOW"]

#: The window name the report's tables use (every row of the ledger).
REPORT_WINDOW = SINCE_START

#: Most points any plotted series has, whatever the ledger size (time bins of the flips and net
#: loss plots, points of each e-value path).
MAX_POINTS = 2000
