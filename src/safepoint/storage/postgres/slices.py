"""The PostgreSQL store's end of a slice: the run released at once, with its
``run.slice_ended`` event, in one statement (see ``safepoint._engine.slices``)."""

from __future__ import annotations

from typing import Any

from ..._rules.canonical import dumps
from ...types import Claim
from ..plans import Plan
from .connection import PostgresBase


class PostgresSlices(PostgresBase):
    """A run carried on in slices: released at the end of each."""

    def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> Plan[None]:
        row = yield from self._fenced(
            claim, "end_slice", new_work=False, step_id=step_id, detail=dumps(detail)
        )
        yield from self.wake_workers(row["workflow"])  # claimable again: wake a waiting worker
