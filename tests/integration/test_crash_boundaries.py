"""The failure-injection cases, one named test each, on a SQLite file and on PostgreSQL.

Every test stops a run at one boundary (the crash point raises in this process: nothing after
it runs, the lease is 0, so the resume takes over as a new worker would), then resumes it
against the real effect owner over HTTP and checks what the owner counted. The same boundaries
are killed for real, with SIGKILL in a child process, in ``tests/kill/test_kill.py``.

The named cases and where they are tested (here unless a file is named):

- stop after prepared intent: test_stop_after_prepared_intent_dispatches_once
- stop after "dispatching" is recorded, before the call:
  test_stop_after_dispatching_before_the_call_sends_under_the_same_key
- the receiver commits and the response is dropped:
  test_receiver_commits_and_the_response_is_dropped,
  test_receiver_commits_and_the_worker_dies_before_the_receipt
- stop after the receipt, before verification:
  test_stop_after_the_receipt_before_verification_runs_only_the_verifier
- two workers resume one revision: test_two_workers_resume_one_revision (and, 1000 trials per
  store in real processes, tests/kill/test_ownership.py::test_two_resumers_from_one_revision)
- resume after cancellation: test_resume_after_cancellation_never_revives_the_run
- resume after approval expiry:
  test_approvals.py::test_an_expired_approval_no_longer_authorizes_the_dispatch
- resume after the dedup window expired:
  test_resume_after_the_dedup_window_expired_blocks_instead_of_resending
- a removed artifact: test_a_removed_artifact_blocks_before_anything_runs
- a changed workflow version: test_a_changed_workflow_version_blocks (and, for a changed
  fingerprint, test_workflow_versions.py::test_a_changed_tool_schema_blocks_the_run_and_says_what_changed)

DESIGN §3, row by row (evidence → allowed direction: test):

- pure step incomplete → recompute: test_row_pure_step_incomplete_is_recomputed
- prepared, never dispatching → dispatch: test_stop_after_prepared_intent_dispatches_once
- dispatching or unknown → reconcile, and
  - Applied → record and continue: test_receiver_commits_and_the_response_is_dropped,
    test_receiver_commits_and_the_worker_dies_before_the_receipt
  - NotApplied inside the retention → the same key:
    test_stop_after_dispatching_before_the_call_sends_under_the_same_key
  - NotApplied past the retention → blocked:
    test_resume_after_the_dedup_window_expired_blocks_instead_of_resending
  - Unknown or no reconcile → blocked: test_row_uncertain_without_a_read_path_blocks
- applied, not accepted → verifier only:
  test_stop_after_the_receipt_before_verification_runs_only_the_verifier
- accepted → replay the receipt: test_row_accepted_replays_the_receipt
- partial batch (fan-out) → each operation on its own:
  test_fan_out.py::test_a_partial_batch_of_effects_is_recovered_operation_by_operation
- missing artifact, unreadable record, incompatible version → blocked:
  test_a_removed_artifact_blocks_before_anything_runs, test_an_unreadable_record_blocks,
  test_a_changed_workflow_version_blocks
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

import safepoint as sp
from safepoint._engine.verbs import resume_record
from safepoint.errors import ArtifactMissing, CorruptRecord, IncompatibleWorkflow, RunOwned
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunStatus


def _execute(store_url: str, statement: str, *params: Any) -> int:
    """Raw SQL on the store's database, as an operator (or a disk) would: rows changed."""
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            return conn.execute(statement.replace("%s", "?"), params).rowcount
    import psycopg

    parts = urlsplit(store_url)
    schema = parse_qs(parts.query)["schema"][0]
    with psycopg.connect(urlunsplit(parts._replace(query="")), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        return conn.execute(statement, params).rowcount


def _stop_at(store: sp.Store, wf: sp.Workflow, crash_at: Any, point: str, *args: Any) -> None:
    crash_at(point)
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id="r", lease_ms=0)
    crash_at(None)


def _charge(name: str, effect: sp.Effect) -> sp.Workflow:
    @sp.workflow(name)
    def flow(run: sp.Run, amount: int) -> dict[str, Any]:
        receipt = run.effect("charge", effect, payload={"amount": amount}, operation_id="charge:1")
        return {"id": receipt["id"], "amount": receipt["amount"]}

    return flow


# An effect that keeps "prepared" as a commit of its own: recovery could not settle a crash after
# "dispatching" without a person (no reconcile), so the two are never one commit.
_UNRECONCILABLE = owner_effect("charges", reconcile=False)


