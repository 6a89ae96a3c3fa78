"""The shared store: PostgreSQL, for many workers on many machines.

``PostgresStore`` (``store``) is the sync store; ``safepoint.storage.postgres_async`` the
asyncio one. Both carry out the plans of ``ledger.PostgresLedger`` — one per store operation,
written once — on connections from a pool (``pool``: proving a pooled connection alive without
a round trip), with "now" the database's clock (``clock``: estimated between readings).
"""

from __future__ import annotations

from .store import PostgresStore

__all__ = ["PostgresStore"]
