"""Forking a run from one of its steps, end to end on every store with the effect owner on
loopback: the fork replays the prefix it copied (nothing before its step is asked again), runs
only the tail, and sends none of the source's effects — unless the operator names one, which
then goes out once, under the fork's own key."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import safepoint as sp
from safepoint._rules.effects import mint_effect_key
from safepoint.errors import (
    EffectRejected,
    ForkRefused,
    IncompatibleWorkflow,
    RunConflict,
    SentBySource,
)
from safepoint.testing import OwnerService, owner_effect
from safepoint.types import EffectState, RunStatus

EFFECTS = 5


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Calls:
    """The reads and model calls a workflow made, by step: what a fork must not make again."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def look_up(self, case: str, index: int) -> dict[str, Any]:
        self.made.append(f"read.{index}")
        return {"case": case, "index": index}

    def draft(self, *, model: str, messages: Any, tools: Any = None) -> dict[str, Any]:
        index = messages[-1]["index"]
        self.made.append(f"draft.{index}")
        return {"text": f"reply {index} by {model}", "usage": {"total_tokens": 10}}


def _support(
    name: str,
    calls: Calls,
    *,
    version: str = "v1",
    models: list[str] | None = None,
    priority: Callable[[int], str | None] = lambda index: None,
) -> sp.Workflow:
    """Five rounds of read, model, effect (a ticket at the owner); ``priority`` adds a field
    to a ticket's payload (changed code)."""
    tickets = owner_effect("tickets")

    @sp.workflow(name, version=version, models=models or ["m-1"])
    def support(run: sp.Run, case: str) -> list[str]:
        made = []
        for index in range(EFFECTS):
            seen = run.read(f"read.{index}", calls.look_up, case, index)
            reply = run.model(
                f"draft.{index}", calls.draft, model="m-1", messages=[{"role": "user", "index": index}]
            )
            payload: dict[str, Any] = {"case": case, "index": seen["index"], "text": reply["text"]}
            if (level := priority(index)) is not None:
                payload["priority"] = level
            made.append(run.effect(f"ticket.{index}", tickets, payload=payload)["id"])
        return made

    return support


def _tail(start: int) -> list[str]:
    return [f"{kind}.{i}" for i in range(start, EFFECTS) for kind in ("read", "draft")]


