"""The PostgreSQL store's forks: the plans are every store's (``safepoint.storage.forks``);
a fork made wakes a worker."""

from __future__ import annotations

from ...types import OperationRecord, RunRecord
from .. import families, forks
from ..base import ForkRun
from ..plans import Plan
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresForks(PostgresBase):
    """A fork made, and an operation found in a run's fork ancestry."""

    def fork_run(self, fork: ForkRun) -> Plan[RunRecord]:
        run = yield from forks.fork_run(self, fork, None)
        yield _q("notify_work", workflow=run.workflow)  # a pending run: wake a worker
        return run

    def family_operation(self, run_id: str, family_key: str) -> Plan[OperationRecord | None]:
        return (yield from families.family_operation(_q, run_id, family_key, self.codec))
