"""Replaying recorded runs against changed code, offline, on every store: an unchanged
workflow replays to the run's end (or to where it is), a changed one is reported at the step
where it parts from the record — with what a resume would do there — and nothing is carried
out: no step function called, no effect sent, nothing written."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected, UsageError
from safepoint.storage import Encrypted, Keyring
from safepoint.testing import (
    OwnerService,
    ReplayReport,
    check_deploy,
    owner_effect,
    replay,
    replay_async,
    replay_file_async,
)
from safepoint.testing.replays import _OnLoop
from safepoint.types import StepKind

Calls = dict[str, int]


def _name() -> str:
    return f"replayed-{uuid.uuid4().hex[:8]}"


def _counting(calls: Calls, name: str, value: Any) -> Callable[..., Any]:
    def step(*args: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    step.__qualname__ = name
    return step


def _order_flow(name: str, calls: Calls, *, variant: str = "as recorded", version: str = "1") -> sp.Workflow:
    """A read, a model-like decision, an effect, a pure step, a value, then a wait — changed
    as ``variant`` says."""
    tickets = owner_effect("tickets")
    lookup = _counting(calls, "lookup", {"sku": "A", "stock": 3})
    plan = _counting(calls, "plan", {"next_step_id": "ship"})
    audit = _counting(calls, "audit", "ok")

    @sp.workflow(name, version=version)
    def order(run: sp.Run, order_id: str) -> dict[str, Any]:
        if variant == "added":
            run.read("audit", audit, order_id)
        if variant == "swapped":
            decided = run.decide("plan", plan, order_id)
            found = run.read("lookup", lookup, order_id)
        else:
            found = run.read("lookup", lookup, order_id)
            asked = order_id if variant != "prompt edited" else order_id + " (be brief)"
            decided = (
                run.decide("plan", plan, asked) if variant != "renamed" else run.decide("plan", audit, asked)
            )
        total = run.pure("total", lambda f: f["stock"] * 2, found)
        if variant != "left out":
            run.effect("ship", tickets, payload={"order": order_id, "total": total})
        stamp = run.uuid("stamp")
        word = run.wait_for("confirm")
        return {"decided": decided, "total": total, "stamp": stamp, "word": word}

    return order


def _recorded(store: sp.Store, owner: OwnerService, name: str, calls: Calls) -> str:
    """One run of the workflow as recorded: waiting for "confirm", then confirmed."""
    flow = _order_flow(name, calls)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, flow, "o-1", run_id=run_id)
    sp.send(store, run_id, "confirm", {"by": "ana"}, by="ana")
    sp.resume(store, run_id)
    return run_id


def _untouched(store: sp.Store, owner: OwnerService, run_id: str, calls: Calls) -> Callable[[], None]:
    """A check that nothing was carried out or written since this moment."""
    applied = owner.client.stats()["applied"]
    before, events = dict(calls), len(store.events(run_id))
    ledger = store.load_ledger(run_id)

    def check() -> None:
        assert calls == before, "a step function was called during the replay"
        assert owner.client.stats()["applied"] == applied, "an effect reached its owner"
        assert len(store.events(run_id)) == events
        assert store.load_ledger(run_id) == ledger

    return check


def test_an_unchanged_workflow_replays_to_the_end_and_carries_out_nothing(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    untouched = _untouched(store, owner_env, run_id, calls)
    report = replay(store, run_id)
    untouched()
    assert report.ok, report
    assert report.reached.value == "end"
    assert report.resume.value == "carry on"
    assert report.replayed == report.recorded == len(store.load_ledger(run_id).steps)
    assert report.result == store.get_run(run_id).result


def test_a_run_still_waiting_replays_to_where_it_is(store: sp.Store, owner_env: OwnerService) -> None:
    calls: Calls = {}
    flow = _order_flow(_name(), calls)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, flow, "o-2", run_id="waiting")
    untouched = _untouched(store, owner_env, "waiting", calls)
    report = replay(store, "waiting", flow)
    untouched()
    assert report.ok, report
    assert report.reached.value == "now"
    assert report.next is not None
    assert report.next.kind is StepKind.WAIT
    assert report.next.step_id == "confirm"


@pytest.mark.parametrize(
    ("variant", "kind", "step_id", "resume"),
    [
        ("prompt edited", "changed", "plan", "block"),
        ("renamed", "mismatch", "plan", "block"),
        ("swapped", "order", "plan", "carry on"),
        ("added", "added", "audit", "carry on"),
        ("left out", "order", "stamp", "carry on"),
    ],
)
def test_a_changed_workflow_is_reported_at_the_step_where_it_parts(
    store: sp.Store, owner_env: OwnerService, variant: str, kind: str, step_id: str, resume: str
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    sp.testing.forget_workflows(name)
    changed = _order_flow(name, calls, variant=variant)
    untouched = _untouched(store, owner_env, run_id, calls)
    report = replay(store, run_id, changed)
    untouched()
    assert not report.ok
    assert report.reached.value == "diverged"
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.step_id) == (kind, step_id), report.divergence
    assert report.resume.value == resume, report.why


def test_a_version_bump_is_reported_with_the_rule_a_resume_applies(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    sp.testing.forget_workflows(name)
    report = replay(store, run_id, _order_flow(name, calls, version="2"))
    assert report.ok  # the same steps, in the same order
    assert report.changes == ("version '1' became '2'",)
    assert report.resume.value == "block"
    assert "incompatible_workflow" in report.why


def test_check_deploy_says_what_a_deploy_does_to_every_run_it_takes_over(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    flow = _order_flow(name, calls)
    for i in range(3):
        with pytest.raises(sp.AwaitingMessage):
            sp.start(store, flow, f"o-{i}", run_id=f"deploy-{i}")
    assert check_deploy(store, workflows=[name]).ok
    sp.testing.forget_workflows(name)
    _order_flow(name, calls, variant="prompt edited")
    check = check_deploy(store, workflows=[name])
    assert not check.ok
    assert [r.resume.value for r in check.reports] == ["block"] * 3
    assert check.summary() == "3 runs, 3 block, 3 diverged"


def _fanned(name: str, calls: Calls, *, extra: bool = False) -> sp.Workflow:
    """Two branches of reads, each branch three steps long, then a pure step."""
    price = _counting(calls, "price", 10)

    @sp.workflow(name)
    def quote(run: sp.Run, item: str) -> int:
        def branch(region: str) -> Callable[[sp.Run], int]:
            def go(r: sp.Run) -> int:
                a = r.read("base", price, item, region)
                if extra and region == "us":
                    r.read("tax", price, item, region)
                b = r.read("fee", price, item, region)
                return a + b + r.read("ship", price, item, region)

            return go

        found = run.parallel("prices", {"eu": branch("eu"), "us": branch("us")})
        return run.pure("sum", lambda f: sum(f.values()), found)

    return quote


def test_fan_out_branches_replay_in_any_interleaving_and_an_added_step_is_found_in_its_branch(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    assert sp.start(store, _fanned(name, calls), "x", run_id="fanned") == 60
    untouched = _untouched(store, owner_env, "fanned", calls)
    for _ in range(5):  # the branches interleave differently each time
        report = replay(store, "fanned")
        assert report.ok, report.divergence
        assert report.reached.value == "end"
    untouched()
    sp.testing.forget_workflows(name)
    report = replay(store, "fanned", _fanned(name, calls, extra=True))
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.step_id) == ("added", "prices.us/tax")
    assert report.divergence.recorded is not None
    assert report.divergence.recorded.step_id == "prices.us/fee"
    untouched()


def test_an_async_workflow_replays_as_a_sync_one_and_from_async_code(
    store: sp.Store, owner_env: OwnerService, tmp_path: Path
) -> None:
    """From sync code ``replay``; from async code (a running event loop: an async test)
    ``replay_async`` and ``replay_file_async`` — where ``replay`` says which call to make,
    since an async workflow's replay needs a loop of its own."""
    calls: Calls = {}
    lookup = _counting(calls, "lookup", 3)
    name = _name()

    @sp.workflow(name)
    async def doubled(run: sp.AsyncRun, n: int) -> int:
        found = await run.read("lookup", lookup, n)
        return await run.pure("double", lambda f: f * 2, found)

    run_id = "async-run"
    assert sp.start(store, doubled, 4, run_id=run_id) == 6  # in an event loop of its own
    document = tmp_path / "run.json"
    document.write_text(json.dumps(sp.export_run(store, run_id)))
    untouched = _untouched(store, owner_env, run_id, calls)

    async def an_async_test() -> list[ReplayReport]:
        with pytest.raises(UsageError, match="replay_async"):
            replay(store, run_id)
        return [await replay_async(store, run_id), await replay_file_async(document)]

    for report in [replay(store, run_id), *asyncio.run(an_async_test())]:
        assert report.ok, report
        assert (report.reached.value, report.result) == ("end", 6)
    untouched()


