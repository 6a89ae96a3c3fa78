"""The PostgreSQL store's steps: recorded one by one (``record_step``, scalar parameters) or in
a batch (``record_steps``: one statement, its large results inserted past the fence), failed
attempts, and the heartbeat's lease."""

from __future__ import annotations

from ..._rules.canonical import dumps
from ...errors import HistoryWarning
from ...types import AttemptRecord, Claim, StepRecord
from ..plans import Plan
from .connection import PostgresBase


class PostgresSteps(PostgresBase):
    """The PostgreSQL store's steps: recorded one by one or in a batch (one statement, its large
    results inserted past the fence), failed attempts, and the lease."""

    def record_step(self, claim: Claim, step: StepRecord) -> Plan[HistoryWarning | None]:
        result, result_ref, data = self._stored_result(claim.run_id, step)
        if data is not None:  # a large result: the batch inserts its artifact past the fence
            return (yield from self._record_batch(claim, [(step, result, result_ref, data)]))
        params = self._step_params(claim.run_id, step, result, result_ref)
        row = yield from self._fenced(claim, "record_step", limited=True, **params)
        return (yield from self._history_warning(claim, row))

    def record_steps(self, claim: Claim, steps: list[StepRecord]) -> Plan[HistoryWarning | None]:
        if not steps:
            return None
        if len(steps) == 1:  # one step, its result inline: the cheap form (record_step)
            return (yield from self.record_step(claim, steps[0]))
        stored = [(step, *self._stored_result(claim.run_id, step)) for step in steps]
        return (yield from self._record_batch(claim, stored))

    def _record_batch(
        self, claim: Claim, stored: list[tuple[StepRecord, str | None, str | None, bytes | None]]
    ) -> Plan[HistoryWarning | None]:
        """Steps as one statement, each with its result as stored (``_stored_result``)."""
        batch, refs, contents = [], [], []
        for step, result, result_ref, data in stored:
            if data is not None:  # inserted by the statement itself, past its fence
                refs.append(result_ref)
                contents.append(data)
            batch.append(self._step_params(claim.run_id, step, result, result_ref))
        # No large result: NULL for the two arrays, which unnest reads as no rows, as it reads
        # empty ones. Empty lists go through psycopg's list dumper: converting the statement's
        # parameters took 12 us with them, 7 us with NULLs (measured alone).
        row = yield from self._fenced(
            claim,
            "record_steps",
            limited=True,
            steps=dumps(batch),
            artifact_refs=refs or None,
            artifact_contents=contents or None,
        )
        return (yield from self._history_warning(claim, row))

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> Plan[None]:
        yield from self._fenced(
            claim,
            "record_attempt",
            step_id=attempt.step_id,
            attempt=attempt.attempt,
            kind=attempt.kind.value,
            name=attempt.name,
            input_hash=attempt.input_hash,
            error=self._sealed(
                attempt.error, "safepoint_attempts", "error", claim.run_id, attempt.step_id, attempt.attempt
            ),
            retry_at=attempt.retry_at,
        )

    def renew_lease(self, claim: Claim) -> Plan[None]:
        yield from self._fenced(claim, "renew_lease")
