"""Bounded history and continue-as-new: a run counts what it appends, warns at its soft limit,
records nothing new at its hard limit, and carries on in a successor that holds none of its
history but still finds its chain's effects by operation id."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._rules.effects import mint_effect_key
from safepoint.errors import (
    BudgetExhausted,
    EffectRejected,
    HistoryLimitReached,
    HistoryWarning,
    RunNotFound,
    SecretRefused,
    StaleCheckpoint,
)
from safepoint.ops.cli import cli
from safepoint.storage.base import NewRun
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect, run_child
from safepoint.types import EffectState, RunRecord, RunStatus

TESTS = str(Path(__file__).parents[1])


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _chain(store: sp.Store, run_id: str) -> list[RunRecord]:
    """A run and every run that continued it, in order."""
    runs = [store.get_run(run_id)]
    while runs[-1].successor_run_id is not None:
        runs.append(store.get_run(runs[-1].successor_run_id))
    return runs


def _add(a: int, b: int) -> int:
    return a + b


# -- counting and limits ---------------------------------------------------------------------------


def test_a_run_past_its_soft_limit_warns_once_and_records_it(store: sp.Store) -> None:
    @sp.workflow(_name("soft"), history_limit=sp.HistoryLimit(soft=4, hard=None))
    def flow(run: sp.Run) -> int:
        total = 0
        for index in range(8):
            total = run.read("add", _add, total, index)
        return total

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sp.start(store, flow, run_id="r") == 28
    history = [w for w in caught if issubclass(w.category, HistoryWarning)]
    assert len(history) == 1
    assert "'r'" in str(history[0].message)
    assert "continue_as_new" in str(history[0].message)
    events = store.events("r")
    [warning] = [e for e in events if e.kind == "run.history_warning"]
    assert warning.detail == {"history": 5, "soft": 4, "hard": None}  # 1 event + 3 steps, +1
    run = store.get_run("r")
    assert run.history_warned_at is not None
    assert (run.event_count, run.step_count) == (len(events), 8)


def test_a_run_at_its_hard_limit_blocks_to_be_continued_as_new(store: sp.Store) -> None:
    import jsonschema

    from safepoint import record_schema

    called: list[int] = []

    def step(index: int) -> int:
        called.append(index)
        return index

    @sp.workflow(_name("hard"), history_limit=(None, 6))
    def flow(run: sp.Run) -> str:
        for index in range(10):
            run.read(f"s{index}", step, index)
        return "never"

    with pytest.raises(HistoryLimitReached) as blocked:
        sp.start(store, flow, run_id="r")
    assert (blocked.value.size, blocked.value.limit) == (6, 6)  # run.started + 5 steps
    record = blocked.value.record
    assert record is not None
    assert record["phase"] == "history_limit"
    assert record["step_id"] == "s5"
    assert record["evidence"] == {"history": 6, "hard_limit": 6}
    assert any("continue_as_new" in action for action in record["next_actions"])
    jsonschema.validate(store.get_run("r").recovery_record, record_schema())
    run = store.get_run("r")
    assert (run.status, run.recovery_record) == (
        RunStatus.BLOCKED,
        {**record, "state_revision": run.state_revision},
    )
    assert sorted(store.load_ledger("r").steps) == [f"s{i}" for i in range(5)]  # s5 refused
    # A resume replays to the limit and blocks again: nothing new ever slips in.
    with pytest.raises(HistoryLimitReached):
        sp.resume(store, "r")
    assert sorted(store.load_ledger("r").steps) == [f"s{i}" for i in range(5)]
    assert called == [0, 1, 2, 3, 4, 5, 5]  # s5 computed twice, recorded never


def test_an_effect_in_flight_at_the_hard_limit_is_still_settled(
    store: sp.Store, owner_env: OwnerService
) -> None:
    charges = owner_effect("charges")

    @sp.workflow(_name("in-flight"), history_limit=(None, 3))
    def flow(run: sp.Run) -> Any:
        run.read("a", _add, 1, 2)  # history 2
        receipt = run.effect("charge", charges, payload={"amount": 5})  # prepared: 3
        run.read("b", _add, 3, 4)  # refused: the limit was reached by the prepare
        return receipt

    with pytest.raises(HistoryLimitReached):
        sp.start(store, flow, run_id="r")
    ledger = store.load_ledger("r")
    op = ledger.operations["charge"]
    # the dispatch and its outcome went past the limit: what happened is always recorded
    assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 1)
    assert "charge" in ledger.steps
    assert "b" not in ledger.steps
    assert ledger.run.history_size > 3
    assert owner_env.client.stats()["applied"] == 1


def test_an_effect_refused_at_the_hard_limit_blocks_with_nothing_prepared_or_sent(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """The effect's owner can reconcile it: prepared and dispatching are one commit, refused
    whole at the limit — and the run blocks (a dispatch it had entered would make the block
    wait for it forever)."""
    charges = owner_effect("charges")

    @sp.workflow(_name("refused-effect"), history_limit=(None, 2))
    def flow(run: sp.Run) -> Any:
        run.read("a", _add, 1, 2)  # history 2
        return run.effect("charge", charges, payload={"amount": 5})

    with pytest.raises(HistoryLimitReached) as blocked:
        sp.start(store, flow, run_id="r")
    assert blocked.value.record is not None
    assert (blocked.value.record["phase"], blocked.value.record["step_id"]) == ("history_limit", "charge")
    assert store.get_run("r").status is RunStatus.BLOCKED
    assert store.load_ledger("r").operations == {}
    assert owner_env.client.stats()["applied"] == 0


def test_history_limits_are_checked_where_they_are_declared() -> None:
    with pytest.raises(sp.UsageError, match="must not exceed"):
        sp.HistoryLimit(soft=50, hard=10)
    with pytest.raises(sp.UsageError, match="1 or more"):
        sp.HistoryLimit(soft=0)
    with pytest.raises(sp.UsageError):
        sp.workflow("bad-limit", history_limit=(True, 10))  # type: ignore[arg-type]
    wf = sp.workflow(_name("limits"), history_limit=(5, None))(lambda run: 1)
    assert wf.history_limit == sp.HistoryLimit(soft=5, hard=None)
    assert sp.workflow(_name("default"))(lambda run: 1).history_limit == sp.HistoryLimit(
        soft=10_000, hard=50_000
    )


# -- continue as new --------------------------------------------------------------------------------


def _loop(name: str, **options: Any) -> sp.Workflow:
    @sp.workflow(name, **options)
    def loop(run: sp.Run, start: int, total: int, count: int, every: int) -> dict[str, int]:
        for index in range(start, count):
            total = run.read("add", _add, total, index)
            if (index + 1) % every == 0 and index + 1 < count:
                run.continue_as_new(index + 1, total, count, every=every)
        _, tilde, place = run.run_id.rpartition("~")
        return {"total": total, "runs": int(place) + 1 if tilde else 1}

    return loop


def test_continue_as_new_carries_its_state_and_start_returns_the_chain_result(store: sp.Store) -> None:
    loop = _loop(_name("loop"))
    assert sp.start(store, loop, 0, 0, 10, 4, run_id="r") == {"total": 45, "runs": 3}
    runs = _chain(store, "r")
    assert [r.run_id for r in runs] == ["r", "r~1", "r~2"]
    assert [r.status for r in runs] == [RunStatus.CONTINUED, RunStatus.CONTINUED, RunStatus.COMPLETED]
    assert [r.parent_run_id for r in runs] == [None, "r", "r~1"]
    assert [(r.chain_id, r.chain_index) for r in runs] == [("r", 0), ("r", 1), ("r", 2)]
    assert runs[1].inputs == {"args": [4, 6, 10], "kwargs": {"every": 4}}
    assert [r.resume_count for r in runs] == [0, 0, 0]
    assert (runs[1].workflow, runs[1].workflow_version) == (runs[0].workflow, runs[0].workflow_version)
    assert [e.kind for e in store.events("r")] == ["run.started", "run.continued"]
    # every way back to the chain gives its result, from the ledger
    assert sp.resume(store, "r") == sp.resume(store, "r~1") == {"total": 45, "runs": 3}
    assert sp.start(store, loop, 0, 0, 10, 4, run_id="r") == {"total": 45, "runs": 3}
    assert [r.status for r in _chain(store, "r")] == [r.status for r in runs]


def test_a_successor_holds_none_of_its_parents_history(store_url: str, store: sp.Store) -> None:
    loop = _loop(_name("no-copy"))
    sp.start(store, loop, 0, 0, 9, 3, run_id="r")
    runs = _chain(store, "r")
    assert len(runs) == 3
    for run in runs:
        ledger = store.load_ledger(run.run_id)
        assert sorted(ledger.steps) == ["add", "add#2", "add#3"]  # its own three, no more
        assert {s.run_id for s in ledger.steps.values()} == {run.run_id}
        events = store.events(run.run_id)
        assert events[0].kind == "run.started"
        assert (run.event_count, run.step_count) == (len(events), 3)
        # counted in the tables themselves: each run's rows are its own
        assert _rows(store_url, "safepoint_steps", run.run_id) == 3
        assert _rows(store_url, "safepoint_events", run.run_id) == len(events) == 2
    assert _rows(store_url, "safepoint_steps", None) == 9


def _rows(store_url: str, table: str, run_id: str | None) -> int:
    """Rows of ``table`` (of one run, or all), counted in the database itself."""
    where = "" if run_id is None else " WHERE run_id = %s"
    if store_url.startswith("sqlite:///"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            count = conn.execute(
                f"SELECT count(*) FROM {table}{where.replace('%s', '?')}", () if run_id is None else (run_id,)
            ).fetchone()[0]
        finally:
            conn.close()
        return int(count)
    import psycopg
    from psycopg import sql

    base, _, schema = store_url.partition("?schema=")
    with psycopg.connect(base) as conn:
        query = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(schema), sql.Identifier(table)
        ) + sql.SQL(where)
        row = conn.execute(query, () if run_id is None else (run_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_an_effect_accepted_before_continuing_is_not_sent_again(
    store: sp.Store, owner_env: OwnerService
) -> None:
    owned = owner_effect("charges")
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        return owned.execute(payload, key)

    charges = sp.Effect(
        "charges", execute=execute, reconcile=owned.reconcile, dedup_retention=owned.dedup_retention
    )

    @sp.workflow(_name("inherit"))
    def flow(run: sp.Run, generation: int) -> Any:
        # every run of the chain asks for the same charge: only the first sends it
        receipt = run.effect(
            "charge", charges, payload={"case": "c-1", "amount": 5}, operation_id="charge:c-1"
        )
        if generation < 2:
            run.continue_as_new(generation + 1)
        return {"receipt": receipt["id"], "generation": generation}

    assert sp.start(store, flow, 0, run_id="r") == {"receipt": "ch_1", "generation": 2}
    # one dispatch, the chain's key
    assert keys == [mint_effect_key(store.identity.ledger_id, "r", "charge:c-1")]
    assert owner_env.client.stats()["applied"] == 1
    assert owner_env.client.stats()["duplicates"] == 0
    runs = _chain(store, "r")
    assert len(runs) == 3
    # the successors hold no operation rows: the receipt was found where it is
    assert [len(store.load_ledger(r.run_id).operations) for r in runs] == [1, 0, 0]
    assert sp.resume(store, "r~2") == {"receipt": "ch_1", "generation": 2}


def test_a_rejection_before_continuing_is_raised_again_after(memory_store: sp.Store) -> None:
    sent: list[Any] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        sent.append(payload)
        raise sp.Rejected({"status": 402, "reason": "card declined"})

    declined = sp.Effect("charge", execute=execute)

    @sp.workflow(_name("rejected"))
    def flow(run: sp.Run, generation: int) -> Any:
        try:
            run.effect("charge", declined, payload={"amount": 5}, operation_id="charge:1")
        except EffectRejected as exc:
            if generation == 0:
                run.continue_as_new(1)
            return {"rejected": exc.evidence, "generation": generation}
        return "charged"

    assert sp.start(memory_store, flow, 0, run_id="r") == {
        "rejected": {"status": 402, "reason": "card declined"},
        "generation": 1,
    }
    assert len(sent) == 1


def test_a_changed_payload_under_an_inherited_operation_id_blocks(memory_store: sp.Store) -> None:
    sent: list[Any] = []
    effect = sp.Effect("charge", execute=lambda payload, key: sent.append(payload) or {"id": 1})

    @sp.workflow(_name("changed"))
    def flow(run: sp.Run, amount: int) -> Any:
        receipt = run.effect("charge", effect, payload={"amount": amount}, operation_id="charge:1")
        if amount == 5:
            run.continue_as_new(7)  # the same operation id, now with another payload
        return receipt

    with pytest.raises(StaleCheckpoint) as blocked:
        sp.start(memory_store, flow, 5, run_id="r")
    assert sent == [{"amount": 5}]  # never sent again, changed or not
    record = blocked.value.record
    assert record is not None
    assert (record["task_id"], record["phase"], record["operation_id"]) == (
        "r~1",
        "stale_checkpoint",
        "charge:1",
    )
    assert record["evidence"]["settled_by"] == "r"
    assert record["effect_key"] == mint_effect_key(memory_store.identity.ledger_id, "r", "charge:1")
    assert memory_store.get_run("r~1").status is RunStatus.BLOCKED


def test_an_operation_id_keeps_its_key_across_the_chain(memory_store: sp.Store) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        if len(keys) <= 1:
            raise sp.NotSent("connection refused")
        return {"id": "ch_1"}

    effect = sp.Effect("charge", execute=execute, max_dispatches=1)

    @sp.workflow(_name("same-key"))
    def flow(run: sp.Run, generation: int) -> Any:
        try:
            return run.effect("charge", effect, payload={"amount": 5}, operation_id="charge:1")
        except sp.NotSent:  # provably never sent: the successor tries again
            run.continue_as_new(generation + 1)

    assert sp.start(memory_store, flow, 0, run_id="r") == {"id": "ch_1"}
    # never minted afresh
    assert keys == [mint_effect_key(memory_store.identity.ledger_id, "r", "charge:1")] * 2
    assert memory_store.load_ledger("r").operations["charge:1"].state is EffectState.PREPARED
    op = memory_store.load_ledger("r~1").operations["charge:1"]
    assert (op.state, op.effect_key) == (EffectState.ACCEPTED, keys[0])


def test_a_step_id_used_as_operation_id_names_an_operation_of_its_run_only(memory_store: sp.Store) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        return {"line": payload["line"]}

    effect = sp.Effect("line", execute=execute)

    @sp.workflow(_name("default-op"))
    def flow(run: sp.Run, start: int) -> list[int]:
        lines = [run.effect("line", effect, payload={"line": start})["line"]]
        if start < 2:
            run.continue_as_new(start + 1)
        return lines

    assert sp.start(memory_store, flow, 0, run_id="r") == [2]
    # each run's "line" is an operation of its own, with a key of its own
    assert keys == [
        mint_effect_key(memory_store.identity.ledger_id, run_id, "line") for run_id in ("r", "r~1", "r~2")
    ]


def test_a_run_with_an_uncertain_effect_cannot_continue_as_new(memory_store: sp.Store) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("no answer")  # may have happened

    effect = sp.Effect("notify", execute=execute)  # nothing to reconcile with

    @sp.workflow(_name("uncertain"))
    def flow(run: sp.Run) -> Any:
        try:  # noqa: SIM105 - written the way careless agent code is
            run.effect("notify", effect, payload={"to": "ops"})
        except sp.NeedsReconciliation:
            pass  # carries on regardless
        run.continue_as_new()

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    run = memory_store.get_run("r")
    assert (run.status, run.successor_run_id) == (RunStatus.BLOCKED, None)
    with pytest.raises(RunNotFound):
        memory_store.get_run("r~1")


def test_a_run_asked_to_cancel_cannot_continue_as_new(store: sp.Store) -> None:
    def operator_cancels() -> str:
        sp.cancel(store, "r", by="ops", reason="withdrawn")
        return "drafted"

    @sp.workflow(_name("cancel-continue"))
    def flow(run: sp.Run) -> Any:
        run.read("draft", operator_cancels)
        run.continue_as_new("escape")

    with pytest.raises(sp.RunCancelled):
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert (run.status, run.successor_run_id) == (RunStatus.CANCELLED, None)
    with pytest.raises(RunNotFound):
        store.get_run("r~1")


def test_a_successor_id_taken_by_another_run_blocks_the_continue(memory_store: sp.Store) -> None:
    squatter = sp.workflow(_name("squatter"))(lambda run: "other")
    sp.submit(memory_store, squatter, run_id="r~1")
    loop = _loop(_name("taken"))
    with pytest.raises(sp.RunBlocked) as blocked:
        sp.start(memory_store, loop, 0, 0, 4, 2, run_id="r")
    assert blocked.value.record is not None
    assert blocked.value.record["phase"] == "continue_as_new"
    run = memory_store.get_run("r")
    assert (run.status, run.successor_run_id) == (RunStatus.BLOCKED, None)
    assert memory_store.get_run("r~1").workflow == squatter.name  # left as it was


def test_cancelling_a_continued_run_stops_its_chain(store: sp.Store) -> None:
    loop = _loop(_name("cancel-chain"))
    sp.submit(store, loop, 0, 0, 4, 2, run_id="r")
    claim = store.claim_next("w", 60_000, [loop.name])
    assert claim is not None
    store.continue_as_new(
        claim,
        NewRun(  # by hand: a successor left for any worker
            run_id="r~1",
            workflow=loop.name,
            workflow_version=loop.version,
            input_hash="h",
            inputs={"args": [2, 1, 4, 2], "kwargs": {}},
            owner=None,
            lease_ms=0,
        ),
    )
    assert store.get_run("r~1").status is RunStatus.PENDING
    stopped = sp.cancel(store, "r", by="ops")
    assert (stopped.run_id, stopped.status) == ("r~1", RunStatus.CANCELLED)
    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r")


def test_agent_code_cannot_swallow_continue_as_new(memory_store: sp.Store) -> None:
    @sp.workflow(_name("swallow"))
    def flow(run: sp.Run, generation: int) -> Any:
        if generation == 0:
            try:  # noqa: SIM105 - written the way careless agent code is
                run.continue_as_new(1)
            except BaseException:
                pass
            return "escaped"
        return f"generation {generation}"

    assert sp.start(memory_store, flow, 0, run_id="r") == "generation 1"
    assert memory_store.get_run("r").status is RunStatus.CONTINUED


def test_the_carried_state_is_json_and_never_a_credential(memory_store: sp.Store) -> None:
    @sp.workflow(_name("bad-state"))
    def flow(run: sp.Run, state: str) -> Any:
        run.continue_as_new(state, api_key="sk-ant-" + "x" * 30)

    with pytest.raises(SecretRefused):
        sp.start(memory_store, flow, "s", run_id="r")
    run = memory_store.get_run("r")
    assert (run.status, run.successor_run_id) == (RunStatus.FAILED, None)


def test_an_async_workflow_awaits_continue_as_new(store: sp.Store) -> None:
    @sp.workflow(_name("async-loop"))
    async def loop(run: sp.AsyncRun, start: int, total: int) -> int:
        for index in range(start, 6):
            total = await run.read("add", _add, total, index)
            if index in (1, 3):
                await run.continue_as_new(index + 1, total)
        return total

    assert asyncio.run(sp.start_async(store, loop, 0, 0, run_id="r")) == 15
    assert [r.status for r in _chain(store, "r")] == [
        RunStatus.CONTINUED,
        RunStatus.CONTINUED,
        RunStatus.COMPLETED,
    ]
    assert asyncio.run(sp.resume_async(store, "r")) == 15


def test_a_run_stopped_at_its_limit_continues_once_its_code_does(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """The recovery record's advice, followed: the same workflow version, now continuing as new
    every few lines, resumes the blocked run; it continues from an earlier point, and the
    effects already made are found by operation id, never made again."""
    charges = owner_effect("charges")
    name = _name("rescue")

    def define(every: int | None) -> sp.Workflow:
        @sp.workflow(name, history_limit=(None, 16))
        def lines(run: sp.Run, start: int, count: int, ids: list[str]) -> list[str]:
            for index in range(start, count):
                receipt = run.effect("line", charges, payload={"line": index}, operation_id=f"line:{index}")
                ids = [*ids, receipt["id"]]
                if every and (index + 1) % every == 0 and index + 1 < count:
                    run.continue_as_new(index + 1, count, ids)
            return ids

        return lines

    with pytest.raises(HistoryLimitReached):
        sp.start(store, define(None), 0, 8, [], run_id="r")
    made = owner_env.client.stats()["applied"]
    assert 2 <= made < 8
    define(every=2)  # deployed under the same version
    assert sp.resume(store, "r") == [f"ch_{n}" for n in range(1, 9)]
    assert owner_env.client.stats()["applied"] == 8
    assert owner_env.client.stats()["duplicates"] == 0
    assert store.get_run("r").status is RunStatus.CONTINUED


def test_the_async_store_continues_as_new(pg_url: str) -> None:
    @sp.workflow(_name("async-store-loop"))
    async def loop(run: sp.AsyncRun, start: int, total: int) -> int:
        for index in range(start, 4):
            total = await run.read("add", _add, total, index)
            if index == 1:
                await run.continue_as_new(index + 1, total)
        return total

    async def main() -> tuple[Any, list[RunRecord]]:
        store = await sp.open_async_store(f"{pg_url}?schema=h_{uuid.uuid4().hex[:12]}")
        try:
            result = await sp.start_async(store, loop, 0, 0, run_id="r")
            again = await sp.resume_async(store, "r")
            assert again == result
            return result, [await store.get_run("r"), await store.get_run("r~1")]
        finally:
            await store.close()

    result, runs = asyncio.run(main())
    assert result == 6
    assert [r.status for r in runs] == [RunStatus.CONTINUED, RunStatus.COMPLETED]
    assert runs[1].parent_run_id == "r"


def test_a_long_loop_continuing_every_n_steps_stays_under_its_limit(store: sp.Store) -> None:
    loop = _loop(_name("long"), history_limit=(30, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HistoryWarning)  # not even the soft limit
        assert sp.start(store, loop, 0, 0, 300, 25, run_id="r") == {"total": 44850, "runs": 12}
    runs = _chain(store, "r")
    assert len(runs) == 12
    assert max(r.history_size for r in runs) < 30
    # past its limit, the same loop without continuing would have stopped
    with pytest.raises(HistoryLimitReached), pytest.warns(HistoryWarning):
        sp.start(store, loop, 0, 0, 300, 1000, run_id="r-once")


def test_a_worker_takes_up_a_successor_whose_worker_died(file_store: sp.Store, crash_at: Any) -> None:
    loop = _loop(_name("worker-chain"))
    crash_at("run.after_continue")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, loop, 0, 0, 6, 2, run_id="r", lease_ms=50)
    crash_at(None)
    runs = _chain(file_store, "r")
    assert [(r.status, r.owner is not None) for r in runs] == [
        (RunStatus.CONTINUED, False),
        (RunStatus.RUNNING, True),
    ]  # claimed, then died
    time.sleep(0.1)  # its lease runs out
    stats = sp.Worker(file_store, workflows=[loop.name]).run(until_idle=True, handle_signals=False)
    assert (stats.claimed, stats.completed) == (1, 1)
    assert sp.resume(file_store, "r") == {"total": 15, "runs": 3}
    assert [r.run_id for r in _chain(file_store, "r")] == ["r", "r~1", "r~2"]


# -- real processes killed around continue_as_new ---------------------------------------------------

CHAIN_ARGS = [0, 6, 2, []]  # six lines, continuing as new every two: three runs


@pytest.mark.kill
@pytest.mark.parametrize(
    "crash_at",
    [
        "run.before_continue",
        "run.after_continue",
        "run.after_continue@2",
        "effect.after_receiver_commit@3",
        "effect.after_dispatching@4",
    ],
)
def test_a_kill_around_continue_as_new_leaves_one_successor(
    store_url: str, owner_env: OwnerService, crash_at: str
) -> None:
    reference_url = (
        f"sqlite:///{Path(store_url.removeprefix('sqlite:///')).parent}/ref.db"
        if store_url.startswith("sqlite")
        else store_url
    )
    reference = run_child(
        "flows:chain",
        store_url=reference_url,
        run_id="reference",
        args=CHAIN_ARGS,
        owner_url=owner_env.url,
        pythonpath=[TESTS],
    )
    assert reference.outcome == {
        "status": "completed",
        "result": ["ch_1", "ch_2", "ch_3", "ch_4", "ch_5", "ch_6"],
    }
    owner_env.client.reset()
    killed = run_child(
        "flows:chain",
        store_url=store_url,
        run_id="r",
        args=CHAIN_ARGS,
        crash_at=crash_at,
        owner_url=owner_env.url,
        pythonpath=[TESTS],
    )
    assert killed.killed, killed.stderr[-2000:]
    resumed = run_child(
        "flows:chain",
        store_url=store_url,
        run_id="r",
        resume=True,
        owner_url=owner_env.url,
        pythonpath=[TESTS],
    )
    assert resumed.outcome == reference.outcome, resumed.stderr[-2000:]
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (6, 0)
    store = sp.open_store(store_url)
    try:
        runs = _chain(store, "r")
        assert [r.run_id for r in runs] == ["r", "r~1", "r~2"]
        assert [r.status for r in runs] == [RunStatus.CONTINUED] * 2 + [RunStatus.COMPLETED]
        chained = [r for r in store.list_runs(limit=100) if r.chain_id == "r"]
        assert sorted(r.run_id for r in chained) == ["r", "r~1", "r~2"]  # no second successor
    finally:
        store.close()


# -- the command line ---------------------------------------------------------------------------------


def test_show_and_runs_tell_the_history_and_the_chain(file_store: sp.Store) -> None:
    loop = _loop(_name("cli-chain"), history_limit=(3, 100))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HistoryWarning)
        sp.start(file_store, loop, 0, 0, 4, 2, run_id="r")
    runner = CliRunner()
    shown = runner.invoke(cli, ["--store", file_store.url, "show", "r~1"])
    assert shown.exit_code == 0, shown.output
    assert "continues" in shown.output
    assert "r (run 2 of chain r)" in shown.output
    assert "limits: soft 3, hard 100" in shown.output
    assert "past the soft limit" in shown.output
    parent = runner.invoke(cli, ["--store", file_store.url, "show", "r"])
    assert "continued as" in parent.output
    assert "r~1" in parent.output
    assert "run.continued" in parent.output
    listed = runner.invoke(cli, ["--store", file_store.url, "runs"])
    assert listed.exit_code == 0, listed.output
    line = next(row for row in listed.output.splitlines() if row.startswith("r "))
    assert "continued" in line
    assert "→ r~1" in line
    only = runner.invoke(cli, ["--store", file_store.url, "runs", "--status", "continued"])
    assert only.exit_code == 0, only.output
    assert "r~1" not in [row.split()[0] for row in only.output.splitlines()[1:]]


def test_continuing_as_new_keeps_the_deadline_and_what_is_left_of_the_budgets(store: sp.Store) -> None:
    """A chain is one task: a successor cannot outlive its parent's deadline or get a fresh
    budget by continuing."""

    def model(**_: Any) -> dict[str, Any]:
        return {"text": "ok", "usage": {"input_tokens": 30, "output_tokens": 10}}

    @sp.workflow(_name("budgeted"), budget=sp.Budget(tokens=100), deadline=timedelta(hours=1))
    def flow(run: sp.Run, round_: int) -> int:
        run.model("draft", model, model="m-1", messages=[{"role": "user", "content": "x"}])
        if round_ == 0:
            run.continue_as_new(1)
        return round_

    assert sp.start(store, flow, 0, run_id="r") == 1
    first, second = _chain(store, "r")
    assert (first.tokens_spent, second.tokens_spent) == (40, 40)
    assert second.token_budget == 60  # what the first run left
    assert second.deadline_at == first.deadline_at is not None
    with pytest.raises(BudgetExhausted):  # the first round spent it all: none is left
        sp.start(store, flow, 0, run_id="r2", budget=sp.Budget(tokens=40))
    assert [run.token_budget for run in _chain(store, "r2")] == [40, 0]
