"""Ids are checked before anything is recorded, the same way on every store: a blank or
malformed run id, step id or operation id is a ``UsageError`` (``InvalidStepId`` for a step)
that names the id and says what is allowed — never a fall-back to a default that repeats an
effect, and never a run left ``running``."""

from __future__ import annotations

from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected, InvalidStepId, SecretRefused
from safepoint.testing import OwnerService, owner_effect
from safepoint.types import EffectState, RunStatus

BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\udc80b", id="lone-surrogate"),
    pytest.param("x" * 1001, id="too-long"),
]
DOT_SEGMENTS = [pytest.param(".", id="dot"), pytest.param("..", id="dot-dot")]
NOT_STRINGS = [pytest.param(7, id="int"), pytest.param(b"r", id="bytes"), pytest.param(["r"], id="list")]


@sp.workflow("ids-plain")
def plain(run: sp.Run, n: int) -> int:
    return int(run.pure("one", lambda: n))


@pytest.mark.parametrize("bad", BAD_IDS + NOT_STRINGS + DOT_SEGMENTS)
def test_a_malformed_run_id_is_refused_before_a_run_is_created(store: sp.Store, bad: Any) -> None:
    for verb in (sp.start, sp.submit):
        with pytest.raises(sp.UsageError, match="invalid run id") as error:
            verb(store, plain, 1, run_id=bad)
        assert "a run id is a non-empty string" in error.value.message
    assert store.list_runs() == []
    for lookup in (lambda: sp.resume(store, bad), lambda: sp.cancel(store, bad, by="ana")):
        with pytest.raises(sp.UsageError, match="invalid run id"):
            lookup()


def test_an_empty_run_id_never_means_a_fresh_run_per_call(store: sp.Store) -> None:
    with pytest.raises(sp.UsageError):
        sp.start(store, plain, 1, run_id="")
    with pytest.raises(sp.UsageError):
        sp.start(store, plain, 1, run_id="")
    assert store.list_runs() == []
    sp.start(store, plain, 1)  # None: a random run id, as documented
    assert len(store.list_runs()) == 1


@pytest.mark.parametrize("bad", BAD_IDS + NOT_STRINGS + [pytest.param("a#b", id="hash")])
def test_a_malformed_step_id_fails_the_run_at_once(store: sp.Store, bad: Any) -> None:
    @sp.workflow("ids-step")
    def flow(run: sp.Run) -> Any:
        return run.pure(bad, lambda: 1)

    with pytest.raises(InvalidStepId, match="invalid step id"):
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert run.status is RunStatus.FAILED  # never left running until its budget runs out
    assert store.load_ledger("r").steps == {}
    assert "step id" in str(run.error)


@pytest.mark.parametrize("bad", BAD_IDS + NOT_STRINGS)
def test_a_malformed_operation_id_dispatches_nothing(
    store: sp.Store, owner_env: OwnerService, bad: Any
) -> None:
    charges = owner_effect("charges")

    @sp.workflow("ids-operation")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", charges, payload={"amount": 1}, operation_id=bad)

    with pytest.raises(sp.UsageError, match="invalid operation id"):
        sp.start(store, flow, run_id="r")
    assert store.get_run("r").status is RunStatus.FAILED
    assert store.load_ledger("r").operations == {}
    assert owner_env.client.stats()["applied"] == 0


def test_an_empty_operation_id_is_not_the_chain_wide_default(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """An empty operation id used to fall back to the step id while naming the operation
    across the continue-as-new chain: every later run of the chain got the first receipt."""
    charges = owner_effect("charges")

    @sp.workflow("ids-chain")
    def flow(run: sp.Run, round_: int) -> Any:
        receipt = run.effect("charge", charges, payload={"round": round_}, operation_id="")
        if round_ < 2:
            run.continue_as_new(round_ + 1)
        return receipt

    with pytest.raises(sp.UsageError, match="invalid operation id"):
        sp.start(store, flow, 0, run_id="c")
    assert owner_env.client.stats()["applied"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param("b/c", id="slash"),
        pytest.param("a\udc80", id="lone-surrogate"),
    ],
)
def test_a_malformed_branch_name_is_refused(memory_store: sp.Store, bad: str) -> None:
    @sp.workflow("ids-branch")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {bad: lambda b: b.pure("x", lambda: 1)})

    with pytest.raises(sp.UsageError, match="branch name"):
        sp.start(memory_store, flow, run_id="r")


