"""Durable waits end to end, on SQLite files and on PostgreSQL, sync and async workflows,
counted at the real HTTP effect owner: a run waits for a message (``run.wait_for``,
``safepoint.send``) or sleeps (``run.sleep``), released meanwhile, and a worker carries it on
once the message came or the time is due — with everything after the wait done once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import AwaitingMessage, MessageRefused, NotJSON, RunNotFound, SecretRefused, Sleeping
from safepoint.testing import OwnerService, SimulatedCrash
from safepoint.types import RunStatus, StepKind, StepStatus


def _applied(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return int(stats["applied"]), int(stats["duplicates"])


@contextmanager
def _worker(store: sp.Store, *workflows: str, rescan: float = 5.0) -> Iterator[sp.Worker]:
    """A worker in a thread of this process, on its own store object, stopped at the end. Its
    ``rescan`` is long: a run it takes on time was woken by its due time, not by a rescan."""
    own = sp.open_store(store.url)
    worker = sp.Worker(own, workflows=list(workflows), rescan=rescan)
    thread = threading.Thread(target=lambda: worker.run(handle_signals=False), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        own.close()


def _until(store: sp.Store, run_id: str, status: RunStatus, timeout: float = 20.0) -> float:
    """Wait until the run has ``status``; the store's clock then (epoch ms)."""
    deadline = time.monotonic() + timeout
    while store.get_run(run_id).status is not status:
        assert time.monotonic() < deadline, store.get_run(run_id)
        time.sleep(0.01)
    return store.now()


@pytest.mark.parametrize("flow", ["answer", "answer_async"])
def test_a_message_sent_before_the_run_waits_is_received(
    store: sp.Store, owner_env: OwnerService, flow: str
) -> None:
    import wait_flows

    sp.submit(store, getattr(wait_flows, flow), "c-1", run_id="r")
    sent = sp.send(store, "r", "answer", {"refund": 40}, by="ana")
    assert store.get_run("r").status is RunStatus.PENDING  # kept; the run did not wait yet
    result = sp.resume(store, "r")
    assert result == {"answer": {"refund": 40}, "reply": "re_1"}
    ledger = store.load_ledger("r")
    step = ledger.steps["answer"]
    assert (step.kind, step.name, step.result) == (StepKind.WAIT, "message:answer", {"refund": 40})
    [kept] = store.messages("r")
    assert (kept.seq, kept.taken_by, kept.sent_by) == (sent.seq, "answer", "ana")
    assert "run.waiting" not in [e.kind for e in store.events("r")]  # it never had to wait
    assert _applied(owner_env) == (1, 0)


@pytest.mark.parametrize("flow", ["answer", "answer_async"])
def test_a_message_sent_after_the_run_suspended_wakes_it_for_a_worker(
    store: sp.Store, owner_env: OwnerService, flow: str
) -> None:
    import wait_flows

    wf = getattr(wait_flows, flow)
    with pytest.raises(AwaitingMessage) as waits:
        sp.start(store, wf, "c-1", run_id="r")
    assert (waits.value.run_id, waits.value.step_id, waits.value.name, waits.value.timeout_at) == (
        "r",
        "answer",
        "answer",
        None,
    )
    assert isinstance(waits.value, sp.RunWaiting)
    assert not isinstance(waits.value, sp.RunBlocked)
    waiting = store.get_run("r")
    assert (waiting.status, waiting.owner, waiting.wake_at) == (RunStatus.WAITING, None, None)
    assert waiting.waiting_for is not None
    assert waiting.waiting_for["kind"] == "message"
    with pytest.raises(AwaitingMessage):  # a resume without the message waits again, unchanged
        sp.resume(store, "r")
    assert store.get_run("r").status is RunStatus.WAITING
    assert _applied(owner_env) == (0, 0)
    with _worker(store, wf.name) as worker:
        time.sleep(0.2)  # an idle worker leaves a run waiting for a message alone
        assert store.get_run("r").status is RunStatus.WAITING
        sp.send(store, "r", "answer", "yes")
        _until(store, "r", RunStatus.COMPLETED)
    assert worker.stats.completed == 1
    assert store.get_run("r").result == {"answer": "yes", "reply": "re_1"}
    assert sp.resume(store, "r") == {"answer": "yes", "reply": "re_1"}  # replayed, asks nothing
    assert _applied(owner_env) == (1, 0)
    kinds = [e.kind for e in store.events("r")]
    assert kinds.count("message.received") == 1


