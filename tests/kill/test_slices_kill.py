"""A long run carried over many short slices by successive real processes — the way a serverless
function or a job runner carries it — one of them SIGKILLed in the middle of its slice, inside
an effect's dispatch: the run ends as it does in one go, each effect applied once, as the
effect owner counts."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.testing import OwnerService, run_child
from safepoint.types import EffectState, RunStatus

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])
STEPS, EVERY = 1000, 200  # 1000 cheap steps, a ticket after every 200th: 5 effects
SLICE_S = 0.25
# Each step sleeps 1 ms (slice_flows.add): however fast the machine, the run needs this many
# slices at least, the killed one and the last included.
LEAST_SLICES = math.ceil(STEPS * 0.001 / SLICE_S)
# The slice that reaches this ticket dies just after the owner committed it, before the ledger
# heard back: the next slice must find it at the owner, not send it again.
KILL_AT = "effect.after_receiver_commit:ticket.399"


# Each store once, and each kind of workflow once: every process costs a second or two.
@pytest.mark.parametrize(
    ("workflow", "backend"),
    [("slice_flows:long_run", "sqlite"), ("slice_flows:long_run_async", "postgres")],
    ids=["sync-sqlite", "async-postgres"],
)
def test_a_1000_step_run_carried_over_many_slices_one_of_them_killed_applies_each_effect_once(
    workflow: str,
    backend: str,
    owner_env: OwnerService,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'slices.db'}"
    else:
        url = f"{request.getfixturevalue('pg_url')}?schema=k_{uuid.uuid4().hex[:12]}"
    store = sp.open_store(url)
    try:
        _check(store, url, workflow, owner_env)
    finally:
        store.close()


def _check(store: sp.Store, url: str, workflow: str, owner: OwnerService) -> None:
    import slice_flows

    # The reference: the same run in one go, in this process.
    reference = sp.start(store, getattr(slice_flows, workflow.split(":")[1]), STEPS, EVERY, run_id="whole")
    assert reference["tickets"] == [f"tk_{n}" for n in range(1, 6)]
    owner.client.reset()

    run_id = f"sliced-{uuid.uuid4().hex[:8]}"
    outcomes: list[str] = []
    result: Any = None
    while result is None:
        assert len(outcomes) < 100, f"the run makes no progress: {outcomes}"
        killing = "killed" not in outcomes
        child = run_child(
            workflow,
            store_url=url,
            run_id=run_id,
            args=[STEPS, EVERY],
            resume=bool(outcomes),
            crash_at=KILL_AT if killing else None,
            owner_url=owner.url,
            pythonpath=[TESTS],
            slice=SLICE_S,
            lease_ms=2_000,
            timeout=30,
        )
        if child.killed:
            assert killing, child.stderr
            # Killed mid-slice, inside the dispatch: the owner applied the ticket, the ledger
            # only knows it may have been sent — and nobody released the run.
            op = store.load_ledger(run_id).operations["ticket.399"]
            assert op.state is EffectState.DISPATCHING
            assert owner.client.stats()["applied"] == 2
            assert store.get_run(run_id).owner is not None
            outcomes.append("killed")
            continue
        assert child.outcome is not None, child.stderr
        status = child.outcome["status"]
        assert status in ("unfinished", "completed"), child.outcome  # never RunOwned: released
        if status == "unfinished":
            run = store.get_run(run_id)
            assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.RUNNING, None, None)
            outcomes.append("unfinished")
        else:
            result = child.outcome["result"]
            outcomes.append("completed")

    assert "killed" in outcomes  # the kill happened, mid-run
    assert 0 < outcomes.index("killed") < len(outcomes) - 1
    assert len(outcomes) >= LEAST_SLICES  # many slices, not a few
    assert outcomes.count("unfinished") >= LEAST_SLICES - 2
    assert result == reference
    stats = owner.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (5, 0)
    ledger = store.load_ledger(run_id)
    assert ledger.run.status is RunStatus.COMPLETED
    assert sorted(op.operation_id for op in ledger.operations.values()) == sorted(
        f"ticket.{i}" for i in range(EVERY - 1, STEPS, EVERY)
    )
    for op in ledger.operations.values():  # none sent twice: the killed one was found by key
        assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 1)
    ended = [e for e in store.events(run_id) if e.kind == "run.slice_ended"]
    assert len(ended) == outcomes.count("unfinished")  # every slice but the killed one released
