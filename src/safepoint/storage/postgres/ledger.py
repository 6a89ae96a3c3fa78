"""The PostgreSQL store's logic, written once for the sync and the async store.

What each store operation does — which named queries (``sql/postgres/queries.sql``), with which
parameters, how rows become records, when to raise ``LostOwnership`` or ``StoreError`` — is a
plan (``safepoint.storage.plans``): a generator method of ``PostgresLedger`` that yields
statements and is sent back each one's rows. A plan performs no I/O, so it cannot block or
await; an executor carries it out in one transaction:

- ``PostgresStore`` (``store``): a ``psycopg_pool.ConnectionPool`` connection,
  ``with conn.transaction()``, and ``connection.run_plan_on``;
- ``AsyncPostgresStore`` (``safepoint.storage.postgres_async``): an ``AsyncConnectionPool``
  connection, ``async with conn.transaction()``, and ``connection.run_plan_on_async``.

Both translate driver errors with ``PostgresBase.failure`` (the original kept as
``__cause__``); anything a plan raises itself rolls the transaction back and passes unchanged.
The plans live with what they write: ``runs``, ``steps``, ``effects``, ``approvals``,
``history``, ``prune``, ``slices``, ``limits``, ``waits``, ``transactions``; what they read,
and what every store does alike (forks, retries, a key rotation's pages), is every store's
(``safepoint.storage.ledger``, ``forks``, ``retry``, ``resealing``: ``storage.operations``).
"""

from __future__ import annotations

from .approvals import PostgresApprovals
from .effects import PostgresEffects
from .history import PostgresHistory
from .limits import PostgresLimits
from .prune import PostgresPrune
from .runs import PostgresRuns
from .slices import PostgresSlices
from .steps import PostgresSteps
from .transactions import PostgresTransactions
from .waits import PostgresWaits

__all__ = ["PostgresLedger"]


class PostgresLedger(
    PostgresLimits,
    PostgresRuns,
    PostgresSteps,
    PostgresEffects,
    PostgresApprovals,
    PostgresHistory,
    PostgresPrune,
    PostgresSlices,
    PostgresWaits,
    PostgresTransactions,
):
    """Everything the two PostgreSQL stores share: the URL's meaning, and one plan per store
    operation (see the module docstring). Holds no connection."""
