"""The embedded store: one SQLite file in WAL mode, shared safely by many processes.

The store is one class made of the parts of the ledger it writes, each a module of this
package: ``connection`` (connections, transactions, migrations, the executor of plans, and the
fence every worker write starts with — its concurrency rules are there), ``runs``, ``steps``,
``effects``, ``approvals``, ``history``, ``prune``, ``slices``, ``limits``, ``transactions``
(the user's writes committed with their step) and ``waits`` (messages, and the gates of wait
and sleep steps). What every store does alike — its reads, forks, retries, a key rotation's
pages — it runs as every store does: the shared plans' operations (``storage.operations``).
"""

from __future__ import annotations

from ..forks import ForkOperations
from ..resealing import ResealOperations
from ..retry import RetryOperations
from .approvals import SqliteApprovals
from .effects import SqliteEffects
from .history import SqliteHistory
from .limits import SqliteLimits
from .prune import SqlitePrune
from .slices import SqliteSlices
from .transactions import SqliteTransactions
from .waits import SqliteWaits

__all__ = ["SqliteStore"]


class SqliteStore(
    SqliteWaits,
    SqliteHistory,
    SqliteLimits,
    SqliteEffects,
    SqliteApprovals,
    SqlitePrune,
    SqliteSlices,
    SqliteTransactions,
    ForkOperations,
    RetryOperations,
    ResealOperations,
):
    """The ledger in one SQLite file (or in memory, for fast unit tests)."""