def _counted(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return int(stats["applied"]), int(stats["duplicates"])


# -- the named cases ------------------------------------------------------------------------------


def test_stop_after_prepared_intent_dispatches_once(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    """Prepared, never dispatching: the resume dispatches, under the prepared key. Only an
    effect recovery could not reconcile alone stops here — this one has no reconcile; one that
    has (with a dedup retention) is prepared and dispatching in one commit, and stops after
    "dispatching" instead (the next test)."""
    flow = _charge("prepared", _UNRECONCILABLE)
    _stop_at(store, flow, crash_at, "effect.after_prepared", 5)
    prepared = store.load_ledger("r").operations["charge:1"]
    assert (prepared.state, prepared.dispatch_count) == (EffectState.PREPARED, 0)
    assert _counted(owner_env) == (0, 0)
    assert sp.resume(store, "r") == {"id": "ch_1", "amount": 5}
    done = store.load_ledger("r").operations["charge:1"]
    assert (done.effect_key, done.payload_ref) == (prepared.effect_key, prepared.payload_ref)
    assert done.dispatch_count == 1
    assert _counted(owner_env) == (1, 0)


def test_stop_after_dispatching_before_the_call_sends_under_the_same_key(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    """ "Dispatch may have happened" is durable, the call was never made: the owner's lookup
    says not applied (inside its key retention), so it is sent — under the same key. With a
    reconcile and a retention there was no "prepared" commit before: prepared and dispatching
    were one."""
    flow = _charge("dispatching", owner_effect("charges"))
    _stop_at(store, flow, crash_at, "effect.after_dispatching", 5)
    stopped = store.load_ledger("r").operations["charge:1"]
    assert (stopped.state, stopped.dispatch_count) == (EffectState.DISPATCHING, 1)
    assert [e.kind for e in store.events("r") if e.kind.startswith("effect.")] == [
        "effect.prepared",
        "effect.dispatching",
    ]
    assert _counted(owner_env) == (0, 0)
    key = stopped.effect_key
    assert sp.resume(store, "r") == {"id": "ch_1", "amount": 5}
    op = store.load_ledger("r").operations["charge:1"]
    assert (op.effect_key, op.dispatch_count) == (key, 2)
    assert owner_env.client.find_by_key("charges", key) is not None
    assert _counted(owner_env) == (1, 0)


def test_receiver_commits_and_the_response_is_dropped(store: sp.Store, owner_env: OwnerService) -> None:
    owner_env.client.set_faults(drop_after_commit=1)
    flow = _charge("dropped", owner_effect("charges"))
    assert sp.start(store, flow, 5, run_id="r") == {"id": "ch_1", "amount": 5}
    op = store.load_ledger("r").operations["charge:1"]
    assert op.dispatch_count == 1  # found by its key, never sent again
    kinds = [event.kind for event in store.events("r")]
    assert kinds.count("effect.unknown") == 1
    assert _counted(owner_env) == (1, 0)


def test_receiver_commits_and_the_worker_dies_before_the_receipt(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    flow = _charge("committed", owner_effect("charges"))
    _stop_at(store, flow, crash_at, "effect.after_receiver_commit", 5)
    assert _counted(owner_env) == (1, 0)
    assert sp.resume(store, "r") == {"id": "ch_1", "amount": 5}
    assert store.load_ledger("r").operations["charge:1"].dispatch_count == 1
    assert _counted(owner_env) == (1, 0)


def test_stop_after_the_receipt_before_verification_runs_only_the_verifier(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    verified: list[Any] = []
    base = owner_effect("tickets", verify=True)
    assert base.verify is not None
    effect = sp.Effect(
        base.name,
        execute=base.execute,
        reconcile=base.reconcile,
        dedup_retention=base.dedup_retention,
        verify=lambda receipt: verified.append(receipt) or base.verify(receipt),
    )
    flow = _charge("verify", effect)
    _stop_at(store, flow, crash_at, "effect.after_outcome", 5)
    assert store.load_ledger("r").operations["charge:1"].state is EffectState.APPLIED
    assert verified == []
    assert sp.resume(store, "r") == {"id": "tk_1", "amount": 5}
    assert [receipt["id"] for receipt in verified] == ["tk_1"]
    op = store.load_ledger("r").operations["charge:1"]
    assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 1)
    assert _counted(owner_env) == (1, 0)


def test_two_workers_resume_one_revision(store_url: str, owner_env: OwnerService, crash_at: Any) -> None:
    """Both read the run at the same revision and race on one compare-and-set: one claims and
    sends, the other is refused (or finds the run already ended); nothing is sent twice. The
    process-level version, 1000 trials per store, is
    tests/kill/test_ownership.py::test_two_resumers_from_one_revision."""
    first = sp.open_store(store_url)
    flow = _charge("two-workers", _UNRECONCILABLE)  # stops at "prepared" (see above)
    _stop_at(first, flow, crash_at, "effect.after_prepared", 5)
    seen = first.get_run("r")
    stores = [first, sp.open_store(store_url)]
    outcomes: list[Any] = [None, None]
    start = threading.Barrier(2)

    def resumer(index: int) -> None:
        start.wait(5)
        try:
            outcomes[index] = resume_record(stores[index], seen)
        except RunOwned as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=resumer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert {"id": "ch_1", "amount": 5} in outcomes
    claims = [e for e in first.events("r") if e.kind == "run.claimed"]
    assert len(claims) == 1  # exactly one compare-and-set won
    assert _counted(owner_env) == (1, 0)
    for opened in stores:
        opened.close()


def test_resume_after_cancellation_never_revives_the_run(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    flow = _charge("cancelled-at-prepared", _UNRECONCILABLE)  # stops at "prepared" (see above)
    _stop_at(store, flow, crash_at, "effect.after_prepared", 5)
    sp.cancel(store, "r", by="ops", reason="customer withdrew")
    for _ in range(2):
        with pytest.raises(sp.RunCancelled, match="customer withdrew"):
            sp.resume(store, "r")
    run = store.get_run("r")
    assert run.status is RunStatus.CANCELLED
    assert store.load_ledger("r").operations["charge:1"].dispatch_count == 0
    assert _counted(owner_env) == (0, 0)


def test_resume_after_the_dedup_window_expired_blocks_instead_of_resending(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    """The owner committed; the worker died; by the time a worker resumes, the key may be
    forgotten and the lookup lags: a re-send could charge twice. It blocks."""
    flow = _charge("retention-expired", owner_effect("charges", dedup_retention=timedelta(seconds=0.2)))
    owner_env.client.set_faults(index_lag=60.0)  # the lookup will not find it for a while
    _stop_at(store, flow, crash_at, "effect.after_receiver_commit", 5)
    threading.Event().wait(0.3)  # past the dedup retention
    with pytest.raises(sp.NeedsReconciliation, match="dedup retention") as blocked:
        sp.resume(store, "r")
    assert blocked.value.record["phase"] == "reconcile_effect"
    assert store.get_run("r").status is RunStatus.BLOCKED
    assert _counted(owner_env) == (1, 0)


def test_a_removed_artifact_blocks_before_anything_runs(
    store: sp.Store, store_url: str, owner_env: OwnerService, crash_at: Any
) -> None:
    calls: Counter[str] = Counter()
    effect = _UNRECONCILABLE  # stops at "prepared" (see above)

    @sp.workflow("artifact")
    def flow(run: sp.Run) -> Any:
        run.read("look", lambda: calls.update(["look"]) or 1)
        return run.effect("charge", effect, payload={"amount": 5}, operation_id="charge:1")

    _stop_at(store, flow, crash_at, "effect.after_prepared")
    ref = store.load_ledger("r").operations["charge:1"].payload_ref
    assert _execute(store_url, "DELETE FROM safepoint_artifacts WHERE digest = %s", ref) == 1
    with pytest.raises(ArtifactMissing):
        sp.resume(store, "r")
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record is not None
    assert run.recovery_record["phase"] == "unreadable_record"
    assert run.recovery_record["evidence"]["type"] == "ArtifactMissing"
    assert calls == {"look": 1}  # blocked at load: nothing replayed or called again
    assert _counted(owner_env) == (0, 0)


def test_an_unreadable_record_blocks(store: sp.Store, store_url: str, crash_at: Any) -> None:
    @sp.workflow("unreadable")
    def flow(run: sp.Run) -> Any:
        return run.pure("one", lambda: 1)

    _stop_at(store, flow, crash_at, "run.before_complete")
    _execute(store_url, "UPDATE safepoint_steps SET result = %s WHERE step_id = %s", "{not json", "one")
    with pytest.raises(CorruptRecord):
        sp.resume(store, "r")
    assert store.get_run("r").recovery_record["phase"] == "unreadable_record"


def test_a_changed_workflow_version_blocks(store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("versioned", version="1")
    def old(run: sp.Run) -> Any:
        return run.pure("one", lambda: 1)

    _stop_at(store, old, crash_at, "run.before_complete")

    @sp.workflow("versioned", version="2")
    def new(run: sp.Run) -> Any:
        return run.pure("one", lambda: 1)

    with pytest.raises(IncompatibleWorkflow, match="version '1' became '2'"):
        sp.resume(store, "r")
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record["phase"] == "incompatible_workflow"


# -- the remaining rows of DESIGN §3 --------------------------------------------------------------


def test_row_pure_step_incomplete_is_recomputed(store: sp.Store, crash_at: Any) -> None:
    calls: Counter[str] = Counter()

    @sp.workflow("pure-row")
    def flow(run: sp.Run) -> int:
        return int(run.pure("double", lambda x: calls.update(["double"]) or x * 2, 21))

    _stop_at(store, flow, crash_at, "step.before_record")
    assert "double" not in store.load_ledger("r").steps
    assert sp.resume(store, "r") == 42
    assert calls == {"double": 2}  # computed again from its retained inputs


def test_row_uncertain_without_a_read_path_blocks(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    flow = _charge("no-read-path", owner_effect("notifications", reconcile=False, dedup_retention=None))
    _stop_at(store, flow, crash_at, "effect.after_dispatching", 5)
    with pytest.raises(sp.NeedsReconciliation) as blocked:
        sp.resume(store, "r")
    assert blocked.value.record["effect_status"] == "dispatching"
    assert _counted(owner_env) == (0, 0)  # never sent: it might have been


def test_row_accepted_replays_the_receipt(store: sp.Store, owner_env: OwnerService, crash_at: Any) -> None:
    flow = _charge("accepted-row", owner_effect("charges"))
    _stop_at(store, flow, crash_at, "effect.after_accept", 5)
    assert sp.resume(store, "r") == {"id": "ch_1", "amount": 5}
    assert store.load_ledger("r").operations["charge:1"].dispatch_count == 1
    assert _counted(owner_env) == (1, 0)
