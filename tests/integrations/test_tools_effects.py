"""Effect tools against the local effect owner (a real process over HTTP on loopback): one
operation per key fields, reconciliation after a crash, a block without reconcile, approval,
the owner's refusal — counted by the owner itself, on a real SQLite ledger.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.integrations.tools import ToolCall, ToolOutcome, Tools
from safepoint.testing import OwnerRejected, OwnerService, SimulatedCrash, owner_client
from safepoint.types import EffectState, RunStatus

HOURS = timedelta(hours=23)


class Refunds:
    """An effect tool that refunds at the owner, counting each time the function is called and
    the keys it was called with."""

    def __init__(
        self, *, reconcile: bool = True, key_fields: tuple[str, ...] | str = ("order_id",), **options: Any
    ):
        self.keys: list[str] = []
        self.tools = Tools()

        def find_refund(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
            found = owner_client().find_by_key("refunds", str(key))
            return sp.Applied(found) if found is not None else sp.NotApplied()

        @self.tools.effect(
            key_fields=key_fields,
            reconcile=find_refund if reconcile else None,
            dedup_retention=HOURS if reconcile else None,
            **options,
        )
        def refund(order_id: str, amount_cents: int, key: sp.EffectKey) -> dict[str, Any]:
            """Refund part of an order."""
            self.keys.append(str(key))
            return owner_client().create(
                "refunds", {"order_id": order_id, "amount_cents": amount_cents}, idempotency_key=str(key)
            )


def refund_call(call_id: str, order_id: str = "A1", amount_cents: int = 500) -> ToolCall:
    return ToolCall(call_id, "refund", {"order_id": order_id, "amount_cents": amount_cents})


def applied(owner: OwnerService) -> int:
    return int(owner.client.stats()["by_resource"]["refunds"])


def outcomes(refunds: Refunds, run: sp.Run, calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [summary(o) for o in refunds.tools.call_all(run, calls)]


def summary(outcome: ToolOutcome) -> dict[str, Any]:
    value = outcome.value
    if isinstance(value, dict):
        value = {k: value[k] for k in ("id", "order_id", "amount_cents")}
    return {"call_id": outcome.call_id, "is_error": outcome.is_error, "value": value}


def test_two_call_ids_with_the_same_key_fields_are_one_operation(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    """The model asks for the refund again in a later turn, under a new call id: the owner
    sees it once, and the second call gets the first one's receipt — also on a resume."""
    refunds = Refunds()
    receipt = {"id": "re_1", "order_id": "A1", "amount_cents": 500}

    @sp.workflow("tool-effect-same-key-fields")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(
            refunds, run, [refund_call("toolu_1"), refund_call("toolu_2"), refund_call("toolu_3", "B2")]
        )

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    expected = [
        {"call_id": "toolu_1", "is_error": False, "value": receipt},
        {"call_id": "toolu_2", "is_error": False, "value": receipt},
        {
            "call_id": "toolu_3",
            "is_error": False,
            "value": {"id": "re_2", "order_id": "B2", "amount_cents": 500},
        },
    ]
    assert sp.resume(file_store, "r") == expected
    assert applied(owner_env) == 2
    assert len(refunds.keys) == 2
    ledger = file_store.load_ledger("r")
    assert sorted(op.step_id for op in ledger.operations.values()) == ["tool.toolu_1", "tool.toolu_3"]
    assert all(
        op_id.startswith("refund:") and len(op_id) == len("refund:") + 24 for op_id in ledger.operations
    )


def test_one_key_field_may_be_named_alone(file_store: sp.Store, owner_env: OwnerService) -> None:
    refunds = Refunds(key_fields="order_id")

    @sp.workflow("tool-effect-one-key-field")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(refunds, run, [refund_call("toolu_1"), refund_call("toolu_2")])

    first, second = sp.start(file_store, agent, run_id="r")
    assert first["value"] == second["value"]
    assert applied(owner_env) == 1