def test_a_second_message_of_a_name_is_kept_for_the_next_wait(store: sp.Store) -> None:
    import wait_flows

    sp.submit(store, wait_flows.twice, run_id="r")
    sp.send(store, "r", "vote", "first")
    with pytest.raises(AwaitingMessage) as waits:
        sp.resume(store, "r")  # takes the first, waits for the second
    assert waits.value.step_id == "vote#2"
    sp.send(store, "r", "vote", "second")
    sp.send(store, "r", "vote", "third")  # for a wait that never comes: kept, untaken
    assert sp.resume(store, "r") == ["first", "second"]
    assert [(m.payload, m.taken_by) for m in store.messages("r")] == [
        ("first", "vote"),
        ("second", "vote#2"),
        ("third", None),
    ]


def test_a_redelivered_message_is_one_message(store: sp.Store) -> None:
    import wait_flows

    sp.submit(store, wait_flows.twice, run_id="r")
    first = sp.send(store, "r", "vote", {"n": 1}, message_id="delivery-1")
    assert sp.send(store, "r", "vote", {"n": 1}, message_id="delivery-1") == first
    with pytest.raises(MessageRefused):  # the same id for another message
        sp.send(store, "r", "vote", {"n": 2}, message_id="delivery-1")
    with pytest.raises(AwaitingMessage):  # one message: the second wait has none
        sp.resume(store, "r")
    sp.send(store, "r", "vote", {"n": 2}, message_id="delivery-2")
    assert sp.resume(store, "r") == [{"n": 1}, {"n": 2}]
    # a late re-delivery of a message the run took is still the one kept
    assert sp.send(store, "r", "vote", {"n": 1}, message_id="delivery-1").taken_by == "vote"


@pytest.mark.parametrize("flow", ["timeout", "timeout_async"])
def test_a_timeout_is_recorded_replayed_and_its_run_taken_when_due(store: sp.Store, flow: str) -> None:
    import wait_flows

    wf = getattr(wait_flows, flow)
    with pytest.raises(AwaitingMessage) as waits:
        sp.start(store, wf, 0.6, run_id="r")
    timeout_at = waits.value.timeout_at
    assert timeout_at is not None
    assert store.get_run("r").wake_at == timeout_at
    with pytest.raises(AwaitingMessage) as again:  # resumed before it is due: for the rest
        sp.resume(store, "r")
    assert again.value.timeout_at == timeout_at
    with _worker(store, wf.name):
        ended_at = _until(store, "r", RunStatus.COMPLETED)
    assert timeout_at <= ended_at < timeout_at + 3_000  # woken when due, not by a rescan
    assert store.get_run("r").result == {"timed_out": timeout_at}
    step = store.load_ledger("r").steps["answer"]
    assert (step.status, step.error and step.error["type"]) == (StepStatus.FAILED, "WaitTimedOut")
    assert sp.resume(store, "r") == {"timed_out": timeout_at}  # replayed, the same outcome
    with pytest.raises(MessageRefused):  # it ended: a message now would never be received
        sp.send(store, "r", "answer", "too late")


