"""The SQLite store's end of a slice: the run released at once, with its ``run.slice_ended``
event, in one transaction (see ``safepoint._engine.slices``)."""

from __future__ import annotations

from typing import Any

from ...types import Claim
from .connection import SQL
from .runs import SqliteRuns


class SqliteSlices(SqliteRuns):
    """A run carried on in slices: released at the end of each."""

    def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> None:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(
                SQL["end_slice"], {"run_id": claim.run_id, "fence": claim.fence, "now": now}
            ).fetchone()
            if row is None:
                raise self._refused(conn, claim, now)
            self._event(
                conn,
                claim.run_id,
                now,
                "run.slice_ended",
                step_id=step_id,
                fence=claim.fence,
                worker=claim.owner,
                detail=detail,
            )
