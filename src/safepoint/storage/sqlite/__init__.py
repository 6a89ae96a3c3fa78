"""The embedded store: one SQLite file in WAL mode, shared safely by many processes.

The store is one class made of the parts of the ledger it writes, each a module of this
package: ``connection`` (connections, transactions, migrations, and the fence every worker
write starts with — its concurrency rules are there), ``runs``, ``steps``, ``effects``,
``approvals``, ``history``, ``forks``, ``retry``, ``prune``, ``slices``, ``limits``,
``transactions`` (the user's writes committed with their step), ``waits`` (messages, and the
gates of wait and sleep steps) and ``resealing`` (values encrypted again after a key rotation).
What it reads, it reads as every store does
(``safepoint.storage.ledger``).
"""

from __future__ import annotations

from .approvals import SqliteApprovals
from .effects import SqliteEffects
from .forks import SqliteForks
from .history import SqliteHistory
from .limits import SqliteLimits
from .prune import SqlitePrune
from .resealing import SqliteResealing
from .retry import SqliteRetry
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
    SqliteForks,
    SqliteRetry,
    SqlitePrune,
    SqliteSlices,
    SqliteResealing,
    SqliteTransactions,
):
    """The ledger in one SQLite file (or in memory, for fast unit tests)."""