@pytest.mark.parametrize("name", ["", "a\x00", "\udc80"])
def test_a_malformed_workflow_name_is_refused_at_registration(name: str) -> None:
    with pytest.raises(sp.UsageError, match="workflow name"):
        sp.workflow(name)


def test_a_run_id_holding_a_credential_is_refused(store: sp.Store) -> None:
    token = "sk-ant-api03-" + "a" * 40
    with pytest.raises(SecretRefused) as error:
        sp.start(store, plain, 1, run_id=f"run-{token}")
    assert token not in error.value.message
    assert store.list_runs() == []


def _waiting_for_approval(store: sp.Store) -> None:
    refund = sp.Effect("ids.refund", execute=lambda payload, key: {"id": "re_1"})

    @sp.workflow("ids-approval")
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", refund, payload={"amount": 5}, approval=True)

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")


def _operator_verbs(store: sp.Store, run_id: Any, step_id: Any, by: Any) -> dict[str, Any]:
    """Every verb an operator names a run (and a step or operation of it) with, sync and
    async, each as a call to make."""
    import asyncio

    revision = 1
    return {
        "approve": lambda: sp.approve(store, run_id, step_id, by=by),
        "approve_async": lambda: asyncio.run(sp.approve_async(store, run_id, step_id, by=by)),
        "revoke": lambda: sp.revoke_approval(store, run_id, step_id, by=by, reason="no"),
        "revoke_async": lambda: asyncio.run(
            sp.revoke_approval_async(store, run_id, step_id, by=by, reason="no")
        ),
        "resolve": lambda: sp.resolve(
            store, run_id, "abandon", revision=revision, by=by, operation_id=step_id
        ),
        "cancel": lambda: sp.cancel(store, run_id, by=by),
        "cancel_async": lambda: asyncio.run(sp.cancel_async(store, run_id, by=by)),
    }


@pytest.mark.parametrize("bad", BAD_IDS + NOT_STRINGS)
def test_operator_verbs_refuse_a_malformed_id_or_name_before_anything_is_recorded(
    store: sp.Store, bad: Any
) -> None:
    """approve, revoke, resolve and cancel look a run (and a step or operation of it) up by
    the ids a person typed, and record who acted: a malformed one is a ``UsageError`` naming
    it — never a store's encoding error, nor a name that cannot be stored or shown."""
    _waiting_for_approval(store)
    before = (store.get_run("r"), store.events("r"))
    placements = {
        "run id": ("invalid run id", dict(run_id=bad, step_id="refund", by="ana")),
        "step id": ("invalid (step|operation) id", dict(run_id="r", step_id=bad, by="ana")),
        "by": ("by=", dict(run_id="r", step_id="refund", by=bad)),
    }
    for placement, (message, ids) in placements.items():
        for verb, call in _operator_verbs(store, **ids).items():
            if placement == "step id" and verb.startswith("cancel"):
                continue  # cancel names no step
            with pytest.raises(sp.UsageError, match=message):
                call()
            assert (store.get_run("r"), store.events("r")) == before, (placement, verb)


UNSTORABLE = [pytest.param("bad \udcff name", id="lone-surrogate"), pytest.param("bad \x00 name", id="nul")]