def _stats(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return stats["applied"], stats["duplicates"]


def _source(store: sp.Store, name: str, **code: Any) -> tuple[Calls, list[str]]:
    """A run "source" of ``_support`` (under ``name``) done, and what it called, to count on."""
    calls = Calls()
    made: list[str] = sp.start(store, _support(name, calls, **code), name, run_id="source")
    calls.made.clear()
    return calls, made


def test_a_fork_from_the_middle_runs_only_the_tail_and_sends_none_of_the_sources_effects(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls, made = _source(store, _name("fork-middle"))
    assert _stats(owner_env) == (EFFECTS, 0)

    fork = sp.fork(store, "source", from_step="read.3", by="ana", reason="the reply went wrong")
    assert (fork.status, fork.forked_from) == (RunStatus.PENDING, {"run_id": "source", "step_id": "read.3"})
    assert (fork.step_count, fork.tokens_spent, fork.model_calls_spent) == (9, 30, 3)
    assert fork.run_id.startswith("source-fork-")
    assert sp.resume(store, fork.run_id) == made  # the source's receipts: nothing sent again
    assert calls.made == _tail(3)  # nothing before read.3 was read or asked again
    assert _stats(owner_env) == (EFFECTS, 0)

    ledger = store.load_ledger(fork.run_id)
    source = store.load_ledger("source")
    assert ledger.run.status is RunStatus.COMPLETED
    # the prefix's operations are copies (the source's keys: settled, never sent again); the
    # tail's effect steps took the source's outcomes and hold no operation of their own
    assert sorted(ledger.operations) == ["ticket.0", "ticket.1", "ticket.2"]
    for op_id, op in ledger.operations.items():
        assert (op.effect_key, op.state, op.receipt) == (
            source.operations[op_id].effect_key,
            EffectState.ACCEPTED,
            source.operations[op_id].receipt,
        )
    assert [ledger.steps[f"ticket.{i}"].result["id"] for i in range(EFFECTS)] == made
    kinds = [e.kind for e in store.events("source")]
    assert kinds[-1] == "run.fork_made"
    assert store.events(fork.run_id)[0].kind == "run.forked"

    calls.made.clear()  # the fork replays whole, as any run
    assert sp.resume(store, fork.run_id) == made
    assert calls.made == []


def test_an_operation_named_in_resend_is_sent_once_under_the_forks_own_key(
    store: sp.Store, owner_env: OwnerService
) -> None:
    _, made = _source(store, _name("fork-resend"))
    fork = sp.fork(store, "source", from_step="read.3", new_run_id="retake", resend=["ticket.4"], by="ana")
    assert fork.forked_from == {
        "run_id": "source",
        "step_id": "read.3",
        "resend": ["ticket.4"],
        "resent_by": {"ticket.4": "retake"},
    }
    again = sp.resume(store, "retake")
    assert again[:4] == made[:4]  # ticket.3 is the source's
    assert again[4] != made[4]  # ticket.4 is a new object at the owner
    applied, duplicates = _stats(owner_env)
    assert (applied, duplicates) == (EFFECTS + 1, 1)  # the same payload, asked for twice
    ledger_id = store.identity.ledger_id
    fork_key = mint_effect_key(ledger_id, "retake", "ticket.4")
    source_key = store.load_ledger("source").operations["ticket.4"].effect_key
    assert source_key == mint_effect_key(ledger_id, "source", "ticket.4") != fork_key
    op = store.load_ledger("retake").operations["ticket.4"]
    assert (op.effect_key, op.state, op.dispatch_count) == (fork_key, EffectState.ACCEPTED, 1)
    assert [obj["id"] for obj in owner_env.client.find_all_by_key("tickets", fork_key)] == [again[4]]
    assert [obj["id"] for obj in owner_env.client.find_all_by_key("tickets", source_key)] == [made[4]]
    sp.resume(store, "retake")
    assert _stats(owner_env) == (EFFECTS + 1, 1)  # once


def test_another_payload_blocks_the_fork_unless_the_operator_names_it(
    store: sp.Store, owner_env: OwnerService
) -> None:
    name = _name("fork-payload")
    calls = Calls()
    sp.start(store, _support(name, calls), "case-3", run_id="source")
    urgent = _support(name, calls, version="v2", priority=lambda index: "high" if index == 4 else None)
    fork = sp.fork(store, "source", from_step="read.3", workflow=urgent, by="ana")
    with pytest.raises(SentBySource) as blocked:
        sp.resume(store, fork.run_id)
    assert (blocked.value.operation_id, blocked.value.source_run_id) == ("ticket.4", "source")
    assert "resend" in blocked.value.message
    run = store.get_run(fork.run_id)
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record is not None
    assert (run.recovery_record["phase"], run.recovery_record["operation_id"]) == (
        "forked_effect",
        "ticket.4",
    )
    assert _stats(owner_env) == (EFFECTS, 0)
    assert "ticket.4" not in store.load_ledger(fork.run_id).operations

    named = sp.fork(store, "source", from_step="read.3", workflow=urgent, resend=["ticket.4"], by="ana")
    made = sp.resume(store, named.run_id)
    assert _stats(owner_env) == (EFFECTS + 1, 0)  # another ticket, not a duplicate
    assert owner_env.client.get("tickets", made[4])["priority"] == "high"


def test_a_fork_on_the_current_code_is_run_by_a_worker_of_that_code(
    store: sp.Store, owner_env: OwnerService
) -> None:
    name = _name("fork-code")
    calls = Calls()
    old = _support(name, calls)
    made = sp.start(store, old, "case-4", run_id="source")
    new = _support(name, calls, version="v2", models=["m-2"])  # deployed: the old code is gone
    stale = sp.fork(store, "source", from_step="read.2", by="ana")  # under the source's code
    with pytest.raises(IncompatibleWorkflow):
        sp.resume(store, stale.run_id)
    calls.made.clear()
    current = sp.fork(store, "source", from_step="read.2", workflow=new, by="ana", reason="deployed v2")
    assert (current.workflow_version, current.workflow_fingerprint) == ("v2", new.fingerprint)
    assert store.events(current.run_id)[0].detail["current_code"] is True
    stats = sp.Worker(store, workflows=[f"{name}@v2"]).run(until_idle=True, handle_signals=False)
    assert (stats.claimed, stats.completed) == (1, 1)  # the stale fork is blocked: not claimed
    assert store.get_run(current.run_id).result == made
    assert calls.made == _tail(2)
    assert _stats(owner_env) == (EFFECTS, 0)


def test_a_fork_of_a_fork_sends_none_of_its_ancestors_effects(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls, made = _source(store, _name("fork-of-fork"))
    sp.fork(store, "source", from_step="read.1", new_run_id="first", by="ana")
    assert sp.resume(store, "first") == made
    calls.made.clear()
    # from a step of the fork's tail: its effect steps before it took the source's outcomes
    second = sp.fork(store, "first", from_step="read.3", new_run_id="second", by="ana")
    assert second.forked_from == {"run_id": "first", "step_id": "read.3"}
    assert sorted(store.load_ledger("second").operations) == ["ticket.0"]  # the one copy
    assert sp.resume(store, "second") == made
    assert calls.made == _tail(3)
    # and one that names an operation sends it under its own key, once
    third = sp.fork(store, "second", from_step="read.4", new_run_id="third", resend=["ticket.4"], by="ana")
    assert sp.resume(store, third.run_id)[4] != made[4]
    assert _stats(owner_env) == (EFFECTS + 1, 1)
    op = store.load_ledger("third").operations["ticket.4"]
    assert op.effect_key == mint_effect_key(store.identity.ledger_id, "third", "ticket.4")
    # a fork of that one finds the nearest: third's own
    fourth = sp.fork(store, "third", from_step="read.4", new_run_id="fourth", by="ana")
    assert sp.resume(store, fourth.run_id)[4] == sp.resume(store, "third")[4]
    assert _stats(owner_env) == (EFFECTS + 1, 1)


def test_a_fork_is_refused_when_it_cannot_be_made_and_nothing_is_written(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls, _ = _source(store, _name("fork-refused"))
    before = store.events("source")
    with pytest.raises(ForkRefused) as unknown:
        sp.fork(store, "source", from_step="read.9", by="ana")
    assert unknown.value.choices[:3] == ("read.0", "draft.0", "ticket.0")
    assert len(unknown.value.choices) == 3 * EFFECTS
    assert "'read.9'" in unknown.value.message
    with pytest.raises(RunConflict):
        sp.fork(store, "source", from_step="read.2", new_run_id="source", by="ana")
    with pytest.raises(ForkRefused, match="resend names"):
        sp.fork(store, "source", from_step="read.2", resend=["ticket.0"], by="ana")
    with pytest.raises(sp.UsageError, match="resend is a list"):
        sp.fork(store, "source", from_step="read.2", resend="ticket.4", by="ana")
    with pytest.raises(sp.UsageError, match="say who"):
        sp.fork(store, "source", from_step="read.2", by="")
    other = _support(_name("fork-other"), calls)
    with pytest.raises(ForkRefused, match="workflow"):
        sp.fork(store, "source", from_step="read.2", workflow=other, by="ana")
    with pytest.raises(sp.errors.RunNotFound):
        sp.fork(store, "missing", from_step="read.2", by="ana")
    assert store.events("source") == before
    assert len(store.list_runs()) == 1


def test_a_prefix_with_an_uncertain_effect_is_refused_and_a_tail_with_one_blocks_until_it_is_settled(
    store: sp.Store,
) -> None:
    """The source's effect is uncertain (its call timed out, and its owner cannot be asked)
    while a sibling branch recorded a read: a fork from after that read is refused, naming the
    effect; a fork from before it blocks when it gets there — and once the source settles it,
    the fork takes that outcome."""
    in_flight = threading.Event()
    sent: list[str] = []
    notes: list[str] = []

    def charge(payload: Any, key: sp.EffectKey) -> Any:
        sent.append(str(key))
        time.sleep(0.01)  # prepared strictly before the sibling's read is recorded
        in_flight.set()
        time.sleep(0.2)
        raise TimeoutError("the owner did not answer")

    charges = sp.Effect("charge", execute=charge)  # no reconcile: uncertain stays uncertain

    def note(case: str) -> str:
        in_flight.wait(10)
        notes.append(case)
        return f"noted {case}"

    @sp.workflow(_name("fork-uncertain"))
    def flow(run: sp.Run, case: str) -> Any:
        run.read("look", notes.append, f"look {case}")
        return run.parallel(
            "fan",
            {
                "pay": lambda branch: branch.effect("charge", charges, payload={"case": case})["id"],
                "note": lambda branch: branch.read("note", note, case),
            },
        )

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, flow, "case-7", run_id="source")
    source = store.load_ledger("source")
    assert source.operations["fan.pay/charge"].state is EffectState.UNKNOWN
    assert "fan.note/note" in source.steps
    before = store.events("source")
    with pytest.raises(ForkRefused) as refused:
        sp.fork(store, "source", from_step="fan.note/note", by="ana")
    assert refused.value.operation_id == "fan.pay/charge"
    assert store.events("source") == before

    fork = sp.fork(store, "source", from_step="look", by="ana")
    with pytest.raises(SentBySource, match="unknown"):
        sp.resume(store, fork.run_id)
    assert store.get_run(fork.run_id).recovery_record["phase"] == "forked_effect"
    assert len(sent) == 1  # never sent by the fork
    record = store.get_run("source").recovery_record
    assert record is not None
    sp.resolve(
        store, "source", "applied", revision=record["state_revision"], by="ana", receipt={"id": "ch_1"}
    )
    assert sp.resume(store, fork.run_id) == {"pay": "ch_1", "note": "noted case-7"}
    assert len(sent) == 1


def test_a_rejection_in_the_source_stands_for_the_fork_unless_named(
    store: sp.Store, owner_env: OwnerService
) -> None:
    rejecting = sp.Effect("refund", execute=_reject_then_accept())

    @sp.workflow(_name("fork-rejected"))
    def flow(run: sp.Run) -> Any:
        run.read("look", lambda: 1)
        try:
            return run.effect("refund", rejecting, payload={"amount": 5})
        except EffectRejected:
            return "refused"

    assert sp.start(store, flow, run_id="source") == "refused"
    assert sp.resume(store, sp.fork(store, "source", from_step="look", by="ana").run_id) == "refused"
    named = sp.fork(store, "source", from_step="look", resend=["refund"], by="ana")
    assert sp.resume(store, named.run_id) == {"ok": 2}


def _reject_then_accept() -> Callable[[Any, sp.EffectKey], Any]:
    sent: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        sent.append(str(key))
        if len(sent) == 1:
            raise sp.Rejected({"why": "no funds"})
        return {"ok": len(sent)}

    return execute


def _async_tickets(asked: list[int]) -> sp.Workflow:
    tickets = owner_effect("tickets")

    async def look(index: int) -> int:
        asked.append(index)
        return index

    @sp.workflow(_name("fork-async"))
    async def flow(run: sp.AsyncRun) -> list[str]:
        made = []
        for index in range(3):
            await run.read(f"read.{index}", look, index)
            made.append((await run.effect(f"ticket.{index}", tickets, payload={"index": index}))["id"])
        return made

    return flow


def test_fork_async_on_the_async_postgres_store(pg_url: str, owner_env: OwnerService) -> None:
    asked: list[int] = []
    flow = _async_tickets(asked)

    async def main() -> tuple[Any, Any, Any]:
        store = await sp.open_async_store(f"{pg_url}?schema=f_{uuid.uuid4().hex[:12]}")
        try:
            made = await sp.start_async(store, flow, run_id="source")
            asked.clear()
            fork = await sp.fork_async(store, "source", from_step="read.1", resend=["ticket.2"], by="ana")
            return made, await sp.resume_async(store, fork.run_id), await store.load_ledger(fork.run_id)
        finally:
            await store.close()

    made, again, ledger = asyncio.run(main())
    assert again[:2] == made[:2]
    assert again[2] != made[2]
    assert asked == [1, 2]
    assert sorted(ledger.operations) == ["ticket.0", "ticket.2"]
    assert _stats(owner_env) == (4, 1)  # ticket.2 once more, with its payload: as named


def test_fork_async_makes_the_same_fork_for_an_async_workflow(
    store: sp.Store, owner_env: OwnerService
) -> None:
    asked: list[int] = []
    flow = _async_tickets(asked)

    async def main() -> tuple[Any, Any]:
        made = await sp.start_async(store, flow, run_id="source")
        asked.clear()
        fork = await sp.fork_async(store, "source", from_step="read.1", by="ana")
        return made, await sp.resume_async(store, fork.run_id)

    made, again = asyncio.run(main())
    assert made == again
    assert asked == [1, 2]
    assert _stats(owner_env) == (3, 0)


def test_a_forks_successors_send_none_of_the_sources_chain_effects_either(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """The source continued as new twice; its fork, from a step of the first run, continues as
    new too: its successors find what the source's chain sent by operation id, through the
    fork's first run."""
    calls = Calls()
    lines = owner_effect("tickets")

    @sp.workflow(_name("fork-chain"))
    def chain(run: sp.Run, start: int, count: int, made: list[str]) -> list[str]:
        for index in range(start, count):
            run.read(f"read.{index}", calls.look_up, "case", index)
            receipt = run.effect(
                f"line.{index}", lines, payload={"index": index}, operation_id=f"line:{index}"
            )
            made = [*made, receipt["id"]]
            if (index + 1) % 2 == 0 and index + 1 < count:
                run.continue_as_new(index + 1, count, made)
        return made

    made = sp.start(store, chain, 0, 6, [], run_id="source")
    assert store.get_run("source~2").status is RunStatus.COMPLETED
    calls.made.clear()
    fork = sp.fork(store, "source", from_step="read.1", new_run_id="fork", by="ana")
    assert fork.forked_from == {"run_id": "source", "step_id": "read.1"}
    assert sp.resume(store, "fork") == made
    assert store.get_run("fork~2").status is RunStatus.COMPLETED  # the fork's own chain
    assert calls.made == [f"read.{i}" for i in range(1, 6)]
    assert _stats(owner_env) == (6, 0)
    # what the operator names in resend is sent again by the fork's successor that reaches it,
    # under the fork's chain's key
    sp.fork(store, "source", from_step="read.1", new_run_id="named", resend=["line:4"], by="ana")
    again = sp.resume(store, "named")
    assert (again[:4], again[5]) == (made[:4], made[5])
    assert again[4] != made[4]
    assert _stats(owner_env) == (7, 1)
    op = store.load_ledger("named~2").operations["line:4"]
    assert op.effect_key == mint_effect_key(store.identity.ledger_id, "named", "line:4")