def test_a_run_replays_from_an_async_store_and_other_runs_are_read_on_the_store_s_loop(
    pg_url: str, owner_env: OwnerService
) -> None:
    """``open_async_store``: the run is read on the caller's loop, the replay runs in a thread
    of its own, and what it reads of other runs (a fork's source) is carried out on the loop
    the async store's connections belong to."""
    calls: Calls = {}
    name = _name()
    url = f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}"
    run_id = _recorded_on(url, owner_env, name, calls)
    # a fork from the effect, not yet carried on: a resume would find the source's receipt for
    # its effect step, and so does its replay — a read of another run, made on the store's loop
    with closing(sp.open_store(url)) as sync_store:
        fork_id = sp.fork(sync_store, run_id, from_step="ship", by="ana").run_id
    before, applied = dict(calls), owner_env.client.stats()["applied"]

    async def from_async_code() -> tuple[ReplayReport, ReplayReport, Any]:
        store = await sp.open_async_store(url)
        try:
            report = await replay_async(store, run_id)
            forked = await replay_async(store, fork_id)
            loop = asyncio.get_running_loop()
            read = await asyncio.to_thread(lambda: _OnLoop(store, loop).get_run(run_id))
            return report, forked, read
        finally:
            await store.close()

    report, forked, read = asyncio.run(from_async_code())
    assert report.ok, report
    assert report.reached.value == "end"
    assert forked.ok, forked
    assert (forked.reached.value, forked.family_read) == ("now", True)  # where the fork stands
    assert read.run_id == run_id
    assert calls == before, "a step function was called during the replay"
    assert owner_env.client.stats()["applied"] == applied, "an effect reached its owner"


