"""The PostgreSQL store's retry of a failed run (``Store.retry_run``): the plan every store runs
(``storage.retry``), under the run's row lock, then a wake-up for the workers, as for a run
submitted to them."""

from __future__ import annotations

from ...types import RunRecord, RunRetry
from ..plans import Plan
from ..retry import retry_run_plan
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresRetry(PostgresBase):
    """A failed run retried by a person."""

    def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> Plan[RunRecord]:
        now = yield from self.now()
        workflow = yield from retry_run_plan(self, run_id, expected_revision, retry, now)
        yield _q("notify_work", workflow=workflow)  # pending now: wake a waiting worker
        return (yield from self.get_run(run_id))
