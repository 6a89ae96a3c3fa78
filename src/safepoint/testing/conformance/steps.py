"""Store conformance: steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ..._rules.canonical import digest, dumps
from ...errors import Cancelled, HistoryLimitReached, LostOwnership
from ...types import StepKind, StepStatus
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import LARGE, SHORT_LEASE_MS, ConformanceBase, make_step, stamped_between


class StepTests(ConformanceBase):
    """The conformance tests of steps."""

    @exercises(VALUES, ACROSS_RUNS)
    def test_record_step_round_trips_every_field_in_seq_order(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        rid = run.run_id
        steps = [
            make_step(
                rid,
                "z.read",
                1,
                kind=StepKind.READ,
                result=[{"row": 1}],
                observed_at=store.now() - 5,
                attempt=3,
            ),
            make_step(
                rid,
                "y.model",
                2,
                kind=StepKind.MODEL,
                result={"text": "hi ✓"},
                model_id="model-1",
                prompt_hash="prompt-abc",
            ),
            make_step(rid, "x.decide", 3, kind=StepKind.DECISION, result="x.next", next_step_id="x.next"),
            make_step(
                rid, "w.effect", 4, kind=StepKind.EFFECT, result={"id": "T-1"}, operation_id="ticket:1"
            ),
            make_step(rid, "v.value", 5, kind=StepKind.VALUE, result=1712000000123),
            make_step(rid, "u.pure", 6, result=None),
            make_step(
                rid,
                "t.failed",
                7,
                status=StepStatus.FAILED,
                result=None,
                error={"type": "KeyError", "message": "'x'"},
            ),
            make_step(rid, "s.large", 8, result={"blob": LARGE}),
        ]
        t0 = store.now()
        for step in steps:
            store.record_step(claim, step)
        t1 = store.now()
        ledger = store.load_ledger(rid)
        assert list(ledger.steps) == [s.step_id for s in steps]
        for step in steps:
            loaded = ledger.steps[step.step_id]
            assert stamped_between(t0, loaded.recorded_at, t1)
            assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        text = dumps({"blob": LARGE}).encode()
        assert store.get_artifact(digest(text)) == text

    @exercises(VALUES, ACROSS_RUNS)
    def test_record_steps_writes_a_batch_in_one_commit_with_every_field(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        rid = run.run_id
        steps = [
            make_step(rid, "a.pure", 1, result={"n": 1}),
            make_step(rid, "b.large", 2, result={"blob": LARGE}),
            make_step(
                rid,
                "c.model",
                3,
                kind=StepKind.MODEL,
                result={"text": "hi"},
                model_id="model-1",
                prompt_hash="p",
                tokens=12,
                cost=0.5,
            ),
        ]
        before = store.get_run(rid)
        store.record_steps(claim, steps)
        store.record_steps(claim, [])  # nothing to write: nothing written
        ledger = store.load_ledger(rid)
        assert list(ledger.steps) == ["a.pure", "b.large", "c.model"]
        for step in steps:
            loaded = ledger.steps[step.step_id]
            assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        assert ledger.run.step_count == before.step_count + 3
        assert ledger.run.state_revision == before.state_revision + 1  # one commit
        assert (ledger.run.tokens_spent, ledger.run.cost_spent) == (12, 0.5)
        # a step recorded again counts once in the history; a new one counts
        store.record_steps(claim, [replace(steps[0], result={"n": 2}), make_step(rid, "d.pure", 4)])
        again = store.load_ledger(rid)
        assert again.steps["a.pure"].result == {"n": 2}
        assert again.run.step_count == before.step_count + 4

    def test_record_steps_is_fenced_and_held_to_the_limits_like_record_step(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        claim = self.take_over(store, run.run_id)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(LostOwnership):
            store.record_steps(old, [make_step(run.run_id, "stale", 1)])
        assert self.snapshot(store, run.run_id) == before
        limited, capped = self.start(store, history=(None, 4))
        size = store.get_run(limited.run_id).history_size
        batch = [make_step(limited.run_id, f"s{i}", i) for i in range(1, 6 - size)]
        with pytest.raises(HistoryLimitReached):
            store.record_steps(capped, batch)
        assert store.load_ledger(limited.run_id).steps == {}
        store.request_cancel(run.run_id, "ops")
        with pytest.raises(Cancelled):
            store.record_steps(claim, [make_step(run.run_id, "late", 1)])

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_re_recorded_step_replaces_its_row_and_keeps_its_seq(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(
            claim, make_step(run.run_id, "read", 1, kind=StepKind.READ, observed_at=1, result="old")
        )
        store.record_step(claim, make_step(run.run_id, "after", 2))
        again = make_step(
            run.run_id,
            "read",
            9,
            kind=StepKind.READ,
            input_hash="hash-2",
            observed_at=2,
            attempt=2,
            result={"blob": LARGE},
        )
        store.record_step(claim, again)
        ledger = store.load_ledger(run.run_id)
        loaded = ledger.steps["read"]
        assert loaded == replace(again, seq=1, fence=claim.fence, recorded_at=loaded.recorded_at)
        assert list(ledger.steps) == ["read", "after"]
        failed = replace(again, status=StepStatus.FAILED, result=None, error={"type": "E"}, next_step_id=None)
        store.record_step(claim, failed)
        loaded = store.load_ledger(run.run_id).steps["read"]
        assert loaded == replace(failed, seq=1, fence=claim.fence, recorded_at=loaded.recorded_at)

    def test_a_re_recorded_step_replaces_every_recorded_field(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(
            claim, make_step(run.run_id, "s", 1, kind=StepKind.MODEL, model_id="model-1", prompt_hash="p-1")
        )
        again = make_step(
            run.run_id,
            "s",
            1,
            kind=StepKind.DECISION,
            name="fn.other",
            model_id="model-2",
            prompt_hash="p-2",
            next_step_id="n",
            operation_id="op-2",
            result="n",
        )
        store.record_step(claim, again)
        loaded = store.load_ledger(run.run_id).steps["s"]
        assert loaded == replace(again, fence=claim.fence, recorded_at=loaded.recorded_at)
