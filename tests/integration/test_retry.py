"""A person retries a failed run: the failed step's record moves into the history, the run is
carried on from it, and the effect ledger is kept — an applied or uncertain effect is never
sent again, a rejected one only when named (under a key derived from its attempt).

Every test runs on SQLite and on PostgreSQL (the ``store`` fixture), against the effect owner
on loopback (``owner_env``)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected, IncompatibleWorkflow, RetryRefused
from safepoint.testing import OwnerRejected, OwnerService, SimulatedCrash, forget_workflows, owner_effect
from safepoint.types import EffectState, EventRecord, RunRetry, RunStatus, StepStatus

tickets = owner_effect("tickets", name="retry.tickets")
charges = owner_effect("charges", name="retry.charges")


def _events(store: sp.Store, run_id: str, kind: str) -> list[EventRecord]:
    return [event for event in store.events(run_id) if event.kind == kind]


def _counted(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return int(stats["applied"]), int(stats["duplicates"])


def _history_is_counted(store: sp.Store, run_id: str) -> None:
    ledger = store.load_ledger(run_id)
    assert (ledger.run.event_count, ledger.run.step_count) == (len(store.events(run_id)), len(ledger.steps))


# -- a read that met a refused connection ----------------------------------------------------------


def _free_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _CaseService(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"case": self.path.rsplit("/", 1)[-1], "customer": "cus_42"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def case_port() -> Iterator[tuple[int, threading.Event]]:
    """A port with nothing listening until the test sets the event it yields: then a real HTTP
    service answers there."""
    port, up = _free_port(), threading.Event()
    servers: list[ThreadingHTTPServer] = []

    def serve() -> None:
        up.wait()
        server = ThreadingHTTPServer(("127.0.0.1", port), _CaseService)
        servers.append(server)
        server.serve_forever(poll_interval=0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, up
    up.set()
    for _ in range(100):
        if servers:
            servers[0].shutdown()
            servers[0].server_close()
            break
        threading.Event().wait(0.05)


def fetch_case(port: int, case_id: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", f"/cases/{case_id}")
        found: dict[str, Any] = json.loads(conn.getresponse().read())
        return found
    finally:
        conn.close()


@sp.workflow("retry-refused-read")
def follow_up(run: sp.Run, port: int, case_id: str) -> dict[str, Any]:
    ticket = run.effect("ticket", tickets, payload={"case": case_id}, operation_id=f"ticket:{case_id}")
    case = run.read("case.fetch", fetch_case, port, case_id)
    return {"ticket": ticket["id"], "customer": case["customer"]}


def _wait_listening(port: int) -> None:
    for _ in range(200):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        threading.Event().wait(0.01)
    raise AssertionError(f"nothing came to listen on {port}")


def test_a_retry_after_a_refused_read_finishes_the_run_and_sends_the_ticket_once(
    store: sp.Store, owner_env: OwnerService, case_port: tuple[int, threading.Event]
) -> None:
    port, service_up = case_port
    with pytest.raises(sp.StepFailed, match="ConnectionRefusedError"):
        sp.start(store, follow_up, port, "c-1", run_id="r")
    failed = store.get_run("r")
    assert (failed.status, failed.error["step_id"]) == (RunStatus.FAILED, "case.fetch")
    # resuming replays the failure, and says how to carry the run on instead of starting anew
    with pytest.raises(sp.RunFailed, match="safepoint retry r"):
        sp.resume(store, "r")
    # the ticket was sent: a retry never sends it again, even when asked to
    with pytest.raises(RetryRefused, match="accepted: what happened is never sent again"):
        sp.retry(store, "r", by="ana", resend=["ticket:c-1"])

    service_up.set()
    _wait_listening(port)
    retried = sp.retry(store, "r", by="ana", reason="the case service is back")
    assert (retried.status, retried.error, retried.owner) == (RunStatus.PENDING, None, None)
    assert sp.resume(store, "r") == {"ticket": "tk_1", "customer": "cus_42"}

    assert _counted(owner_env) == (1, 0)  # one ticket for one case
    ledger = store.load_ledger("r")
    assert ledger.run.status is RunStatus.COMPLETED
    assert ledger.steps["case.fetch"].status is StepStatus.COMPLETED
    assert ledger.operations["ticket:c-1"].dispatch_count == 1
    (moved,) = _events(store, "r", "step.retried")
    assert moved.step_id == "case.fetch"
    assert moved.detail["status"] == "failed"
    assert moved.detail["error"]["type"] == "ConnectionRefusedError"
    (asked,) = _events(store, "r", "run.retried")
    assert asked.worker == "ana"
    assert asked.detail == {
        "by": "ana",
        "reason": "the case service is back",
        "step_id": "case.fetch",
        "moved": ["case.fetch"],
        "resent": [],
    }
    _history_is_counted(store, "r")


# -- a bug in the workflow, fixed and deployed -------------------------------------------------------


def _register_buggy() -> sp.Workflow:
    forget_workflows("retry-fixed-bug")

    @sp.workflow("retry-fixed-bug", version="1")
    def buggy(run: sp.Run, case_id: str) -> dict[str, Any]:
        ticket = run.effect("ticket", tickets, payload={"case": case_id}, operation_id=f"ticket:{case_id}")
        case = run.read("case.fetch", _local_case, case_id)
        return {"ticket": ticket["id"], "total": case["amount"] * case["quantity"]}  # no quantity

    return buggy


_fetched: list[str] = []


def _local_case(case_id: str) -> dict[str, Any]:
    _fetched.append(case_id)
    return {"case": case_id, "amount": 1250}


def _register_fixed(version: str = "1", compatibility: str = "refuse") -> sp.Workflow:
    forget_workflows("retry-fixed-bug")

    @sp.workflow("retry-fixed-bug", version=version, compatibility=compatibility)
    def fixed(run: sp.Run, case_id: str) -> dict[str, Any]:
        ticket = run.effect("ticket", tickets, payload={"case": case_id}, operation_id=f"ticket:{case_id}")
        case = run.read("case.fetch", _local_case, case_id)
        return {"ticket": ticket["id"], "total": case["amount"] * case.get("quantity", 1)}

    return fixed


def test_a_retry_after_a_fixed_bug_finishes_the_run_under_the_fixed_code(
    store: sp.Store, owner_env: OwnerService
) -> None:
    _fetched.clear()
    with pytest.raises(sp.RunFailed, match="KeyError"):
        sp.start(store, _register_buggy(), "c-2", run_id="r")
    assert store.get_run("r").error["type"] == "KeyError"
    _register_fixed()  # the fix, deployed under the same name and version
    retried = sp.retry(store, "r", by="ana", reason="quantity defaults to 1 now")
    assert retried.status is RunStatus.PENDING
    assert sp.resume(store, "r") == {"ticket": "tk_1", "total": 1250}
    assert _counted(owner_env) == (1, 0)
    assert _fetched == ["c-2"]  # the read replayed: nothing recorded is asked again
    assert _events(store, "r", "step.retried") == []  # the workflow itself raised: no step moved
    (asked,) = _events(store, "r", "run.retried")
    assert (asked.detail["step_id"], asked.detail["moved"]) == (None, [])
    _history_is_counted(store, "r")


def test_a_retried_run_meets_the_compatibility_policy_as_any_resume_does(
    store: sp.Store, owner_env: OwnerService
) -> None:
    with pytest.raises(sp.RunFailed):
        sp.start(store, _register_buggy(), "c-3", run_id="r")
    _register_fixed(version="2")  # another version, refused by default
    sp.retry(store, "r", by="ana")
    with pytest.raises(IncompatibleWorkflow):
        sp.resume(store, "r")
    _register_fixed(version="2", compatibility="replan")
    assert sp.resume(store, "r") == {"ticket": "tk_1", "total": 1250}
    assert _counted(owner_env) == (1, 0)


# -- uncertain effects are never sent again -----------------------------------------------------------


def test_a_run_blocked_on_an_uncertain_effect_is_not_retried(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    unreconcilable = owner_effect("tickets", name="retry.tickets.blind", reconcile=False)

    @sp.workflow("retry-blocked")
    def flow(run: sp.Run) -> str:
        return str(run.effect("ticket", unreconcilable, payload={"case": "c-4"})["id"])

    crash_at("effect.after_receiver_commit")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(store, "r")
    before = store.get_run("r")
    with pytest.raises(RetryRefused, match=r"blocked.*never sent again by a retry"):
        sp.retry(store, "r", by="ana", resend=["ticket"])
    with pytest.raises(RetryRefused, match="blocked"):
        sp.retry(store, "r", by="ana")
    assert store.get_run("r") == before
    assert _counted(owner_env) == (1, 0)


def test_an_uncertain_effect_of_a_failed_run_is_reconciled_never_sent_again(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    @sp.workflow("retry-uncertain")
    def flow(run: sp.Run) -> str:
        return str(run.effect("ticket", tickets, payload={"case": "c-5"})["id"])

    crash_at("effect.after_receiver_commit")  # the owner has it; the ledger says "dispatching"
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    # ended failed while its operation was in flight (by hand, say)
    run = store.get_run("r")
    claim = store.claim_run("r", run.state_revision, "ops", 1_000)
    assert claim is not None
    store.finish_run(claim, RunStatus.FAILED, error={"type": "RuntimeError", "message": "ended by hand"})
    assert store.load_ledger("r").operations["ticket"].state is EffectState.DISPATCHING

    with pytest.raises(RetryRefused, match="uncertain, so it is reconciled"):
        sp.retry(store, "r", by="ana", resend=["ticket"])
    sp.retry(store, "r", by="ana")
    assert sp.resume(store, "r") == "tk_1"
    op = store.load_ledger("r").operations["ticket"]
    assert (op.state, op.dispatch_count, op.key_attempt) == (EffectState.ACCEPTED, 1, 1)
    assert _counted(owner_env) == (1, 0)


# -- a rejected effect, sent again only when named ---------------------------------------------------


@sp.workflow("retry-rejected")
def pay(run: sp.Run, amount: int) -> str:
    return str(run.effect("charge", charges, payload={"amount": amount}, operation_id="charge:c-6")["id"])


def test_a_rejected_effect_is_sent_again_only_when_named_under_a_derived_key(
    store: sp.Store, owner_env: OwnerService
) -> None:
    owner_env.client.set_faults(decline=1)
    with pytest.raises(EffectRejected):
        sp.start(store, pay, 5, run_id="r")
    failed = store.get_run("r")
    assert (failed.error["step_id"], failed.error["operation_id"]) == ("charge", "charge:c-6")
    first = store.load_ledger("r").operations["charge:c-6"]
    assert (first.state, first.key_attempt, first.dispatch_count) == (EffectState.REJECTED, 1, 1)

    # not named: the retry replays the rejection, and nothing is sent
    sp.retry(store, "r", by="ana")
    with pytest.raises(EffectRejected):
        sp.resume(store, "r")
    assert store.load_ledger("r").operations["charge:c-6"].dispatch_count == 1
    assert _counted(owner_env) == (0, 0)
    # the owner keeps its refusal under the first key: sent again under it, it would refuse again
    with pytest.raises(OwnerRejected):
        owner_env.client.create("charges", {"amount": 5}, idempotency_key=first.effect_key)

    resent = sp.retry(store, "r", by="ana", reason="the card was updated", resend=["charge"])
    assert resent.status is RunStatus.PENDING
    again = store.load_ledger("r").operations["charge:c-6"]
    assert (again.state, again.key_attempt, again.dispatch_count) == (EffectState.PREPARED, 2, 0)
    assert (again.error, again.receipt, again.first_dispatched_at) == (None, None, None)
    assert again.effect_key != first.effect_key
    assert again.effect_key.startswith("sp_")

    assert sp.resume(store, "r") == "ch_1"
    done = store.load_ledger("r").operations["charge:c-6"]
    assert (done.state, done.key_attempt, done.effect_key) == (EffectState.ACCEPTED, 2, again.effect_key)
    assert owner_env.client.find_by_key("charges", again.effect_key)["id"] == "ch_1"  # the derived key
    assert owner_env.client.find_by_key("charges", first.effect_key) is None
    assert _counted(owner_env) == (1, 0)
    (recorded,) = _events(store, "r", "run.retried")[-1].detail["resent"]
    assert (recorded["operation_id"], recorded["key_attempt"], recorded["effect_key"]) == (
        "charge:c-6",
        2,
        again.effect_key,
    )
    previous = recorded["previous"]  # what the rejected attempt had recorded, kept
    assert (previous["key_attempt"], previous["effect_key"], previous["error"]) == (
        1,
        first.effect_key,
        first.error,
    )
    _history_is_counted(store, "r")


@sp.workflow("retry-rejected-async")
async def pay_async(run: sp.AsyncRun, amount: int) -> str:
    receipt = await run.effect("charge", charges, payload={"amount": amount}, operation_id="charge:c-6")
    return str(receipt["id"])


def test_resend_names_only_a_rejected_operation_of_the_run(store: sp.Store, owner_env: OwnerService) -> None:
    owner_env.client.set_faults(decline=1)
    with pytest.raises(EffectRejected):
        sp.start(store, pay, 5, run_id="r")
    for name in ("charge:c-7", "nothing-of-the-run"):
        with pytest.raises(RetryRefused, match=r"what resend can name .*'charge:c-6' \(step 'charge'\)"):
            sp.retry(store, "r", by="ana", resend=[name])
    with pytest.raises(RetryRefused, match="'charge' did not fail; no step of the run failed"):
        sp.retry(store, "r", by="ana", step="charge")
    assert store.get_run("r").status is RunStatus.FAILED
    assert _events(store, "r", "run.retried") == []


# -- what cannot be retried ---------------------------------------------------------------------------


@sp.workflow("retry-raises")
def raises(run: sp.Run, fail: bool) -> str:
    run.pure("pure.note", str, fail)
    if fail:
        raise ValueError("no")
    return "fine"


def test_a_stale_revision_is_refused_and_changes_nothing(store: sp.Store) -> None:
    with pytest.raises(sp.RunFailed):
        sp.start(store, raises, True, run_id="r")
    run = store.get_run("r")
    with pytest.raises(RetryRefused, match=f"moved since revision {run.state_revision - 1}"):
        sp.retry(store, "r", by="ana", expected_revision=run.state_revision - 1)
    with pytest.raises(RetryRefused, match="moved since revision"):  # the store's own check
        store.retry_run("r", run.state_revision - 1, RunRetry(by="ana"))
    assert store.get_run("r") == run
    # two people retrying from the revision they both looked at: one of them does
    assert sp.retry(store, "r", by="ana", expected_revision=run.state_revision).status is RunStatus.PENDING
    with pytest.raises(RetryRefused, match="it is pending"):
        sp.retry(store, "r", by="bo", expected_revision=run.state_revision)
    assert [e.worker for e in _events(store, "r", "run.retried")] == ["ana"]


def test_a_completed_pending_or_running_run_is_not_retried(store: sp.Store, crash_at: Any) -> None:
    assert sp.start(store, raises, False, run_id="done") == "fine"
    with pytest.raises(RetryRefused, match="completed: its result stands"):
        sp.retry(store, "done", by="ana")
    sp.submit(store, raises, False, run_id="queued")
    with pytest.raises(RetryRefused, match="it is pending"):
        sp.retry(store, "queued", by="ana")
    crash_at("step.after_record")
    with pytest.raises(SimulatedCrash):
        sp.start(store, raises, False, run_id="held")
    crash_at(None)
    with pytest.raises(RetryRefused, match="it is running: it is being carried on"):
        sp.retry(store, "held", by="ana")
    with pytest.raises(sp.UsageError, match="say who retries the run"):
        sp.retry(store, "done", by="")
    with pytest.raises(sp.errors.RunNotFound):
        sp.retry(store, f"absent-{uuid.uuid4().hex}", by="ana")


# -- a failed step named, and its attempts ------------------------------------------------------------


def test_a_named_failed_step_runs_again_with_its_attempts_counted_from_one(store: sp.Store) -> None:
    calls: list[int] = []

    def quote(n: int) -> int:
        calls.append(n)
        if len(calls) == 2:  # not an error the step retries: it fails, on its second attempt
            raise ConnectionError("call 2 was refused")
        if len(calls) <= 3:
            raise TimeoutError(f"call {len(calls)} timed out")
        return 42

    @sp.workflow("retry-named-step")
    def flow(run: sp.Run) -> int:
        try:
            policy = sp.Retry(attempts=2, backoff=0, retry_on=(TimeoutError,))
            return int(run.read("quote", quote, 1, retry=policy))
        except sp.StepFailed:
            raise ValueError("no quote, no offer") from None  # the workflow's own error

    with pytest.raises(sp.RunFailed, match="ValueError"):
        sp.start(store, flow, run_id="r")
    assert len(calls) == 2
    # the run's error is the workflow's own: no step is taken up unless named
    sp.retry(store, "r", by="ana")
    with pytest.raises(sp.RunFailed, match="ValueError"):
        sp.resume(store, "r")
    assert len(calls) == 2  # the failure replayed
    sp.retry(store, "r", by="ana", step="quote")
    assert sp.resume(store, "r") == 42
    assert len(calls) == 4  # two attempts again: the third call failed, the fourth answered
    ledger = store.load_ledger("r")
    assert ledger.steps["quote"].attempt == 2
    assert [tried.attempt for tried in ledger.attempts["quote"]] == [1]  # this round's
    (moved,) = _events(store, "r", "step.retried")
    assert (moved.detail["attempt"], [a["attempt"] for a in moved.detail["attempts"]]) == (2, [1])
    _history_is_counted(store, "r")


# -- async ----------------------------------------------------------------------------------------------


def test_retry_async_carries_a_failed_run_on(store: sp.Store) -> None:
    with pytest.raises(sp.RunFailed):
        sp.start(store, raises, True, run_id="r")

    async def main() -> sp.types.RunRecord:
        return await sp.retry_async(store, "r", by="ana", reason="from async code")

    assert asyncio.run(main()).status is RunStatus.PENDING


def test_retry_async_on_the_async_postgres_store(pg_url: str, owner_env: OwnerService) -> None:
    url = f"{pg_url}?schema=a_{uuid.uuid4().hex[:12]}"
    owner_env.client.set_faults(decline=1)

    async def main() -> tuple[Any, Any]:
        store = await sp.open_async_store(url)
        try:
            with pytest.raises(EffectRejected):
                await sp.start_async(store, pay_async, 5, run_id="r")
            retried = await sp.retry_async(store, "r", by="ana", resend="charge:c-6")
            return retried, await sp.resume_async(store, "r")
        finally:
            await store.close()

    retried, result = asyncio.run(main())
    assert (retried.status, result) == (RunStatus.PENDING, "ch_1")
    assert _counted(owner_env) == (1, 0)
