"""Cases a second reading found: each once let an effect, a credential or a cancel slip."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint._crashpoints import SimulatedCrash
from safepoint._secrets import find_secret, marker

ANTHROPIC = "sk-ant-api03-" + "Q" * 30


def test_an_applied_operation_cannot_be_marked_not_applied(memory_store: sp.Store) -> None:
    sent: list[str] = []
    effect = sp.Effect("charge", execute=lambda p, k: sent.append(str(k)) or {"id": "ch_1"},
                       verify=lambda receipt: False)

    @sp.workflow("verify-then-resolve")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={"amount": 5})

    with pytest.raises(sp.VerificationFailed):
        sp.start(memory_store, flow, run_id="r")
    revision = memory_store.get_run("r").state_revision
    with pytest.raises(sp.ResolutionRefused):
        sp.resolve(memory_store, "r", "not_applied", revision=revision, by="ana")
    with pytest.raises(sp.UsageError, match="receipt"):
        sp.resolve(memory_store, "r", "not_applied", revision=revision, by="ana",
                   receipt={"id": "ch_1"})
    sp.resolve(memory_store, "r", "applied", revision=revision, by="ana",
               receipt={"id": "ch_1"})
    assert sp.resume(memory_store, "r") == {"id": "ch_1"}
    assert len(sent) == 1


def test_cancelling_a_blocked_run_never_forgets_its_uncertain_effect(
        memory_store: sp.Store) -> None:
    effect = sp.Effect("refund", execute=lambda p, k: (_ for _ in ()).throw(TimeoutError()),
                       reconcile=lambda key: sp.Unknown("index down"),
                       dedup_retention=timedelta(hours=1))

    @sp.workflow("blocked-then-cancelled")
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", effect, payload={"amount": 5})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    marked = sp.cancel(memory_store, "r", by="ops")
    assert marked.status is sp.RunStatus.BLOCKED  # a person settles the effect first
    assert marked.cancel_requested_at is not None
    assert memory_store.load_ledger("r").operations["refund"].state is sp.EffectState.UNKNOWN
    sp.resolve(memory_store, "r", "abandon", revision=marked.state_revision, by="ops",
               evidence="refund confirmed absent at the provider")
    assert memory_store.get_run("r").status is sp.RunStatus.CANCELLED


def test_a_swallowed_cancel_cannot_complete_the_run(memory_store: sp.Store,
                                                    crash_at: Any) -> None:
    @sp.workflow("swallows-cancel")
    def flow(run: sp.Run) -> str:
        run.pure("first", lambda: 1)
        try:  # noqa: SIM105 - written as careless agent code is
            run.pure("second", lambda: 2)
        except BaseException:
            pass
        return "done"

    crash_at("step.after_record:first")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    sp.cancel(memory_store, "r", by="ops")
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")
    assert memory_store.get_run("r").status is sp.RunStatus.CANCELLED


def test_resolving_and_resuming_a_blocked_run_spends_no_resume_budget(
        memory_store: sp.Store) -> None:
    attempts: list[int] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError("no answer")
        return {"id": "tk_1"}

    effect = sp.Effect("ticket", execute=execute)

    @sp.workflow("budget-and-resolve", resume_budget=1)
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", effect, payload={})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(memory_store, "r")  # still blocked: a resume of a blocked run is no takeover
    revision = memory_store.get_run("r").state_revision
    sp.resolve(memory_store, "r", "not_applied", revision=revision, by="bo")
    assert sp.resume(memory_store, "r") == {"id": "tk_1"}
    assert memory_store.get_run("r").resume_count == 0


def test_credentials_in_reasons_and_evidence_are_redacted(memory_store: sp.Store) -> None:
    effect = sp.Effect("charge", execute=lambda p, k: (_ for _ in ()).throw(TimeoutError()),
                       reconcile=lambda key: sp.Unknown(f"lookup with key {ANTHROPIC} failed"),
                       dedup_retention=timedelta(hours=1))

    @sp.workflow("leaky-reason")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    record = memory_store.get_run("r").recovery_record
    assert ANTHROPIC not in str(record)
    assert marker(ANTHROPIC) in record["reason"]
    with pytest.raises(sp.SecretRefused):
        sp.cancel(memory_store, "r", by="ops", reason=f"rotated {ANTHROPIC}")


def test_rejections_keep_their_evidence_without_credentials(memory_store: sp.Store) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise sp.Rejected({"request": {"Authorization": "Basic dXNlcjpwYXNzd29yZA==",
                                       "api_token": "9f8e7d6c5b4a"}, "status": 402})

    effect = sp.Effect("charge", execute=execute)

    @sp.workflow("leaky-rejection")
    def flow(run: sp.Run) -> Any:
        try:
            return run.effect("charge", effect, payload={})
        except sp.EffectRejected:
            return "declined"

    assert sp.start(memory_store, flow, run_id="r") == "declined"
    error = memory_store.load_ledger("r").operations["charge"].error
    assert error == {"request": {"Authorization": marker("Basic dXNlcjpwYXNzd29yZA=="),
                                 "api_token": marker("9f8e7d6c5b4a")}, "status": 402}


def test_a_receipt_with_a_client_secret_is_kept_masked(memory_store: sp.Store) -> None:
    effect = sp.Effect("intent", execute=lambda p, k: {"id": "pi_1",
                                                       "client_secret": "pi_1_secret_abcdefgh"})

    @sp.workflow("masked-receipt")
    def flow(run: sp.Run) -> Any:
        return run.effect("intent", effect, payload={"amount": 5})

    assert sp.start(memory_store, flow, run_id="r") == {
        "id": "pi_1", "client_secret": marker("pi_1_secret_abcdefgh")}
    assert memory_store.get_run("r").status is sp.RunStatus.COMPLETED


@pytest.mark.parametrize("value", [
    "postgresql://app:S3cr3tPass@db.internal/app", {"aws_secret_access_key": "wJalrXUtnFEMI/K7"},
    {"api_token": "9f8e7d6c5b4a3f2e"}, {"webhook_secret": "whsec_abcdefgh"},
    "hf_" + "a" * 34,
])
def test_more_credential_forms_are_found(value: Any) -> None:
    assert find_secret(value) is not None


@pytest.mark.parametrize("value", [
    {"logprobs": {"content": [{"token": "understanding", "logprob": -0.1}]}},
    {"token": "CAUQAA", "next": "CAUQAQ"}, {"cookie": "chocolate chip"},
    "ASIAPACIFICSOUTHEAST1",
])
def test_ordinary_agent_data_is_not_taken_for_a_credential(value: Any) -> None:
    assert find_secret(value) is None