def _recorded_on(url: str, owner: OwnerService, name: str, calls: Calls) -> str:
    store = sp.open_store(url)
    try:
        return _recorded(store, owner, name, calls)
    finally:
        store.close()


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_a_source_that_took_its_forks_rejection_replays_by_asking_the_family(
    store_url: str, sealed: bool
) -> None:
    """The first run of a family learns that a fork sent an operation only when its own send is
    refused; the rejection it takes from the fork is recorded nowhere in its ledger, and it goes
    on. Its replay asks the family who holds the operation, as its resume did, and reaches the
    end — not a step "added" where the record has none. On a sealed ledger too: the fork's
    rejection is read with the key."""
    codec = Encrypted(Keyring({"k1": Keyring.new_key()}, "k1")) if sealed else None
    store = sp.open_store(store_url, codec=codec)
    sent: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        sent.append(str(key))
        raise sp.Rejected({"why": "the case is closed"})

    notify = sp.Effect("notify", execute=execute)

    @sp.workflow(_name())
    def flow(run: sp.Run) -> str:
        run.read("look", lambda: 1)
        run.wait_for("go")
        try:
            run.effect("notify", notify, payload={"case": 7})
            outcome = "sent"
        except EffectRejected:
            outcome = "refused"
        return str(run.read("after", lambda o: o, outcome))

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, flow, run_id="first")
    fork = sp.fork(store, "first", from_step="look", by="ana")
    for run_id in (fork.run_id, "first"):  # the fork sends first; the source is refused the send
        with pytest.raises(sp.AwaitingMessage):
            sp.resume(store, run_id)
        sp.send(store, run_id, "go", {}, by="ana")
        assert sp.resume(store, run_id) == "refused"
    assert len(sent) == 1
    assert "notify" not in store.load_ledger("first").steps  # a rejection records no step

    report = replay(store, "first")
    store.close()
    assert report.ok, report
    assert (report.reached.value, report.result, report.family_read) == ("end", "refused", True)
    assert len(sent) == 1