def test_the_same_key_fields_with_other_arguments_are_refused_not_made_again(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    refunds = Refunds()

    @sp.workflow("tool-effect-same-key-other-args")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(refunds, run, [refund_call("toolu_1"), refund_call("toolu_2", amount_cents=900)])

    first, second = sp.start(file_store, agent, run_id="r")
    assert first["value"]["amount_cents"] == 500
    assert second["is_error"]
    assert "call 'toolu_1' already asked for this operation (the same order_id)" in second["value"]
    assert applied(owner_env) == 1


def test_key_fields_name_the_operation_across_a_continued_chain(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    """After continue-as-new the successor's model re-plans and mints a new call id: the
    operation is found by its key fields in the chain, not made again."""
    refunds = Refunds()

    @sp.workflow("tool-effect-chain")
    def agent(run: sp.Run, turn: int) -> Any:
        outcome = refunds.tools.call(run, refund_call(f"toolu_{turn}"))
        if turn == 1:
            run.continue_as_new(2)
        return outcome.value

    receipt = sp.start(file_store, agent, 1, run_id="r")
    assert receipt["id"] == "re_1"
    assert receipt["order_id"] == "A1"
    assert applied(owner_env) == 1
    assert len(refunds.keys) == 1


def test_an_answer_lost_after_the_owner_applied_it_is_reconciled_to_its_receipt(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    refunds = Refunds()

    @sp.workflow("tool-effect-reconciled-applied")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(refunds, run, [refund_call("toolu_1")])

    crash_at("effect.after_receiver_commit")  # the owner committed; the outcome is not stored
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    assert sp.resume(file_store, "r") == [
        {
            "call_id": "toolu_1",
            "is_error": False,
            "value": {"id": "re_1", "order_id": "A1", "amount_cents": 500},
        }
    ]
    assert len(refunds.keys) == 1
    assert applied(owner_env) == 1


def test_a_dispatch_the_owner_never_got_is_sent_again_under_the_same_key(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    refunds = Refunds()

    @sp.workflow("tool-effect-reconciled-not-applied")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(refunds, run, [refund_call("toolu_1")])

    crash_at("effect.after_dispatching")  # "dispatching" is durable; the call was not made
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    op = next(iter(file_store.load_ledger("r").operations.values()))
    assert op.state is EffectState.DISPATCHING
    assert refunds.keys == []
    assert sp.resume(file_store, "r")[0]["value"]["id"] == "re_1"
    assert refunds.keys == [op.effect_key]  # NotApplied: sent under the key minted first
    assert applied(owner_env) == 1


def test_an_uncertain_dispatch_without_reconcile_blocks_the_run(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    refunds = Refunds(reconcile=False)

    @sp.workflow("tool-effect-blocks")
    def agent(run: sp.Run) -> Any:
        try:
            return outcomes(refunds, run, [refund_call("toolu_1")])
        except Exception:  # agent code that swallows everything cannot make it an outcome
            return "swallowed"

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation, match="no reconcile"):
        sp.resume(file_store, "r")
    assert file_store.get_run("r").status is RunStatus.BLOCKED
    assert refunds.keys == []
    assert applied(owner_env) == 0


def test_an_effect_that_needs_approval_waits_for_it(file_store: sp.Store, owner_env: OwnerService) -> None:
    refunds = Refunds(approval=True)

    @sp.workflow("tool-effect-approval")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return outcomes(refunds, run, [refund_call("toolu_1")])

    with pytest.raises(sp.AwaitingApproval) as waiting:
        sp.start(file_store, agent, run_id="r")
    assert waiting.value.step_id == "tool.toolu_1"
    assert file_store.get_run("r").status is RunStatus.WAITING
    assert refunds.keys == []
    assert applied(owner_env) == 0
    sp.approve(file_store, "r", "tool.toolu_1", by="ana")
    assert sp.resume(file_store, "r")[0]["value"]["id"] == "re_1"
    assert applied(owner_env) == 1


def test_a_refusal_by_the_owner_is_an_error_outcome_now_and_on_replay(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    tools = Tools()
    calls: list[str] = []

    @tools.effect
    def charge(customer: str, amount_cents: int, key: sp.EffectKey) -> dict[str, Any]:
        calls.append(customer)
        try:
            return owner_client().create(
                "charges", {"customer": customer, "amount_cents": amount_cents}, idempotency_key=str(key)
            )
        except OwnerRejected as exc:
            raise sp.Rejected({"declined": str(exc)}) from exc

    @sp.workflow("tool-effect-rejected")
    def agent(run: sp.Run) -> Any:
        outcome = tools.call(run, ToolCall("toolu_1", "charge", {"customer": "c1", "amount_cents": 100}))
        return [outcome.is_error, outcome.content]

    owner_env.client.set_faults(decline=1)
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    is_error, content = sp.resume(file_store, "r")
    assert is_error
    assert content.startswith('Rejected: {"declined":')
    assert "injected decline" in content
    assert calls == ["c1"]
    assert int(owner_env.client.stats()["applied"]) == 0


def test_an_existing_effect_is_a_tool_with_the_arguments_as_its_payload(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    payloads: list[Any] = []

    def open_ticket(payload: Any, key: sp.EffectKey) -> Any:
        payloads.append(payload)
        return owner_client().create("tickets", payload, idempotency_key=str(key))

    tickets = sp.Effect("ticket.open", execute=open_ticket)
    tools = Tools()
    tools.add(
        "open_ticket",
        "effect",
        effect=tickets,
        key_fields=("title",),
        schema={
            "type": "object",
            "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
            "required": ["title"],
        },
        description="Open a support ticket.",
    )
    with pytest.raises(sp.UsageError, match=r"takes no reconcile"):
        tools.add("other", "effect", effect=tickets, schema={"type": "object"}, reconcile=None)

    @sp.workflow("tool-existing-effect")
    def agent(run: sp.Run) -> Any:
        return [
            tools.call(run, ToolCall("toolu_1", "open_ticket", {"title": "Refund A1", "body": "late"})).value[
                "id"
            ],
            tools.call(run, ToolCall("toolu_2", "open_ticket", {})).content,
        ]

    assert sp.start(file_store, agent, run_id="r") == [
        "tk_1",
        "invalid arguments for tool 'open_ticket': title: Field required",
    ]
    assert payloads == [{"title": "Refund A1", "body": "late"}]
    (op,) = file_store.load_ledger("r").operations.values()
    assert op.effect == "ticket.open"
    assert op.operation_id.startswith("open_ticket:")
