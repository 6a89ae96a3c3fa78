"""Store conformance: the console's listing (``query_runs``): filters, counts and keyset paging,
all answered by the store itself."""

from __future__ import annotations

import pytest

from ...errors import UsageError
from ...types import RunQuery, RunStatus
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import ConformanceBase, _uid


class ListingTests(ConformanceBase):
    """The conformance tests of ``query_runs``."""

    @exercises(VALUES, ACROSS_RUNS)
    def test_query_runs_filters_counts_and_pages_newest_created_first(self) -> None:
        store = self.store()
        _, done = self.start(store, run_id=f"alpha-{_uid()}")
        store.finish_run(done, RunStatus.COMPLETED, result=1)
        pending = [self.submit(store, run_id=f"beta-{i}-{_uid()}") for i in range(5)]
        other = f"{self.workflow}-other"
        self.submit(store, workflow=other, run_id=f"beta-x-{_uid()}")

        mine = RunQuery(workflow=self.workflow)
        page = store.query_runs(mine)
        assert page.total == 6
        assert page.counts[RunStatus.PENDING] == 5
        assert page.counts[RunStatus.COMPLETED] == 1
        assert page.counts[RunStatus.BLOCKED] == 0  # every status is counted, zeros too
        assert {run.workflow for run in page.runs} == {self.workflow}
        keys = [(run.created_at or 0, run.run_id) for run in page.runs]
        assert keys == sorted(keys, reverse=True)

        only = store.query_runs(RunQuery(workflow=self.workflow, status=RunStatus.PENDING))
        assert (only.total, {run.status for run in only.runs}) == (5, {RunStatus.PENDING})
        assert only.counts[RunStatus.COMPLETED] == 1  # the counts leave the status filter aside

        found = store.query_runs(RunQuery(workflow=self.workflow, search="ALPHA"))
        assert [run.run_id for run in found.runs] == [done.run_id]  # case is ignored
        assert store.query_runs(RunQuery(workflow=self.workflow, workflow_version="v9")).total == 0
        assert store.query_runs(RunQuery(workflow=other)).total == 1

        # pages of two, each after the last run of the one before; a run created meanwhile
        # is newer than every page already shown and shifts none of them
        seen: list[str] = []
        after = None
        while True:
            part = store.query_runs(RunQuery(workflow=self.workflow, limit=2, after=after))
            assert part.total == 6 + (1 if seen else 0)
            seen.extend(run.run_id for run in part.runs)
            if len(seen) == 2:
                self.submit(store, run_id=f"late-{_uid()}")
            if part.next_after is None:
                break
            after = part.next_after
        assert len(seen) == len(set(seen)) == 6  # none twice, none skipped
        assert set(seen) == {done.run_id, *(run.run_id for run in pending)}

    @exercises(VALUES, ACROSS_RUNS)
    def test_query_runs_bounds_times(self) -> None:
        store = self.store()
        first = self.submit(store)
        last = self.submit(store)
        everything = store.query_runs(RunQuery(workflow=self.workflow))
        assert everything.total == 2
        newer = store.query_runs(RunQuery(workflow=self.workflow, created_from=last.created_at))
        assert last.run_id in {run.run_id for run in newer.runs}
        older = store.query_runs(RunQuery(workflow=self.workflow, created_to=first.created_at + 1))
        assert first.run_id in {run.run_id for run in older.runs}
        none = RunQuery(workflow=self.workflow, updated_from=last.updated_at + 60_000)
        assert store.query_runs(none).total == 0
        assert store.query_runs(RunQuery(workflow=self.workflow, updated_to=first.updated_at)).total == 0

    @exercises(VALUES, ACROSS_RUNS)
    def test_query_runs_refuses_an_empty_page(self) -> None:
        with pytest.raises(UsageError, match="limit"):
            self.store().query_runs(RunQuery(limit=0))
