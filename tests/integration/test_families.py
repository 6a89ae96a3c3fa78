"""At most once per family, end to end on every store with the effect owner on loopback: a run,
its forks (and theirs) and its successors never send one operation twice, whichever of them
carries on first — a source still waiting when it was forked, a source whose uncertain operation
a person settles after the fork either way, a fork of a continue-as-new chain. The owner counts
what it applied: each business operation once, unless a person named it in ``resend``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import safepoint as sp
from app_orders import TABLE, orders, q
from safepoint.errors import SentBySource
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import RunStatus, StepKind


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _applied(owner: OwnerService) -> int:
    return int(owner.client.stats()["applied"])


def _waiting_for_word(name: str) -> sp.Workflow:
    """An acknowledgement, a read, a wait for a message, then the route ticket."""
    tickets = owner_effect("tickets")

    @sp.workflow(name, version="v1")
    def triage(run: sp.Run, case: str) -> list[str]:
        ack = run.effect("ack", tickets, payload={"case": case, "kind": "ack"})
        run.read("look", lambda c: {"case": c}, case)
        run.wait_for("go")
        routed = run.effect("route", tickets, payload={"case": case, "kind": "route"})
        return [ack["id"], routed["id"]]

    return triage


def _go(store: sp.Store, run_id: str) -> Any:
    sp.send(store, run_id, "go", {"ok": True}, by="ana")
    return sp.resume(store, run_id)


@pytest.mark.parametrize("first", ["source", "fork", "grandchild"])
def test_a_waiting_run_and_its_forks_send_the_tail_once_whoever_goes_on_first(
    store: sp.Store, owner_env: OwnerService, first: str
) -> None:
    triage = _waiting_for_word(_name("family-wait"))
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, triage, "c-1", run_id="source")
    fork = sp.fork(store, "source", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, fork.run_id)  # the fork waits for its own word
    sp.fork(store, "fork", from_step="look", new_run_id="grandchild", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "grandchild")
    assert _applied(owner_env) == 1  # the acknowledgement: none of the forks sent it again

    order = [first, *(r for r in ("source", "fork", "grandchild") if r != first)]
    results = {run_id: _go(store, run_id) for run_id in order}
    assert _applied(owner_env) == 2  # the route ticket, once for the whole family
    assert len({tuple(result) for result in results.values()}) == 1  # one receipt, everywhere
    for run_id in order:
        assert store.get_run(run_id).status is RunStatus.COMPLETED


def test_a_fork_named_to_send_again_sends_once_more_and_its_forks_take_its_outcome(
    store: sp.Store, owner_env: OwnerService
) -> None:
    triage = _waiting_for_word(_name("family-resend"))
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, triage, "c-2", run_id="source")
    assert _go(store, "source")
    sp.fork(store, "source", from_step="look", new_run_id="again", resend=["route"], by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "again")
    sp.fork(store, "again", from_step="look", new_run_id="again-2", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "again-2")  # its source has not sent it again yet: it waits
    again_2 = _go(store, "again-2")  # goes first: sends it again, as its ancestor was told to
    again = _go(store, "again")
    assert again_2 == again
    assert again != store.get_run("source").result
    assert _applied(owner_env) == 3  # the acknowledgement, the route, and the one resend


def _uncertain(name: str) -> sp.Workflow:
    """A read, then a ticket with no way to look it up at its owner (no reconcile): a dispatch
    whose answer is lost blocks the run until a person says what happened."""
    tickets = owner_effect("tickets", name="tickets.unreconciled", reconcile=False)

    @sp.workflow(name, version="v1")
    def flaky(run: sp.Run, case: str) -> str:
        run.read("look", lambda c: {"case": c}, case)
        return str(run.effect("open", tickets, payload={"case": case})["id"])

    return flaky


@pytest.mark.parametrize("settled", ["applied", "not_applied"])
@pytest.mark.parametrize("first", ["source", "fork"])
def test_a_source_settled_after_the_fork_either_way_sends_nothing_twice(
    store: sp.Store, owner_env: OwnerService, crash_at: Any, settled: str, first: str
) -> None:
    flaky = _uncertain(_name("family-settle"))
    if settled == "applied":  # the owner applied it and its answer was lost
        owner_env.client.set_faults(drop_after_commit=1)
        with pytest.raises(sp.RunBlocked):
            sp.start(store, flaky, "c-3", run_id="source")
    else:  # the worker died after "dispatching", before the call: nothing reached the owner
        crash_at("effect.after_dispatching")
        with pytest.raises(SimulatedCrash):
            sp.start(store, flaky, "c-3", run_id="source", lease_ms=0)
        crash_at(None)
        with pytest.raises(sp.RunBlocked):
            sp.resume(store, "source")
    fork = sp.fork(store, "source", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(SentBySource):  # the source holds it, uncertain: the fork waits for it
        sp.resume(store, fork.run_id)
    assert store.get_run("fork").status is RunStatus.BLOCKED

    receipt = None
    if settled == "applied":
        receipt = owner_env.client.find_by_key(
            "tickets", store.load_ledger("source").operations["open"].effect_key
        )
        assert receipt is not None
    revision = store.get_run("source").state_revision
    sp.resolve(store, "source", settled, revision=revision, by="ana", operation_id="open", receipt=receipt)
    if settled == "not_applied" and first == "fork":
        # The source sent it once: it alone sends it again, under the key it sent before (a
        # request still on its way is absorbed by that key alone); the fork waits for it.
        with pytest.raises(SentBySource, match="told it was not applied"):
            sp.resume(store, "fork")
        assert _applied(owner_env) == 0
        first = "source"
    results = {}
    for run_id in (first, "source" if first == "fork" else "fork"):
        results[run_id] = sp.resume(store, run_id)
    assert results["fork"] == results["source"]  # one ticket, whoever sent it
    assert _applied(owner_env) == 1


def _chain(name: str) -> sp.Workflow:
    """Three runs of one chain, each reading, then sending a line under its step's own id, then
    continuing as new — the last waiting for a word first."""
    lines = owner_effect("tickets", name="tickets.lines")

    @sp.workflow(name, version="v1")
    def chained(run: sp.Run, generation: int) -> list[str]:
        run.read("look", lambda g: {"generation": g}, generation)
        if generation == 2:
            run.wait_for("go")
        sent = run.effect("line", lines, payload={"line": generation})
        if generation < 2:
            run.continue_as_new(generation + 1)
        return [str(sent["id"])]

    return chained


@pytest.mark.parametrize("first", ["source", "fork"])
def test_a_fork_of_a_chain_resends_nothing_its_chain_sent_whoever_goes_on_first(
    store: sp.Store, owner_env: OwnerService, first: str
) -> None:
    chained = _chain(_name("family-chain"))
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, chained, 0, run_id="chain")
    assert _applied(owner_env) == 2  # the first two runs' lines; the third waits
    # a fork of the chain's first run replays its chain: each successor of the fork stands
    # where the chain's stood, and takes the line that run sent
    fork = sp.fork(store, "chain", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, fork.run_id)
    assert _applied(owner_env) == 2
    last = {"source": "chain~2", "fork": "fork~2"}
    order = [first, "fork" if first == "source" else "source"]
    results = [_go(store, last[who]) for who in order]
    assert results[0] == results[1]
    assert _applied(owner_env) == 3  # the third line, once for the whole family


def _ordering(name: str, calls: list[str]) -> sp.Workflow:
    """A read, a wait for a word, then a transaction step writing one row."""

    def insert(tx: Any, order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        tx.execute(TABLE)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        return {"order": order_id}

    @sp.workflow(name, version="v1")
    def ordering(run: sp.Run, order_id: str) -> Any:
        run.read("look", lambda o: {"order": o}, order_id)
        run.wait_for("go")
        return run.transaction("insert", insert, order_id)

    return ordering


@pytest.mark.parametrize("first", ["source", "fork", "done"])
def test_a_fork_never_runs_a_transaction_step_its_family_committed(
    store: sp.Store, store_url: str, first: str
) -> None:
    calls: list[str] = []
    ordering = _ordering(_name("family-tx"), calls)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, ordering, "o-1", run_id="source")
    if first == "done":  # the source committed it before the fork was made
        assert _go(store, "source") == {"order": "o-1"}
    fork = sp.fork(store, "source", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, fork.run_id)
    for run_id in ("source", "fork") if first != "fork" else ("fork", "source"):
        if store.get_run(run_id).status is not RunStatus.COMPLETED:
            assert _go(store, run_id) == {"order": "o-1"}
    assert orders(store_url) == ["o-1"]  # one row, whoever went first
    assert calls == ["o-1"] or store_url.startswith("postgresql")  # PostgreSQL sends the first
    # statement with the fence and claim: a refused step's function began, and was rolled back
    fork_step = store.load_ledger("fork").steps["insert"]
    assert (fork_step.kind, fork_step.result) == (StepKind.TRANSACTION, {"order": "o-1"})


def test_a_transaction_step_a_pruned_fork_committed_blocks_its_source(
    store: sp.Store, store_url: str
) -> None:
    """The fork committed the step and was pruned (finished; its source still waiting): the
    family's claim outlives it, so the source runs nothing again — it blocks, naming the step
    to run again in a fork if a person wants that, and never fails over the missing record
    (found by the simulator: the source failed with RunNotFound)."""
    calls: list[str] = []
    ordering = _ordering(_name("family-tx-pruned"), calls)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, ordering, "o-3", run_id="source")
    sp.fork(store, "source", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "fork")
    assert _go(store, "fork") == {"order": "o-3"}
    pruned = sp.prune(store, finished_before=datetime.now(UTC) + timedelta(seconds=1), force=True)
    assert pruned.run_ids == ("fork",)
    sp.send(store, "source", "go", {"ok": True}, by="ana")
    with pytest.raises(SentBySource, match="no longer there"):
        sp.resume(store, "source")
    assert store.get_run("source").status is RunStatus.BLOCKED
    assert orders(store_url) == ["o-3"]  # committed once, by the fork


def test_a_fork_named_to_run_a_transaction_step_again_runs_it_once(store: sp.Store, store_url: str) -> None:
    calls: list[str] = []
    ordering = _ordering(_name("family-tx-again"), calls)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, ordering, "o-2", run_id="source")
    _go(store, "source")
    sp.fork(store, "source", from_step="look", new_run_id="again", resend=["insert"], by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "again")
    _go(store, "again")
    assert orders(store_url) == ["o-2", "o-2"]  # once more, as asked


@pytest.mark.parametrize("first", ["source", "fork"])
def test_a_waiting_run_and_its_fork_send_once_on_the_async_store(
    pg_url: str, owner_env: OwnerService, first: str
) -> None:
    """The same rule on the async PostgreSQL store, with an async workflow and the async verbs."""
    tickets = owner_effect("tickets")

    @sp.workflow(_name("family-async"))
    async def triage(run: sp.AsyncRun, case: str) -> str:
        await run.read("look", _echo, case)
        await run.wait_for("go")
        return str((await run.effect("route", tickets, payload={"case": case}))["id"])

    async def main() -> dict[str, str]:
        store = await sp.open_async_store(f"{pg_url}?schema=fam_{uuid.uuid4().hex[:12]}")
        try:
            with pytest.raises(sp.AwaitingMessage):
                await sp.start_async(store, triage, "c-9", run_id="source")
            await sp.fork_async(store, "source", from_step="look", new_run_id="fork", by="ana")
            with pytest.raises(sp.AwaitingMessage):
                await sp.resume_async(store, "fork")
            done = {}
            for run_id in (first, "fork" if first == "source" else "source"):
                await sp.send_async(store, run_id, "go", {"ok": True}, by="ana")
                done[run_id] = await sp.resume_async(store, run_id)
            return done
        finally:
            await store.close()

    done = asyncio.run(main())
    assert done["source"] == done["fork"]
    assert _applied(owner_env) == 1


async def _echo(case: str) -> dict[str, str]:
    return {"case": case}


def _go_on(store_url: str, run_id: str, barrier: threading.Barrier, outcomes: dict[str, Any]) -> None:
    """Resume ``run_id`` on a store of its own once every thread is at the barrier."""
    store = sp.open_store(store_url)
    try:
        barrier.wait()
        try:
            outcomes[run_id] = sp.resume(store, run_id)
        except SentBySource:
            outcomes[run_id] = "blocked"
    finally:
        store.close()


def test_a_run_and_its_fork_going_on_at_the_same_instant_send_once(
    store_url: str, owner_env: OwnerService
) -> None:
    """The source and its fork resumed at once, on two threads with a store each: one sends,
    the other takes its outcome (or, if it got there while the send was in flight, blocks until
    it is settled and then takes it) — the owner applies it once, every time."""
    triage = _waiting_for_word(_name("family-race"))
    setup = sp.open_store(store_url)
    try:
        for round_ in range(5):
            source, fork = f"source-{round_}", f"fork-{round_}"
            with pytest.raises(sp.AwaitingMessage):
                sp.start(setup, triage, f"c-{round_}", run_id=source)
            sp.fork(setup, source, from_step="look", new_run_id=fork, by="ana")
            with pytest.raises(sp.AwaitingMessage):
                sp.resume(setup, fork)
            for run_id in (source, fork):
                sp.send(setup, run_id, "go", {"ok": True}, by="ana")
            barrier = threading.Barrier(2)
            outcomes: dict[str, Any] = {}

            threads = [
                threading.Thread(target=_go_on, args=(store_url, run_id, barrier, outcomes))
                for run_id in (source, fork)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for run_id, outcome in outcomes.items():
                if outcome == "blocked":  # it came while the other's send was in flight
                    outcomes[run_id] = sp.resume(setup, run_id)
            assert outcomes[source] == outcomes[fork]
            assert _applied(owner_env) == 2 * (round_ + 1)  # the acknowledgement and the route
    finally:
        setup.close()


def test_a_run_whose_fork_sent_it_and_was_pruned_blocks_and_sends_nothing(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """The fork went first and was pruned (finished, its source still waiting): the family's
    claim outlives it, so the source sends nothing again — it blocks, naming itself to fork
    with resend, since the outcome it would take is gone."""
    triage = _waiting_for_word(_name("family-pruned"))
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, triage, "c-p", run_id="source")
    sp.fork(store, "source", from_step="look", new_run_id="fork", by="ana")
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "fork")
    _go(store, "fork")
    assert _applied(owner_env) == 2
    # a second ahead: a run that finished this very millisecond is pruned too
    pruned = sp.prune(store, finished_before=datetime.now(UTC) + timedelta(seconds=1), force=True)
    assert pruned.run_ids == ("fork",)  # the source is still waiting: only its fork went
    sp.send(store, "source", "go", {"ok": True}, by="ana")
    with pytest.raises(SentBySource) as blocked:
        sp.resume(store, "source")
    assert blocked.value.source_run_id == "source"
    assert "no longer there" in blocked.value.reason
    assert _applied(owner_env) == 2  # nothing sent again
