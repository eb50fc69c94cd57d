"""The pair ledger (the only SQL), one job per module; may import core, shadow.{values,tally}.

Its public names, re-exported here: :class:`~.ledger.Ledger` (the facade that composes the
modules), :class:`~.rows.LedgerRow` and :data:`~.writer.WRITE_ERROR_REASONS`; everything else is
imported from the module that defines it.
"""

from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.ledger.writer import WRITE_ERROR_REASONS

__all__ = ["WRITE_ERROR_REASONS", "Ledger", "LedgerRow"]
