"""One parked wait takes one answer, end to end on SQLite files and PostgreSQL, counted at the
real HTTP effect owner: an answer is addressed to one wait (``safepoint.answer``) and kept once
for it — a second answer to it, or one after it took its message or timed out, is refused
(``WaitAnswered``) unless it names the next wait; a mailbox message (``safepoint.send``) still
queues for the next wait of its name. Every second release of an interrupt already consumed is
a typed refusal: an approval of a gate that already has one, or whose effect went out
(``GateApproved``), a limit raised on a run that ended (``LimitsRefused``). k senders or
approvers at the same instant, each on a store of its own, release the wait once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import safepoint as sp
from safepoint.errors import GateApproved, LimitsRefused, MessageRefused, WaitAnswered
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import ApprovalRecord, EffectState, MessageRecord, RunStatus

T = TypeVar("T")
K = 6  # senders (or approvers) at once


def _applied(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return int(stats["applied"]), int(stats["duplicates"])


def _at_once(url: str, calls: list[Callable[[sp.Store], T]]) -> list[T | BaseException]:
    """Each call on a thread with a store of its own (its own connection), released together by
    a barrier: what each returned or raised."""
    stores = [sp.open_store(url) for _ in calls]
    barrier = threading.Barrier(len(calls))
    results: list[T | BaseException] = [RuntimeError("not run")] * len(calls)

    def body(index: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[index] = calls[index](stores[index])
        except BaseException as exc:  # the refusals are what the test counts
            results[index] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for store in stores:
        store.close()
    return results


# -- answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("flow", ["questions", "questions_async"])
def test_a_second_answer_to_a_parked_wait_is_refused_and_the_next_wait_waits_for_its_own(
    store: sp.Store, owner_env: OwnerService, flow: str
) -> None:
    """Two people answer the one question that is parked: the second is refused, naming the
    wait; the next wait of that name waits for an answer of its own, and the reply it gates
    goes out only once someone answers it — addressed to it explicitly."""
    import wait_flows

    wf = getattr(wait_flows, flow)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, wf, "c-1", run_id="r")
    first = sp.answer(store, "r", "answer", {"refund": 40}, by="ana")
    assert (first.for_wait, first.sent_by) == ("answer", "ana")
    assert store.get_run("r").status is RunStatus.PENDING
    events = len(store.events("r"))
    with pytest.raises(WaitAnswered) as second:
        sp.answer(store, "r", "answer", {"refund": 50}, by="bo")
    refused = second.value
    assert isinstance(refused, MessageRefused)
    assert (refused.run_id, refused.step_id, refused.name) == ("r", "answer", "answer")
    assert (refused.answered_by, refused.answered_at, refused.timed_out) == ("ana", first.sent_at, False)
    assert "wait='answer#2'" in str(refused)
    assert len(store.events("r")) == events  # nothing kept, nothing recorded
    with pytest.raises(sp.AwaitingMessage) as waits:
        sp.resume(store, "r")
    assert waits.value.step_id == "answer#2"
    assert _applied(owner_env) == (1, 0)  # the second reply waits for its own answer
    with pytest.raises(WaitAnswered, match="answered already by ana"):  # late, still the first
        sp.answer(store, "r", "answer", {"refund": 50}, by="bo")
    sp.answer(store, "r", "answer", {"refund": 50}, wait="answer#2", by="bo")
    assert sp.resume(store, "r") == ["re_1", "re_2"]
    assert [(m.payload, m.for_wait, m.taken_by) for m in store.messages("r")] == [
        ({"refund": 40}, "answer", "answer"),
        ({"refund": 50}, "answer#2", "answer#2"),
    ]
    assert _applied(owner_env) == (2, 0)


def test_an_answer_async_is_kept_once_too(store: sp.Store, owner_env: OwnerService) -> None:
    import wait_flows

    async def main() -> tuple[Any, BaseException | None, Any]:
        with pytest.raises(sp.AwaitingMessage):
            await sp.start_async(store, wait_flows.questions_async, "c-1", run_id="r")
        kept = await sp.answer_async(store, "r", "answer", "yes", by="ana")
        try:
            await sp.answer_async(store, "r", "answer", "no", by="bo")
            refused = None
        except WaitAnswered as exc:
            refused = exc
        with pytest.raises(sp.AwaitingMessage):
            await sp.resume_async(store, "r")
        return kept, refused, store.get_run("r").waiting_for

    kept, refused, waiting = asyncio.run(main())
    assert kept.for_wait == "answer"
    assert isinstance(refused, WaitAnswered)
    assert refused.answered_by == "ana"
    assert waiting is not None
    assert waiting["step_id"] == "answer#2"
    assert _applied(owner_env) == (1, 0)


def test_an_answer_addressed_to_the_next_wait_is_kept_for_it_and_no_other(
    store: sp.Store, owner_env: OwnerService
) -> None:
    import wait_flows

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, wait_flows.questions, "c-1", run_id="r")
    ahead = sp.answer(store, "r", "answer", "second", wait="answer#2", by="bo")
    assert store.get_run("r").status is RunStatus.WAITING  # not the wait it answers
    with pytest.raises(sp.AwaitingMessage) as still:
        sp.resume(store, "r")  # the first wait does not take the second's answer
    assert still.value.step_id == "answer"
    assert _applied(owner_env) == (0, 0)
    with pytest.raises(WaitAnswered):  # that one is answered: once
        sp.answer(store, "r", "answer", "again", wait="answer#2")
    sp.answer(store, "r", "answer", "first", by="ana")
    assert sp.resume(store, "r") == ["re_1", "re_2"]
    assert [(m.payload, m.taken_by) for m in store.messages("r")] == [
        ("second", "answer#2"),
        ("first", "answer"),
    ]
    assert ahead.seq < store.messages("r")[1].seq


def test_a_mailbox_message_still_queues_beside_an_answer(store: sp.Store) -> None:
    """``send`` keeps a message for the next wait of its name (the chat pattern); an answer
    addressed to a wait is that wait's, whatever was queued before it."""
    import wait_flows

    sp.submit(store, wait_flows.twice, run_id="r")
    sp.send(store, "r", "vote", "queued")
    sp.answer(store, "r", "vote", "answered")
    assert sp.resume(store, "r") == ["answered", "queued"]
    sp.submit(store, wait_flows.twice, run_id="chat")
    for said in ("hello", "are you there?", "hello?"):
        sp.send(store, "chat", "vote", said)  # a third, for a wait that never comes: kept
    assert sp.resume(store, "chat") == ["hello", "are you there?"]