def test_a_wait_that_times_out_uncaught_fails_the_run_with_wait_timed_out(store: sp.Store) -> None:
    @sp.workflow("waits-uncaught")
    def uncaught(run: sp.Run) -> Any:
        return run.wait_for("answer", timeout=0.2)

    with pytest.raises(AwaitingMessage):
        sp.start(store, uncaught, run_id="r")
    time.sleep(0.3)
    with pytest.raises(sp.WaitTimedOut) as timed_out:
        sp.resume(store, "r")
    assert (timed_out.value.step_id, timed_out.value.name) == ("answer", "answer")
    run = store.get_run("r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None
    assert run.error["type"] == "WaitTimedOut"


@pytest.mark.parametrize("flow", ["sleeper", "sleeper_async"])
def test_a_sleep_releases_the_run_and_a_worker_takes_it_when_due(
    store: sp.Store, owner_env: OwnerService, flow: str
) -> None:
    import wait_flows

    wf = getattr(wait_flows, flow)
    args: tuple[Any, ...] = ("c-1", 0.8) if flow == "sleeper" else (0.8,)
    with pytest.raises(Sleeping) as sleeps:
        sp.start(store, wf, *args, run_id="r")
    until = sleeps.value.until
    step = store.load_ledger("r").steps["sleep"]
    assert step.result["until"] == until == step.recorded_at + 800  # recorded at its first run
    sleeping = store.get_run("r")
    assert (sleeping.status, sleeping.wake_at, sleeping.owner) == (RunStatus.WAITING, until, None)
    assert sleeping.waiting_for is not None
    assert sleeping.waiting_for["kind"] == "sleep"
    with pytest.raises(Sleeping) as again:  # resumed early: it sleeps on, to the same instant
        sp.resume(store, "r")
    assert again.value.until == until
    with _worker(store, wf.name):
        ended_at = _until(store, "r", RunStatus.COMPLETED)
    assert until <= ended_at < until + 3_000
    if flow == "sleeper":
        assert _applied(owner_env) == (1, 0)
        assert sp.resume(store, "r") == {"reply": "re_1"}
    else:
        assert sp.resume(store, "r") == "woke"


def test_a_worker_woken_for_nothing_again_and_again_still_takes_a_run_when_due(store: sp.Store) -> None:
    """News that never concerns the worker (runs of a workflow it does not serve, submitted all
    along) grows its idle pause towards its rescan interval. The pause holds news back, never a
    run falling due: one taken after its due time by the pause (6.4 s by then) is caught here."""

    @sp.workflow("waits-napper")
    def napper(run: sp.Run) -> str:
        run.sleep(0.5)
        return "woke"

    @sp.workflow("waits-unserved")
    def unserved(run: sp.Run) -> None:
        return None

    stop = threading.Event()

    def news() -> None:
        own = sp.open_store(store.url)
        try:
            while not stop.wait(0.02):
                sp.submit(own, unserved)
        finally:
            own.close()

    storm = threading.Thread(target=news, daemon=True)
    with _worker(store, napper.name, rescan=60.0):
        storm.start()
        try:
            time.sleep(7.0)  # the pause has grown past a few seconds: 0.05 s doubled, in a row
            with pytest.raises(Sleeping) as sleeps:
                sp.start(store, napper, run_id="r")
            until = sleeps.value.until
            ended_at = _until(store, "r", RunStatus.COMPLETED)
        finally:
            stop.set()
            storm.join(timeout=30)
    assert until <= ended_at < until + 3_000, "the run waited out the idle pause after it fell due"


def test_a_crash_after_the_wait_recorded_its_message_takes_no_other(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    """The wait step is recorded with the message it took: a resume replays it (the second
    message of the name stays for a next wait) and sends the reply once."""
    import wait_flows

    sp.submit(store, wait_flows.answer, "c-1", run_id="r")
    sp.send(store, "r", "answer", "first")
    sp.send(store, "r", "answer", "second")
    crash_at("step.after_record:answer")
    with pytest.raises(SimulatedCrash):
        sp.resume(store, "r", lease_ms=0)
    crash_at(None)
    assert sp.resume(store, "r") == {"answer": "first", "reply": "re_1"}
    assert [(m.payload, m.taken_by) for m in store.messages("r")] == [("first", "answer"), ("second", None)]
    assert _applied(owner_env) == (1, 0)


def test_a_message_to_a_chain_goes_to_the_run_that_carries_it_on(store: sp.Store) -> None:
    @sp.workflow("waits-chain")
    def chained(run: sp.Run, generation: int) -> Any:
        if generation == 0:
            run.continue_as_new(1)
        return run.wait_for("answer")

    with pytest.raises(AwaitingMessage) as waits:
        sp.start(store, chained, 0, run_id="r")
    successor = waits.value.run_id
    assert successor != "r"
    assert sp.send(store, "r", "answer", 42).run_id == successor
    assert sp.resume(store, "r") == 42


def test_cancelling_a_waiting_run_ends_it(store: sp.Store) -> None:
    import wait_flows

    with pytest.raises(AwaitingMessage):
        sp.start(store, wait_flows.local, "answer", run_id="r")
    assert sp.cancel(store, "r", by="ana", reason="no answer will come").status is RunStatus.CANCELLED
    with pytest.raises(MessageRefused):
        sp.send(store, "r", "answer", 1)


def test_what_a_sender_gives_is_checked_before_anything_is_looked_up(store: sp.Store) -> None:
    with pytest.raises(SecretRefused):
        sp.send(store, "no-such-run", "answer", {"key": "sk_live_" + "a1B2c3D4e5F6g7H8i9J0k1L2"})
    with pytest.raises(NotJSON):
        sp.send(store, "no-such-run", "answer", {"at": object()})  # type: ignore[dict-item]
    with pytest.raises(sp.UsageError):
        sp.send(store, "no-such-run", "", 1)
    with pytest.raises(RunNotFound):
        sp.send(store, "no-such-run", "answer", 1)


def test_a_wait_or_sleep_written_wrong_is_a_usage_error(memory_store: sp.Store) -> None:
    @sp.workflow("waits-wrong")
    def wrong(run: sp.Run, how: str) -> Any:
        if how == "name":
            return run.wait_for("")
        if how == "timeout":
            return run.wait_for("answer", timeout=-1)
        return run.sleep(float("nan"))

    for how in ("name", "timeout", "sleep"):
        with pytest.raises(sp.UsageError):
            sp.start(memory_store, wrong, how, run_id=f"r-{how}")


def test_an_approval_wait_says_its_kind(memory_store: sp.Store, owner_env: OwnerService) -> None:
    from safepoint.testing import owner_effect

    refunds = owner_effect("refunds")

    @sp.workflow("waits-approval-kind")
    def gated(run: sp.Run) -> Any:
        return run.effect("refund", refunds, payload={"amount": 1}, approval=True)

    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, gated, run_id="r")
    waiting_for = memory_store.get_run("r").waiting_for
    assert waiting_for is not None
    assert waiting_for["kind"] == "approval"


def test_waits_on_the_async_store(pg_url: str, owner_env: OwnerService) -> None:
    import uuid

    import wait_flows

    url = f"{pg_url}?schema=w_{uuid.uuid4().hex[:12]}"

    async def main() -> tuple[Any, Any]:
        store = await sp.open_async_store(url)
        try:
            with pytest.raises(AwaitingMessage):
                await sp.start_async(store, wait_flows.answer_async, "c-1", run_id="r")
            message = await sp.send_async(store, "r", "answer", {"ok": True}, message_id="m-1")
            assert (await store.get_run("r")).status is RunStatus.PENDING
            result = await sp.resume_async(store, "r")
            with pytest.raises(Sleeping):
                await sp.start_async(store, wait_flows.sleeper_async, 0.3, run_id="s")
            await asyncio.sleep(0.4)
            slept = await sp.resume_async(store, "s")
            return (result, slept), message
        finally:
            await store.close()

    (result, slept), message = asyncio.run(main())
    assert result == {"answer": {"ok": True}, "reply": "re_1"}
    assert slept == "woke"
    assert message.message_id == "m-1"
    assert _applied(owner_env) == (1, 0)


def test_a_wait_inside_a_fan_out_makes_the_whole_run_wait(store: sp.Store, owner_env: OwnerService) -> None:
    """One branch waits for a message while its sibling sends an effect: the run waits
    (released) only once the sibling's dispatch in flight has its outcome recorded, and once
    the message comes a resume finishes — the effect sent once."""
    import wait_flows

    @sp.workflow("waits-fan-out")
    def fan(run: sp.Run) -> Any:
        return run.parallel(
            "gather",
            {
                "reply": lambda branch: branch.effect("refund", wait_flows.replies, payload={"n": 1})["id"],
                "answer": lambda branch: branch.wait_for("answer"),
            },
        )

    with pytest.raises(AwaitingMessage) as waits:
        sp.start(store, fan, run_id="r")
    assert waits.value.step_id == "gather.answer/answer"
    assert store.get_run("r").status is RunStatus.WAITING
    sp.send(store, "r", "answer", "yes")
    assert sp.resume(store, "r") == {"reply": "re_1", "answer": "yes"}
    assert _applied(owner_env) == (1, 0)


def test_a_run_failed_by_a_wait_timing_out_is_retried_into_a_fresh_wait(store: sp.Store) -> None:
    @sp.workflow("waits-retried")
    def uncaught(run: sp.Run) -> Any:
        return run.wait_for("answer", timeout=0.3)

    with pytest.raises(AwaitingMessage) as first:
        sp.start(store, uncaught, run_id="r")
    time.sleep(0.4)
    with pytest.raises(sp.WaitTimedOut):
        sp.resume(store, "r")
    sp.retry(store, "r", by="ana", reason="the manager is back")  # the timed-out wait moves out
    with pytest.raises(AwaitingMessage) as again:
        sp.resume(store, "r")
    assert again.value.timeout_at is not None
    assert first.value.timeout_at is not None
    assert again.value.timeout_at > first.value.timeout_at  # a wait of its own, its own timeout
    sp.send(store, "r", "answer", "here")
    assert sp.resume(store, "r") == "here"