def test_a_failed_run_replays_to_its_failure_and_a_fix_is_reported(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()

    def flow(fixed: bool) -> sp.Workflow:
        lookup = _counting(calls, "lookup", {"stock": 0})

        @sp.workflow(name)
        def picky(run: sp.Run, sku: str) -> int:
            found = run.read("lookup", lookup, sku)
            if found["stock"] == 0 and not fixed:
                raise ValueError("out of stock")
            return int(found["stock"])

        return picky

    with pytest.raises(sp.RunFailed):
        sp.start(store, flow(False), "A", run_id="failed")
    untouched = _untouched(store, owner_env, "failed", calls)
    report = replay(store, "failed")
    assert report.ok, report
    assert report.error == {"type": "ValueError", "message": "out of stock"}
    sp.testing.forget_workflows(name)
    report = replay(store, "failed", flow(True))
    untouched()
    assert report.divergence is not None
    assert report.divergence.kind == "outcome"
    assert report.result == 0


def test_a_transaction_step_replays_from_its_record_and_a_changed_one_would_block(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()

    def flow(amount: int) -> sp.Workflow:
        @sp.workflow(name)
        def booked(run: sp.Run, order: str) -> Any:
            def write(conn: Any, value: int) -> int:
                calls["write"] = calls.get("write", 0) + 1
                return value

            return run.transaction("book", write, amount)

        return booked

    assert sp.start(store, flow(5), "o", run_id="booked") == 5
    untouched = _untouched(store, owner_env, "booked", calls)
    assert replay(store, "booked").ok
    sp.testing.forget_workflows(name)
    report = replay(store, "booked", flow(6))
    untouched()
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.step_id) == ("changed", "book")
    assert report.resume.value == "block"  # a transaction step is never asked again


def test_live_from_replays_up_to_the_cut_and_runs_the_rest_against_stubs_only(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    untouched = _untouched(store, owner_env, run_id, calls)
    sent: list[Any] = []

    def stub(payload: Any, key: Any) -> dict[str, Any]:
        sent.append(payload)
        return {"id": "stubbed"}

    sp.testing.forget_workflows(name)
    flow = _order_flow(name, calls, variant="prompt edited")
    before = dict(calls)
    with pytest.raises(sp.errors.UsageError, match="is not a step"):
        replay(store, run_id, flow, live_from="nowhere")
    report = replay(store, run_id, flow, live_from="plan", effects={"owner.tickets": stub})
    assert calls.get("plan", 0) == before.get("plan", 0) + 1  # asked again, live
    assert calls.get("lookup", 0) == before.get("lookup", 0)  # answered from the record
    assert sent == [{"order": "o-1", "total": 6}], report
    # the message the run received after the cut is received again: it goes to the end
    assert report.reached.value == "end"
    assert report.result["word"] == {"by": "ana"}
    assert [step.step_id for step in report.live] == ["plan", "total", "ship", "stamp", "confirm"]
    calls.clear()
    calls.update(before)
    untouched_counts = owner_env.client.stats()["applied"]
    with pytest.raises(sp.errors.UsageError, match="no stub"):
        replay(store, run_id, flow, live_from="plan")
    assert owner_env.client.stats()["applied"] == untouched_counts
    del untouched


def test_a_run_of_every_part_replays_from_its_store_and_from_its_file_alike(
    store: sp.Store, tmp_path: Any
) -> None:
    """Steps of every kind, a failed attempt, an approved effect, a message taken and one
    left: replayed from the store, and from the file ``safepoint export`` writes of it, to
    the same report — the file of a run on SQLite and the one of a run on PostgreSQL alike."""
    import json

    from run_file_flows import record_every_part
    from safepoint.testing import replay_file

    run_id = f"every-{uuid.uuid4().hex[:6]}"
    record_every_part(store, run_id)
    report = replay(store, run_id)
    assert report.ok, report
    assert report.replayed == report.recorded > 5
    path = tmp_path / "run.json"
    path.write_text(json.dumps(sp.export_run(store, run_id)))
    from_file = replay_file(path)
    assert from_file == report
    kinds = {step.kind for step in store.load_ledger(run_id).steps.values()}
    assert kinds == set(StepKind), kinds


def test_a_live_replay_runs_the_code_from_the_cut_with_effects_sent_to_the_stub_only(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    run_id = _recorded(store, owner_env, _name(), calls)
    applied, ledger = owner_env.client.stats()["applied"], store.load_ledger(run_id)
    sent: list[Any] = []

    def stub(payload: Any, key: sp.EffectKey) -> dict[str, str]:
        sent.append(payload)
        return {"id": "stubbed"}

    report = replay(store, run_id, live_from="plan", effects={"owner.tickets": stub})
    assert calls == {"lookup": 1, "plan": 2}  # the read before the cut answered from the record
    assert report.replayed == 1
    assert [s.step_id for s in report.live][:4] == ["plan", "total", "ship", "stamp"]
    assert sent == [{"order": "o-1", "total": 6}]
    assert owner_env.client.stats()["applied"] == applied
    assert store.load_ledger(run_id) == ledger


def test_a_live_replay_that_reaches_an_effect_without_a_stub_says_so_and_sends_nothing(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    run_id = _recorded(store, owner_env, _name(), calls)
    applied = owner_env.client.stats()["applied"]
    with pytest.raises(sp.UsageError, match=r"effect 'owner.tickets', which effects= gives no stub for"):
        replay(store, run_id, live_from="plan", effects={"owner.other": lambda payload, key: {}})

    def unsure(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("the owner did not answer")  # unknown: reconciled with the stub

    with pytest.raises(sp.UsageError, match=r"the stub for effect 'owner.tickets' has no reconcile"):
        replay(store, run_id, live_from="plan", effects={"owner.tickets": unsure})
    assert owner_env.client.stats()["applied"] == applied


def test_a_run_file_from_sqlite_replays_as_the_same_run_from_postgresql(
    pg_url: str, tmp_path: Any, owner_env: OwnerService
) -> None:
    """The same workflow and inputs recorded on each store, exported, and replayed from the
    files — unchanged and with a prompt edited — give the same reports."""
    import json

    from safepoint.testing import replay_file

    name = _name()
    reports: dict[str, list[Any]] = {}
    for kind, url in (
        ("sqlite", f"sqlite:///{tmp_path / 'ledger.db'}"),
        ("postgres", f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}"),
    ):
        store = sp.open_store(url)
        try:
            calls: Calls = {}
            sp.testing.forget_workflows(name)
            run_id = _recorded(store, owner_env, name, calls)
            path = tmp_path / f"{kind}.json"
            path.write_text(json.dumps(sp.export_run(store, run_id)))
        finally:
            store.close()
        sp.testing.forget_workflows(name)
        same = replay_file(path, _order_flow(name, calls))
        sp.testing.forget_workflows(name)
        edited = replay_file(path, _order_flow(name, calls, variant="prompt edited"))
        reports[kind] = [
            (r.reached, r.replayed, r.recorded, r.resume, r.why, r.changes, r.divergence)
            for r in (same, edited)
        ]
    assert reports["sqlite"] == reports["postgres"]
    assert reports["sqlite"][0][0].value == "end"
    assert reports["sqlite"][1][0].value == "diverged"


def test_a_pruned_run_is_not_found_and_check_deploy_never_takes_finished_runs(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """A run pruned away cannot be replayed (``RunNotFound``, naming it); the runs a deploy takes
    over never include a finished one, so pruning them changes nothing a check says."""
    from datetime import timedelta

    calls: Calls = {}
    name = _name()
    assert sp.start(store, _fanned(name, calls), "x", run_id="finished") == 60  # reads only
    waiting = _name()
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, _order_flow(waiting, calls), "o-9", run_id="still-waiting")
    assert replay(store, "finished").ok
    before = check_deploy(store, workflows=[name, waiting])
    assert [r.run_id for r in before.reports] == ["still-waiting"]
    assert sp.prune(store, finished_before=timedelta(0)).runs == 1
    with pytest.raises(sp.errors.RunNotFound, match="finished"):
        replay(store, "finished")
    assert check_deploy(store, workflows=[name, waiting]) == before