def test_an_answer_to_a_wait_that_took_its_message_or_timed_out_is_refused(store: sp.Store) -> None:
    import wait_flows

    sp.submit(store, wait_flows.local, "answer", run_id="r")
    sp.send(store, "r", "answer", "from the mailbox", by="ana")
    assert sp.resume(store, "r") == "from the mailbox"
    with pytest.raises(MessageRefused, match="has ended"):  # the run is over: as for send
        sp.answer(store, "r", "answer", "late")

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, wait_flows.timeout, 0.05, run_id="t")
    time.sleep(0.1)
    with pytest.raises(WaitAnswered) as late:  # parked still, but past its timeout
        sp.answer(store, "t", "answer", "too late")
    assert late.value.timed_out
    assert "timed out" in str(late.value)
    assert "timed_out" in sp.resume(store, "t")
    assert store.messages("t") == []


def test_a_redelivered_answer_is_the_one_kept(store: sp.Store) -> None:
    import wait_flows

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, wait_flows.local, "answer", run_id="r")
    first = sp.answer(store, "r", "answer", {"n": 1}, message_id="delivery-1")
    assert sp.answer(store, "r", "answer", {"n": 1}, message_id="delivery-1") == first
    with pytest.raises(WaitAnswered):  # retried without its delivery id: refused, not kept
        sp.answer(store, "r", "answer", {"n": 1})
    assert sp.resume(store, "r") == {"n": 1}
    assert sp.answer(store, "r", "answer", {"n": 1}, message_id="delivery-1").taken_by == "answer"
    with pytest.raises(MessageRefused, match="names another message"):  # the id, for another wait
        sp.answer(store, "r", "answer", {"n": 1}, wait="answer#2", message_id="delivery-1")


@pytest.mark.parametrize("flow", ["questions", "questions_async"])
def test_k_answers_at_the_same_instant_release_the_wait_once(
    store: sp.Store, owner_env: OwnerService, flow: str
) -> None:
    import wait_flows

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, getattr(wait_flows, flow), "c-1", run_id="r")
    results = _at_once(
        store.url,
        [(lambda own, n=n: sp.answer(own, "r", "answer", {"from": n}, by=f"person-{n}")) for n in range(K)],
    )
    kept = [r for r in results if isinstance(r, MessageRecord)]
    refused = [r for r in results if isinstance(r, WaitAnswered)]
    assert (len(kept), len(refused)) == (1, K - 1), results
    assert {r.answered_by for r in refused} == {kept[0].sent_by}
    assert [m.seq for m in store.messages("r")] == [kept[0].seq]
    woke = [e for e in store.events("r") if e.kind == "message.sent"]
    assert [e.detail["woke"] for e in woke] == [True]
    with pytest.raises(sp.AwaitingMessage):
        sp.resume(store, "r")  # the first reply goes out; the second question waits
    assert _applied(owner_env) == (1, 0)


