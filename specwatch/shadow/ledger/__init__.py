"""The pair ledger (the only SQL), one job per module; may import core, shadow.{values,tally}.

Its public names, re-exported here: :class:`~.ledger.Ledger` (the facade that composes the
modules) and :class:`~.rows.LedgerRow`; everything else is imported from the module that
defines it. The write error reasons the writer counts are
:data:`specwatch.shadow.values.WRITE_ERROR_REASONS`.
"""

from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow

__all__ = ["Ledger", "LedgerRow"]