@pytest.mark.parametrize("text", UNSTORABLE)
def test_an_error_message_that_cannot_be_stored_as_it_is_never_leaves_the_run_running(
    store: sp.Store, text: str
) -> None:
    """An exception's message is text safepoint records on the caller's behalf: one holding a
    lone surrogate (an OSError about a file name that is not UTF-8, say) is recorded with it
    escaped — the workflow sees what was recorded, and the run ends as it would otherwise, on
    every store, instead of staying ``running`` while each write is refused."""

    def fails() -> Any:
        raise OSError(f"cannot open {text}")

    def times_out(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError(f"no answer for {text}")

    stuck = sp.Effect("ids.stuck", execute=times_out)

    @sp.workflow("ids-unstorable")
    def flow(run: sp.Run, where: str) -> Any:
        if where == "step":
            try:
                run.read("open", fails)
            except sp.StepFailed as failed:
                return failed.error_message
        if where == "effect":
            return run.effect("send", stuck, payload={})
        raise ValueError(f"gave up on {text}")

    seen = sp.start(store, flow, "step", run_id="step")
    assert "cannot open bad" in seen
    assert seen.endswith("name")
    assert store.load_ledger("step").steps["open"].error["message"] == seen
    with pytest.raises(sp.RunFailed, match="gave up on bad"):
        sp.start(store, flow, "workflow", run_id="workflow")
    assert store.get_run("workflow").status is RunStatus.FAILED
    with pytest.raises(sp.NeedsReconciliation, match="no answer for bad"):
        sp.start(store, flow, "effect", run_id="effect")
    assert store.get_run("effect").status is RunStatus.BLOCKED
    assert "no answer for bad" in store.load_ledger("effect").operations["send"].error["message"]


@pytest.mark.parametrize("text", UNSTORABLE)
def test_an_operators_words_that_cannot_be_stored_are_refused(store: sp.Store, text: str) -> None:
    """Evidence and reasons are the caller's own words: one that no store can keep as given
    is a ``UsageError`` naming it, on every store alike — never a store's encoding error."""
    _waiting_for_approval(store)
    before = (store.get_run("r"), store.events("r"))
    for call in (
        lambda: sp.approve(store, "r", "refund", by="ana", evidence=text),
        lambda: sp.revoke_approval(store, "r", "refund", by="ana", reason=text),
        lambda: sp.cancel(store, "r", by="ana", reason=text),
        lambda: sp.resolve(store, "r", "abandon", revision=before[0].state_revision, by="ana", evidence=text),
    ):
        with pytest.raises(sp.UsageError, match=r"NUL|surrogate"):
            call()
        assert (store.get_run("r"), store.events("r")) == before


@pytest.mark.parametrize(
    "evidence",
    [
        pytest.param({"why": "no account named bad \udcff name"}, id="lone-surrogate"),
        pytest.param({"codes": {402}}, id="not-json"),
        pytest.param(ValueError("declined"), id="an-exception"),
    ],
)
def test_a_rejection_is_recorded_as_one_whatever_its_evidence_holds(store: sp.Store, evidence: Any) -> None:
    """``Rejected`` is the owner's definite refusal: its evidence is recorded as every store
    can keep it (text escaped, what is not JSON as its text), and the run raises the rejection
    as recorded — not left ``running`` while the write is refused, nor blocked as uncertain."""

    def declines(payload: Any, key: sp.EffectKey) -> Any:
        raise sp.Rejected(evidence)

    declined = sp.Effect("ids.declined", execute=declines)

    @sp.workflow("ids-declined")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", declined, payload={"amount": 5})

    with pytest.raises(EffectRejected) as rejected:
        sp.start(store, flow, run_id="r")
    op = store.load_ledger("r").operations["charge"]
    assert op.state is EffectState.REJECTED
    assert op.error == rejected.value.evidence
    assert store.get_run("r").status is RunStatus.FAILED


@pytest.mark.parametrize(
    "bad", [pytest.param("r\udcff", id="lone-surrogate"), pytest.param("r\x00", id="nul")]
)
def test_a_store_looked_up_by_an_id_no_record_can_have_says_so_alike(store: sp.Store, bad: str) -> None:
    """The stores themselves, called directly: the same UsageError on both, never a raw
    UnicodeEncodeError on one and a StoreError on the other."""
    for lookup in (store.get_run, store.find_run, store.load_ledger, store.events, store.approvals):
        with pytest.raises(sp.UsageError):
            lookup(bad)