def test_answers_on_the_async_store(pg_url: str, owner_env: OwnerService) -> None:
    import uuid

    import wait_flows

    url = f"{pg_url}?schema=a_{uuid.uuid4().hex[:12]}"

    async def main() -> tuple[Any, BaseException | None, Any]:
        store = await sp.open_async_store(url)
        try:
            with pytest.raises(sp.AwaitingMessage):
                await sp.start_async(store, wait_flows.questions_async, "c-1", run_id="r")
            kept = await sp.answer_async(store, "r", "answer", "yes", by="ana")
            refused: BaseException | None = None
            try:
                await sp.answer_async(store, "r", "answer", "no", by="bo")
            except WaitAnswered as exc:
                refused = exc
            with pytest.raises(sp.AwaitingMessage):
                await sp.resume_async(store, "r")
            await sp.answer_async(store, "r", "answer", "no", wait="answer#2", by="bo")
            return kept, refused, await sp.resume_async(store, "r")
        finally:
            await store.close()

    kept, refused, result = asyncio.run(main())
    assert kept.for_wait == "answer"
    assert isinstance(refused, WaitAnswered)
    assert refused.answered_by == "ana"
    assert result == ["re_1", "re_2"]
    assert _applied(owner_env) == (2, 0)


# -- approvals ---------------------------------------------------------------------------------


def _refund_flow(name: str) -> sp.Workflow:
    refunds = owner_effect("refunds")

    @sp.workflow(name)
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", refunds, payload={"account": "acct-1", "amount": 40}, approval=True)

    return flow


def test_k_approvals_at_the_same_instant_release_the_gate_once(
    store: sp.Store, owner_env: OwnerService
) -> None:
    flow = _refund_flow("answers-approved-once")
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    results = _at_once(
        store.url, [(lambda own, n=n: sp.approve(own, "r", "refund", by=f"person-{n}")) for n in range(K)]
    )
    given = [r for r in results if isinstance(r, ApprovalRecord)]
    refused = [r for r in results if isinstance(r, GateApproved)]
    assert (len(given), len(refused)) == (1, K - 1), results
    assert {r.approval_id for r in refused} == {given[0].approval_id}
    assert {r.approved_by for r in refused} == {given[0].approved_by}
    assert store.approvals("r") == given
    approved = [e for e in store.events("r") if e.kind == "effect.approved"]
    assert [e.detail["released"] for e in approved] == [True]
    assert sp.resume(store, "r")["amount"] == 40
    assert _applied(owner_env) == (1, 0)


def test_an_approval_of_a_gate_whose_effect_went_out_is_refused(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    flow = _refund_flow("answers-went-out")
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    ana = sp.approve(store, "r", "refund", by="ana")
    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.resume(store, "r", lease_ms=0)
    crash_at(None)
    assert store.load_ledger("r").operations["refund"].state is EffectState.DISPATCHING
    with pytest.raises(GateApproved) as refused:
        sp.approve(store, "r", "refund", by="bo")
    assert (refused.value.approval_id, refused.value.went_out) == (ana.approval_id, True)
    assert "went out" in str(refused.value)
    with pytest.raises(GateApproved):
        asyncio.run(sp.approve_async(store, "r", "refund", by="dan"))
    assert store.approvals("r") == [ana]
    assert sp.approve(store, "r", "refund", by="ana") == ana  # the same person: the same one
    assert sp.resume(store, "r")["amount"] == 40  # reconciled (not applied), sent once
    assert _applied(owner_env) == (1, 0)

    async def approve_later() -> None:
        await sp.approve_async(store, "r", "refund", by="carol")

    with pytest.raises(sp.errors.ApprovalRefused, match="nothing is left to approve"):
        asyncio.run(approve_later())


# -- limits ------------------------------------------------------------------------------------


@sp.workflow("answers-limited")
def limited(run: sp.Run) -> str:
    return str(run.pure("one", lambda: "done"))


def test_a_limit_raised_on_a_run_that_ended_is_refused(store: sp.Store) -> None:
    sp.start(store, limited, run_id="r")
    with pytest.raises(LimitsRefused, match="has ended"):
        sp.extend_limits(store, "r", tokens=1_000, by="ana")

    async def raise_async() -> None:
        await sp.extend_limits_async(store, "r", tokens=1_000, by="ana")

    with pytest.raises(LimitsRefused, match="has ended"):
        asyncio.run(raise_async())
    assert [e.kind for e in store.events("r")].count("run.limits_extended") == 0
