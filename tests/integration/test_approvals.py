"""Approvals bound to digests, and verifiers with a timeout, end to end on SQLite files and on
PostgreSQL, counted at the real HTTP effect owner.

An effect run with ``approval=True`` is prepared and then waits (status ``waiting``) until a
person approves exactly that payload on the target's state the run saw; a changed payload, a
changed target or an expired approval makes it wait again. A verifier that does not answer in
time blocks the run and never causes another dispatch.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._rules.canonical import canonical, digest
from safepoint.errors import ApprovalInvalid, ApprovalRefused, RunNotFound, SecretRefused, VerificationFailed
from safepoint.ops.cli import cli
from safepoint.testing import OwnerService, SimulatedCrash, forget_workflows, owner_effect
from safepoint.types import EffectState, RunStatus

PAYLOAD = {"account": "acct-1", "amount": 40}


def _refund_flow(name: str, effect: sp.Effect, payload: Any = None) -> sp.Workflow:
    """A workflow whose one effect needs approval; ``payload`` may be a callable, read each time
    the workflow runs (a payload that changes between runs)."""

    @sp.workflow(name)
    def flow(run: sp.Run) -> Any:
        body = payload() if callable(payload) else (payload or PAYLOAD)
        receipt = run.effect("refund", effect, payload=body, approval=True)
        return {"refund": receipt["id"], "amount": receipt["amount"]}

    return flow


def _chained_refund_flow(name: str) -> sp.Workflow:
    """A chain whose first run continues as new at once; its successor asks for approval."""
    refunds = owner_effect("refunds")

    @sp.workflow(name)
    def flow(run: sp.Run, generation: int) -> Any:
        if generation == 0:
            run.continue_as_new(1)
        return run.effect("refund", refunds, payload=PAYLOAD, approval=True)["amount"]

    return flow


def _applied(owner: OwnerService) -> int:
    return int(owner.client.stats()["applied"])


def test_an_effect_that_needs_approval_waits_with_its_prepared_payload(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-waits", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval) as waits:
        sp.start(store, flow, run_id="r")
    assert not isinstance(waits.value, ApprovalInvalid)  # nothing was approved yet
    assert not isinstance(waits.value, sp.RunBlocked)  # a pause, not a failure
    expected = digest(canonical(PAYLOAD))
    assert (
        waits.value.run_id,
        waits.value.step_id,
        waits.value.operation_id,
        waits.value.payload_digest,
        waits.value.target_digest,
    ) == ("r", "refund", "refund", expected, None)
    assert "safepoint approve r refund" in waits.value.message
    run = store.get_run("r")
    assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.WAITING, None, None)
    assert run.waiting_for is not None
    assert run.waiting_for["payload_digest"] == expected
    # the exact payload is durable, for the person to look at
    assert json.loads(store.get_artifact(expected)) == PAYLOAD
    op = store.load_ledger("r").operations["refund"]
    assert (op.state, op.dispatch_count, op.approval_required) == (EffectState.PREPARED, 0, True)
    assert _applied(owner_env) == 0
    with pytest.raises(sp.AwaitingApproval):  # a resume looks again, and waits again
        sp.resume(store, "r")
    assert _applied(owner_env) == 0
    store.close()


def test_approve_then_resume_dispatches_exactly_once(store_url: str, owner_env: OwnerService) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-dispatches-once", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    approval = sp.approve(
        store, "r", "refund", by="ana", expires=timedelta(hours=2), evidence="ticket OPS-12"
    )
    assert (approval.approved_by, approval.payload_digest) == ("ana", digest(canonical(PAYLOAD)))
    assert store.get_run("r").status is RunStatus.PENDING  # claimable again
    result = sp.resume(store, "r")
    assert result["amount"] == 40
    assert sp.resume(store, "r") == result
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    op = store.load_ledger("r").operations["refund"]
    assert (op.state, op.dispatch_count, op.approval_id) == (EffectState.ACCEPTED, 1, approval.approval_id)
    kinds = [e.kind for e in store.events("r")]
    assert kinds.index("run.waiting") < kinds.index("effect.approved") < kinds.index("effect.dispatching")
    store.close()


def test_a_changed_payload_withdraws_the_approval_and_the_run_waits_again(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    amount = {"value": 40}
    flow = _refund_flow(
        "approval-payload-changed",
        owner_effect("refunds"),
        lambda: {"account": "acct-1", "amount": amount["value"]},
    )
    with pytest.raises(sp.AwaitingApproval) as first:
        sp.start(store, flow, run_id="r")
    sp.approve(store, "r", "refund", by="ana", payload_digest=first.value.payload_digest)
    amount["value"] = 400  # the agent now wants to send something else
    with pytest.raises(ApprovalInvalid, match="payload changed") as again:
        sp.resume(store, "r")
    assert again.value.payload_digest == digest(canonical({"account": "acct-1", "amount": 400}))
    assert store.get_run("r").status is RunStatus.WAITING
    assert _applied(owner_env) == 0
    # approving what was seen before is refused: the effect no longer carries it
    with pytest.raises(ApprovalRefused, match="now carries"):
        sp.approve(store, "r", "refund", by="ana", payload_digest=first.value.payload_digest)
    sp.approve(store, "r", "refund", by="ana", payload_digest=again.value.payload_digest)
    assert sp.resume(store, "r")["amount"] == 400
    assert _applied(owner_env) == 1
    store.close()


def test_a_changed_target_state_withdraws_the_approval(store_url: str, owner_env: OwnerService) -> None:
    store = sp.open_store(store_url)
    balances = {"acct-1": 100}
    effect = replace(
        owner_effect("refunds"), target_state=lambda payload: {"balance": balances[payload["account"]]}
    )
    flow = _refund_flow("approval-target-changed", effect)
    with pytest.raises(sp.AwaitingApproval) as waits:
        sp.start(store, flow, run_id="r")
    seen = digest(canonical({"balance": 100}))
    assert waits.value.target_digest == seen
    approval = sp.approve(store, "r", "refund", by="ana")
    assert approval.target_digest == seen  # bound to the state the run waited on
    balances["acct-1"] = 5  # someone else spent the balance meanwhile
    with pytest.raises(ApprovalInvalid, match="target's state changed") as invalid:
        sp.resume(store, "r")
    assert invalid.value.target_digest == digest(canonical({"balance": 5}))
    assert store.get_run("r").status is RunStatus.WAITING
    assert _applied(owner_env) == 0
    sp.approve(store, "r", "refund", by="ana")  # approving the state as it now is
    sp.resume(store, "r")
    assert _applied(owner_env) == 1
    store.close()


def test_an_expired_approval_no_longer_authorizes_the_dispatch(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-expired", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    approval = sp.approve(store, "r", "refund", by="ana", expires=timedelta(milliseconds=50))
    assert approval.expires_at == approval.approved_at + 50  # on the store's clock
    time.sleep(0.2)
    with pytest.raises(ApprovalInvalid, match="expired"):
        sp.resume(store, "r")
    assert store.get_run("r").status is RunStatus.WAITING
    assert _applied(owner_env) == 0
    sp.approve(store, "r", "refund", by="ana", expires=datetime.now(UTC) + timedelta(minutes=5))
    sp.resume(store, "r")
    assert _applied(owner_env) == 1
    store.close()


def test_an_approval_given_before_the_run_waits_is_not_lost(
    store_url: str, owner_env: OwnerService, crash_at: Any
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-before-wait", owner_effect("refunds"))
    crash_at("effect.after_prepared")  # prepared, never reached its gate
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert store.get_run("r").status is RunStatus.RUNNING
    sp.approve(store, "r", "refund", by="ana")  # the person was quicker than the run
    assert store.get_run("r").status is RunStatus.RUNNING
    assert sp.resume(store, "r")["amount"] == 40
    assert "run.waiting" not in [e.kind for e in store.events("r")]
    assert _applied(owner_env) == 1
    store.close()


def test_a_worker_does_not_take_a_waiting_run_until_it_is_approved(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-worker", owner_effect("refunds"))
    sp.submit(store, flow, run_id="r")

    def work() -> Any:
        return sp.Worker(store, workflows=["approval-worker"]).run(until_idle=True, handle_signals=False)

    first = work()
    assert (first.claimed, first.waiting, first.failed) == (1, 1, 0)
    assert store.get_run("r").status is RunStatus.WAITING
    assert work().claimed == 0  # waiting is not runnable
    sp.approve(store, "r", "refund", by="ana")
    done = work()
    assert (done.claimed, done.completed) == (1, 1)
    assert store.get_run("r").status is RunStatus.COMPLETED
    assert _applied(owner_env) == 1
    store.close()


def test_cancelling_a_waiting_run_ends_it_at_once(store_url: str, owner_env: OwnerService) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-cancel", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    ended = sp.cancel(store, "r", by="ops", reason="customer withdrew")
    assert (ended.status, ended.waiting_for) == (RunStatus.CANCELLED, None)
    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r")
    with pytest.raises(ApprovalRefused, match="cancelled"):
        sp.approve(store, "r", "refund", by="ana")
    assert _applied(owner_env) == 0
    store.close()


def test_a_re_dispatch_after_not_applied_needs_a_still_valid_approval(memory_store: sp.Store) -> None:
    calls: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        calls.append("execute")
        time.sleep(1.5)  # long enough for the approval to lapse
        raise TimeoutError("no answer from the owner")

    effect = sp.Effect(
        "refund",
        execute=execute,
        reconcile=lambda key: calls.append("reconcile") or sp.NotApplied(),
        dedup_retention=timedelta(hours=1),
    )
    flow = _refund_flow("approval-redispatch", effect)
    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    sp.approve(memory_store, "r", "refund", by="ana", expires=timedelta(seconds=1))
    with pytest.raises(ApprovalInvalid, match="expired"):
        sp.resume(memory_store, "r")
    # sent once; the owner says it never arrived, but the approval lapsed: no second send
    assert calls == ["execute", "reconcile"]
    ledger = memory_store.load_ledger("r")
    assert (ledger.run.status, ledger.operations["refund"].state) == (RunStatus.WAITING, EffectState.UNKNOWN)
    # a cancel now settles the uncertain effect first, and still sends nothing
    assert sp.cancel(memory_store, "r", by="ops").status is RunStatus.PENDING
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")
    assert calls == ["execute", "reconcile", "reconcile"]
    assert memory_store.get_run("r").status is RunStatus.CANCELLED


def test_a_target_state_that_cannot_be_read_sends_nothing(memory_store: sp.Store) -> None:
    sent: list[Any] = []

    def balance(payload: Any) -> Any:
        raise ConnectionError("the ledger service is down")

    effect = sp.Effect(
        "refund", execute=lambda p, k: sent.append(p) or {"id": "re_1", **p}, target_state=balance
    )
    flow = _refund_flow("approval-target-unreadable", effect)
    with pytest.raises(sp.RunFailed, match="ConnectionError"):
        sp.start(memory_store, flow, run_id="r")
    assert sent == []
    assert memory_store.load_ledger("r").operations == {}  # not even prepared


def test_approving_a_step_that_has_not_prepared_its_effect_is_refused(memory_store: sp.Store) -> None:
    @sp.workflow("approval-early")
    def flow(run: sp.Run) -> Any:
        return run.pure("first", lambda: 1)

    sp.submit(memory_store, flow, run_id="r")
    with pytest.raises(ApprovalRefused, match="no prepared effect"):
        sp.approve(memory_store, "r", "refund", by="ana")
    with pytest.raises(RunNotFound):
        sp.approve(memory_store, "nope", "refund", by="ana")
    with pytest.raises(sp.UsageError, match="by="):
        sp.approve(memory_store, "r", "refund", by="")
    with pytest.raises(sp.UsageError, match="timezone"):
        sp.approve(memory_store, "r", "refund", by="ana", expires=datetime(2030, 1, 1))
    with pytest.raises(sp.UsageError, match="digest"):
        sp.approve(memory_store, "r", "refund", by="ana", payload_digest="abc")


def test_an_approval_refuses_credentials_in_who_and_why(memory_store: sp.Store) -> None:
    flow = _refund_flow("approval-secrets", sp.Effect("refund", execute=lambda p, k: {"id": "re_1", **p}))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    with pytest.raises(SecretRefused):
        sp.approve(
            memory_store, "r", "refund", by="ana", evidence="approved, key sk_live_0123456789abcdefXYZ"
        )
    assert memory_store.approvals("r") == []
    assert memory_store.get_run("r").status is RunStatus.WAITING


def test_approving_twice_returns_the_same_approval(memory_store: sp.Store) -> None:
    flow = _refund_flow("approval-twice", sp.Effect("refund", execute=lambda p, k: {"id": "re_1", **p}))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    first = sp.approve(memory_store, "r", "refund", by="ana")
    assert sp.approve(memory_store, "r", "refund", by="ana") == first
    assert memory_store.approvals("r") == [first]
    assert sp.resume(memory_store, "r") == {"refund": "re_1", "amount": 40}


def test_the_recovery_record_names_the_approval_that_authorized_the_dispatch(
    memory_store: sp.Store, owner_env: OwnerService
) -> None:
    import jsonschema

    from safepoint import record_schema

    # no read path: a lost response blocks the run for a person
    flow = _refund_flow(
        "approval-record",
        owner_effect("notifications", reconcile=False, dedup_retention=None),
        {"to": "ops", "amount": 1},
    )
    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    approval = sp.approve(memory_store, "r", "refund", by="ana")
    owner_env.client.set_faults(drop_after_commit=1)
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(memory_store, "r")
    record = memory_store.get_run("r").recovery_record
    assert record is not None
    assert record["authorization_ref"] == f"approval:r/refund/{approval.approval_id}"
    assert record["authorization_ref"] in record["evidence_refs"]
    assert (
        record["evidence"]["authorization"]["by"],
        record["evidence"]["authorization"]["payload_digest"],
    ) == ("ana", approval.payload_digest)
    jsonschema.validate(record, record_schema())


def test_approve_show_and_runs_from_the_command_line(file_store: sp.Store, owner_env: OwnerService) -> None:
    flow = _refund_flow("approval-cli", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval) as waits:
        sp.start(file_store, flow, run_id="r")
    url, runner = file_store.url, CliRunner()
    env = {"COLUMNS": "200", "FORCE_COLOR": None, "TTY_COMPATIBLE": None}
    listed = runner.invoke(cli, ["--store", url, "runs"], env=env)
    assert listed.exit_code == 0, listed.output
    assert "waiting" in listed.output
    assert "approval of refund" in listed.output
    shown = runner.invoke(cli, ["--store", url, "show", "r"], env=env)
    assert shown.exit_code == 0, shown.output
    digest_ = waits.value.payload_digest
    assert "waiting for approval" in shown.output
    assert '"amount": 40' in shown.output  # the person sees what they approve
    assert digest_ in shown.output
    assert f"safepoint approve r refund --by <you> --payload-digest {digest_}" in shown.output
    recorded = runner.invoke(cli, ["--store", url, "record", "r"], env=env)
    assert recorded.exit_code == 1
    assert "waits for approval of step 'refund'" in recorded.output
    resumed = runner.invoke(cli, ["--store", url, "resume", "r"], env=env)
    assert resumed.exit_code == 4, resumed.output
    assert "waits for approval" in resumed.output
    wrong = runner.invoke(
        cli,
        ["--store", url, "approve", "r", "refund", "--by", "ana", "--payload-digest", "sha256:" + "0" * 64],
        env=env,
    )
    assert wrong.exit_code == 1
    assert "refused" in wrong.output
    bad = runner.invoke(
        cli, ["--store", url, "approve", "r", "refund", "--by", "ana", "--expires", "soon"], env=env
    )
    assert bad.exit_code == 2
    assert "--expires" in bad.output
    done = runner.invoke(
        cli,
        [
            "--store",
            url,
            "approve",
            "r",
            "refund",
            "--by",
            "ana",
            "--expires",
            "2h",
            "--evidence",
            "ticket OPS-12",
            "--payload-digest",
            digest_,
        ],
        env=env,
    )
    assert done.exit_code == 0, done.output
    assert "run now pending" in done.output
    [approval] = file_store.approvals("r")
    assert approval.expires_at is not None
    assert abs(approval.expires_at - approval.approved_at - 2 * 3_600_000) < 1_000
    assert approval.evidence == "ticket OPS-12"
    assert sp.resume(file_store, "r")["amount"] == 40
    assert _applied(owner_env) == 1


def test_a_verifier_that_times_out_blocks_and_a_resume_never_dispatches_again(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    answer = threading.Event()
    looked: list[str] = []

    def slow_to_verify(receipt: Any) -> bool:
        looked.append(receipt["id"])
        answer.wait(10)  # hangs until the test lets it answer
        return owner_env.client.get("tickets", receipt["id"]) is not None

    effect = replace(owner_effect("tickets"), verify=slow_to_verify, verify_timeout=1.0)

    @sp.workflow("verify-timeout")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", effect, payload={"title": "refund"})["id"]

    started = time.monotonic()
    with pytest.raises(VerificationFailed, match=r"did not answer within 1s"):
        sp.start(store, flow, run_id="r")
    assert time.monotonic() - started < 5  # abandoned at the timeout, not waited out
    record = store.get_run("r").recovery_record
    assert record is not None
    assert (record["phase"], record["effect_status"]) == ("verify_effect", "applied")
    with pytest.raises(VerificationFailed):  # still no answer: blocked again
        sp.resume(store, "r")
    assert _applied(owner_env) == 1
    answer.set()
    assert sp.resume(store, "r") == "tk_1"  # only the verifier ran again
    assert len(looked) == 3
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    ops = store.load_ledger("r").operations["ticket"]
    assert (ops.state, ops.dispatch_count) == (EffectState.ACCEPTED, 1)
    store.close()


def test_an_async_workflow_waits_for_approval_and_times_out_its_verifiers(
    pg_url: str, owner_env: OwnerService
) -> None:
    verdicts = {"sync": threading.Event()}

    async def async_verifier(receipt: Any) -> bool:
        await asyncio.sleep(10)  # cancelled at the timeout
        return True

    def sync_verifier(receipt: Any) -> bool:  # run on a thread: the loop stays free
        verdicts["sync"].wait(10)
        return True

    refunds = owner_effect("refunds")
    first = replace(refunds, verify=async_verifier, verify_timeout=timedelta(seconds=0.2))
    second = replace(refunds, name="owner.refunds.2", verify=sync_verifier, verify_timeout=0.5)

    @sp.workflow("approval-async")
    async def flow(run: sp.AsyncRun) -> Any:
        one = await run.effect("one", first, payload={"account": "a", "amount": 1}, approval=True)
        two = await run.effect("two", second, payload={"account": "b", "amount": 2})
        return [one["id"], two["id"]]

    async def body() -> None:
        store = await sp.open_async_store(f"{pg_url}?schema=t_async_approvals")
        try:
            with pytest.raises(sp.AwaitingApproval):
                await sp.start_async(store, flow, run_id="r")
            assert (await store.get_run("r")).status is RunStatus.WAITING
            await sp.approve_async(store, "r", "one", by="ana")
            with pytest.raises(VerificationFailed, match="did not answer"):
                await sp.resume_async(store, "r")
            with pytest.raises(VerificationFailed):  # re-verified only, still no answer
                await sp.resume_async(store, "r")
            assert _applied(owner_env) == 1
            # the second effect's sync verifier, in an async workflow, times out on a thread
            one = replace(first, verify=lambda receipt: True)
            forget_workflows("approval-async")  # the fixed code, deployed: a new process

            @sp.workflow("approval-async")
            async def fixed(run: sp.AsyncRun) -> Any:
                a = await run.effect("one", one, payload={"account": "a", "amount": 1}, approval=True)
                b = await run.effect("two", second, payload={"account": "b", "amount": 2})
                return [a["id"], b["id"]]

            started = time.monotonic()
            with pytest.raises(VerificationFailed, match=r"within 0\.5s"):
                await sp.resume_async(store, "r")
            assert time.monotonic() - started < 5
            assert _applied(owner_env) == 2
            verdicts["sync"].set()
            assert await sp.resume_async(store, "r") == ["re_1", "re_2"]
            assert owner_env.client.stats()["duplicates"] == 0
        finally:
            await store.close()

    asyncio.run(body())


def test_an_effect_with_a_verify_timeout_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="verify_timeout"):
        sp.Effect("e", execute=lambda p, k: {}, verify_timeout=0)
    assert (
        sp.Effect("e", execute=lambda p, k: {}, verify_timeout=timedelta(seconds=2)).verify_timeout_s == 2.0
    )


def test_the_first_run_id_of_a_chain_approves_the_run_that_waits(
    store_url: str, owner_env: OwnerService
) -> None:
    """The id ``start`` was given serves the whole chain: an approval given with it reaches the
    successor that waits, sync and async, and the refund is sent once."""
    store = sp.open_store(store_url)
    flow = _chained_refund_flow("approval-in-a-chain")

    for run_id in ("r", "s"):
        with pytest.raises(sp.AwaitingApproval) as waits:
            sp.start(store, flow, 0, run_id=run_id)
        assert waits.value.run_id == f"{run_id}~1"
    assert sp.approve(store, "r", "refund", by="ana").run_id == "r~1"
    assert asyncio.run(sp.approve_async(store, "s", "refund", by="ana")).run_id == "s~1"
    assert (sp.resume(store, "r"), sp.resume(store, "s")) == (40, 40)
    with pytest.raises(ApprovalRefused, match="completed"):  # the chain's end: nothing waits
        sp.approve(store, "r", "refund", by="ana")
    assert _applied(owner_env) == 2
    store.close()


# -- revoking an approval ----------------------------------------------------------------------

WITHDRAWN = "the customer withdrew the request"


def test_a_revoked_approval_sends_nothing_until_the_effect_is_approved_again(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-revoked", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    first = sp.approve(store, "r", "refund", by="ana")
    assert store.get_run("r").status is RunStatus.PENDING
    [revoked] = sp.revoke_approval(store, "r", "refund", by="carol", reason=WITHDRAWN)
    assert (revoked.approval_id, revoked.revoked_by, revoked.revoke_reason) == (
        first.approval_id,
        "carol",
        WITHDRAWN,
    )
    assert revoked.revoked_at is not None
    assert store.approvals("r") == [revoked]
    assert not revoked.authorizes(first.payload_digest, first.target_digest, store.now())
    with pytest.raises(ApprovalInvalid, match="revoked by carol") as invalid:
        sp.resume(store, "r")
    assert WITHDRAWN in invalid.value.reason
    waiting = store.get_run("r")
    assert waiting.status is RunStatus.WAITING
    assert waiting.waiting_for is not None
    assert "revoked by carol" in waiting.waiting_for["reason"]
    assert _applied(owner_env) == 0
    op = store.load_ledger("r").operations["refund"]
    assert (op.state, op.dispatch_count) == (EffectState.PREPARED, 0)
    [event] = [e for e in store.events("r") if e.kind == "effect.approval_revoked"]
    assert (event.worker, event.detail["reason"]) == ("carol", WITHDRAWN)
    again = sp.approve(store, "r", "refund", by="ana")
    assert again.approval_id != first.approval_id
    assert sp.resume(store, "r")["amount"] == 40
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    assert store.load_ledger("r").operations["refund"].approval_id == again.approval_id
    store.close()


class _RevokedBeforeDispatch:
    """A store through which a person revokes the approval just as the worker, past its gate,
    commits "dispatching"."""

    def __init__(self, store: sp.Store) -> None:
        self.store = store
        self.revoked = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def mark_dispatching(self, claim: Any, operation_id: str) -> Any:
        if not self.revoked:
            self.revoked = True
            sp.revoke_approval(self.store, claim.run_id, "refund", by="carol", reason=WITHDRAWN)
        return self.store.mark_dispatching(claim, operation_id)


def test_a_revocation_between_the_gate_and_the_dispatch_makes_the_run_wait(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-revoked-at-dispatch", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    sp.approve(store, "r", "refund", by="ana")
    racing = _RevokedBeforeDispatch(store)
    with pytest.raises(ApprovalInvalid, match="revoked by carol"):
        sp.resume(racing, "r")  # type: ignore[arg-type]
    assert racing.revoked
    assert store.get_run("r").status is RunStatus.WAITING
    assert store.load_ledger("r").operations["refund"].dispatch_count == 0
    assert _applied(owner_env) == 0
    store.close()


def test_a_revocation_while_the_outcome_is_uncertain_withdraws_the_dispatch_still_to_come(
    store_url: str, owner_env: OwnerService, crash_at: Any
) -> None:
    """Killed after "dispatching" committed, before the call: the revocation is taken; the
    resume asks the owner, who has nothing, and the dispatch that would follow waits for a new
    approval instead of going out under the revoked one. Once the outcome is recorded, a
    revocation is too late and changes nothing."""
    store = sp.open_store(store_url)
    flow = _refund_flow("approval-revoked-while-uncertain", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    sp.approve(store, "r", "refund", by="ana")
    crash_at("effect.after_dispatching")  # "dispatching" committed: it may have gone out
    with pytest.raises(SimulatedCrash):
        sp.resume(store, "r", lease_ms=0)
    crash_at(None)
    sp.revoke_approval(store, "r", "refund", by="carol", reason=WITHDRAWN)
    with pytest.raises(ApprovalInvalid, match="revoked by carol"):
        sp.resume(store, "r")
    assert store.get_run("r").status is RunStatus.WAITING
    assert _applied(owner_env) == 0
    sp.approve(store, "r", "refund", by="ana")
    assert sp.resume(store, "r")["amount"] == 40
    before = (store.load_ledger("r"), store.events("r"), store.approvals("r"))
    with pytest.raises(ApprovalRefused, match=r"too late: .* is accepted") as late:
        sp.revoke_approval(store, "r", "refund", by="carol", reason=WITHDRAWN)
    assert late.value.revoking
    assert (store.load_ledger("r"), store.events("r"), store.approvals("r")) == before
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    store.close()


def test_a_revocation_needs_who_and_why_and_refuses_credentials(memory_store: sp.Store) -> None:
    flow = _refund_flow(
        "approval-revoke-usage", sp.Effect("refund", execute=lambda p, k: {"id": "re_1", **p})
    )
    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    sp.approve(memory_store, "r", "refund", by="ana")
    before = memory_store.approvals("r")
    with pytest.raises(sp.UsageError, match="by="):
        sp.revoke_approval(memory_store, "r", "refund", by="", reason=WITHDRAWN)
    for reason in ("", "   ", None):
        with pytest.raises(sp.UsageError, match="reason="):
            sp.revoke_approval(memory_store, "r", "refund", by="carol", reason=reason)  # type: ignore[arg-type]
    with pytest.raises(SecretRefused):
        sp.revoke_approval(
            memory_store, "r", "refund", by="carol", reason="leaked key sk_live_0123456789abcdefXYZ"
        )
    with pytest.raises(RunNotFound):
        sp.revoke_approval(memory_store, "nope", "refund", by="carol", reason=WITHDRAWN)
    assert memory_store.approvals("r") == before


def test_the_first_run_id_of_a_chain_revokes_the_approval_of_the_run_that_carries_it_on(
    store_url: str, owner_env: OwnerService
) -> None:
    store = sp.open_store(store_url)
    flow = _chained_refund_flow("approval-revoked-in-a-chain")

    for run_id in ("r", "s"):
        with pytest.raises(sp.AwaitingApproval):
            sp.start(store, flow, 0, run_id=run_id)
        sp.approve(store, run_id, "refund", by="ana")
    [one] = sp.revoke_approval(store, "r", "refund", by="carol", reason=WITHDRAWN)
    [two] = asyncio.run(sp.revoke_approval_async(store, "s", "refund", by="carol", reason=WITHDRAWN))
    assert (one.run_id, two.run_id) == ("r~1", "s~1")
    for run_id in ("r", "s"):
        with pytest.raises(ApprovalInvalid, match="revoked"):
            sp.resume(store, run_id)
    assert _applied(owner_env) == 0
    store.close()


def test_revoke_and_show_from_the_command_line(file_store: sp.Store, owner_env: OwnerService) -> None:
    flow = _refund_flow("approval-revoke-cli", owner_effect("refunds"))
    with pytest.raises(sp.AwaitingApproval):
        sp.start(file_store, flow, run_id="r")
    url, runner = file_store.url, CliRunner()
    env = {"COLUMNS": "200", "FORCE_COLOR": None, "TTY_COMPATIBLE": None}

    def run(*args: str) -> Any:
        return runner.invoke(cli, ["--store", url, *args], env=env)

    assert run("approve", "r", "refund", "--by", "ana").exit_code == 0
    shown = run("show", "r")
    assert shown.exit_code == 0, shown.output
    assert "step refund: approved by ana" in shown.output
    assert "REVOKED" not in shown.output
    assert "safepoint revoke r refund --by <you> --reason" in shown.output
    unexplained = run("revoke", "r", "refund", "--by", "carol")
    assert unexplained.exit_code == 2
    assert "--reason" in unexplained.output
    secret = run("revoke", "r", "refund", "--by", "carol", "--reason", "key sk_live_0123456789abcdefXYZ")
    assert (secret.exit_code, secret.stdout) == (1, "")
    assert "error:" in secret.stderr
    done = run("revoke", "r", "refund", "--by", "carol", "--reason", WITHDRAWN)
    assert done.exit_code == 0, done.output
    assert "revoked 1 approval(s) of 'refund'" in done.output
    assert "given by ana" in done.output
    shown = run("show", "r")
    assert "REVOKED by carol at" in shown.output
    assert WITHDRAWN in shown.output
    assert "safepoint revoke r" not in shown.output  # nothing left in force to revoke
    again = run("revoke", "r", "refund", "--by", "carol", "--reason", WITHDRAWN)
    assert again.exit_code == 1
    assert "revoked already" in again.stderr
    resumed = run("resume", "r")
    assert resumed.exit_code == 4, resumed.output
    assert "revoked by carol" in resumed.output
    assert _applied(owner_env) == 0
