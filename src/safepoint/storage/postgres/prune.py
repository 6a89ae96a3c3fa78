"""The PostgreSQL store's prune batch (``Store.prune_runs``): the plan every store runs
(``storage.prune``), in one transaction, each chain under its runs' row locks (``FOR UPDATE``)
and the artifacts it frees under theirs."""

from __future__ import annotations

from ..plans import Plan
from ..prune import PruneBatch, PruneRequest, prune_runs_plan
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresPrune(PostgresBase):
    """Finished runs deleted whole, a batch at a time."""

    def prune_runs(self, prune: PruneRequest) -> Plan[PruneBatch]:
        now = yield from self.now()
        return (yield from prune_runs_plan(_q, prune, now, lock_each_run=self.distributed is not None))
