"""Mistakes a new user makes get an answer that says what to do: a typed error naming the
mistake, raised before anything is recorded — never a raw AttributeError, RecursionError or a
message about something else."""

from __future__ import annotations

import datetime as dt
import sys
import traceback
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import NotJSON, RunOwned
from safepoint.testing import OwnerService, forget_workflows, owner_client, owner_effect
from safepoint.types import EffectState


@sp.workflow("mistakes-greet")
def greet(run: sp.Run, name: str) -> str:
    return str(run.pure("format", lambda n: f"hello {n}", name))


@pytest.mark.parametrize(
    "verb",
    [
        lambda store: sp.start(store, greet, "ana"),
        lambda store: sp.submit(store, greet, "ana"),
        lambda store: sp.resume(store, "r"),
        lambda store: sp.cancel(store, "r", by="ana"),
        lambda store: sp.approve(store, "r", "s", by="ana"),
        lambda store: sp.revoke_approval(store, "r", "s", by="ana", reason="no"),
        lambda store: sp.resolve(store, "r", "abandon", revision=1, by="ana"),
    ],
)
@pytest.mark.parametrize("given", [None, "safepoint.db", greet])
def test_a_missing_or_misplaced_store_is_named(verb: Any, given: Any) -> None:
    with pytest.raises(sp.UsageError, match="takes the store first") as error:
        verb(given)
    if given is greet:
        assert "the workflow 'mistakes-greet'" in error.value.message


def test_the_store_forgotten_is_not_mistaken_for_an_undecorated_workflow() -> None:
    with pytest.raises(sp.UsageError, match=r"got the workflow 'mistakes-greet' there"):
        sp.start(greet, "x")  # type: ignore[arg-type]


def test_a_plain_function_where_the_workflow_goes_says_to_decorate_it(memory_store: sp.Store) -> None:
    def undecorated(run: sp.Run) -> int:
        return 1

    with pytest.raises(sp.UsageError, match=r"decorate it with @safepoint.workflow"):
        sp.start(memory_store, undecorated)  # type: ignore[arg-type]


def test_a_workflow_called_directly_says_how_to_run_it() -> None:
    with pytest.raises(sp.UsageError, match=r"safepoint.start\(store, greet"):
        greet("ana")


def test_a_step_called_after_its_workflow_returned_says_so(file_store: sp.Store) -> None:
    kept: list[sp.Run] = []

    @sp.workflow("mistakes-leak")
    def leaky(run: sp.Run) -> int:
        kept.append(run)
        return 1

    assert sp.start(file_store, leaky, run_id="r") == 1
    with pytest.raises(sp.UsageError, match="no step can be recorded through it"):
        kept[0].pure("late", lambda: 2)
    assert "late" not in file_store.load_ledger("r").steps


def test_a_receipt_that_is_not_json_is_never_sent_again_and_says_why(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """execute returned (the owner has it), with a receipt that cannot be recorded; the
    owner's search lags, so reconcile finds nothing yet. The effect is not sent again until
    the dispatches run out: the run blocks at once, saying why. Fixed, it is found by key."""
    found = owner_effect("charges")  # its reconcile: the owner's object, found by key

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        created = owner_client().create("charges", payload, idempotency_key=str(key))
        return {"charge": created, "at": dt.datetime.now(dt.UTC)}  # a datetime: not JSON

    def flow_with(effect: sp.Effect) -> sp.Workflow:
        forget_workflows("mistakes-receipt")

        @sp.workflow("mistakes-receipt")
        def flow(run: sp.Run) -> Any:
            return run.effect("charge", effect, payload={"amount": 3})["amount"]

        return flow

    broken = sp.Effect(
        found.name,
        execute=execute,
        reconcile=lambda key: sp.NotApplied(),
        dedup_retention=dt.timedelta(hours=1),
    )
    with pytest.raises(sp.NeedsReconciliation, match=r"\$\.at is a datetime") as blocked:
        sp.start(store, flow_with(broken), run_id="r")
    assert "not sent again" in blocked.value.message
    op = store.load_ledger("r").operations["charge"]
    assert (op.state, op.dispatch_count) == (EffectState.UNKNOWN, 1)  # sent once
    flow_with(found)  # fixed: the resume asks the owner, who has it
    assert sp.resume(store, "r") == 3
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)


def test_a_block_says_what_the_last_dispatch_ended_in(memory_store: sp.Store) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("the owner did not answer in 5s")

    effect = sp.Effect("slow", execute=execute)  # no reconcile: an unknown outcome blocks

    @sp.workflow("mistakes-cause")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={})

    with pytest.raises(sp.NeedsReconciliation, match="TimeoutError: the owner did not answer"):
        sp.start(memory_store, flow, run_id="r")


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _containing_itself() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": []}
    loop["a"].append(loop)
    return loop


def _too_deep() -> list[Any]:
    # Deeper than the recursion limit as it stands when the test runs: another test in the same
    # process (a property test's engine) may have raised it.
    return _nested(sys.getrecursionlimit() + 5000)


@pytest.mark.parametrize(
    ("make", "said"),
    [(_too_deep, "nested deeper than"), (_containing_itself, "contains itself")],
)
def test_inputs_nested_too_deep_or_containing_themselves_are_not_json(
    memory_store: sp.Store, make: Any, said: str
) -> None:
    value = make()
    with pytest.raises(NotJSON, match=said):
        sp.start(memory_store, greet, value)

    @sp.workflow("mistakes-deep-step")
    def flow(run: sp.Run) -> Any:
        return run.pure("step", lambda v: 1, value)

    with pytest.raises(NotJSON, match=said):
        sp.start(memory_store, flow, run_id="step")


def test_run_owned_says_when_in_words_not_epoch_milliseconds(file_store: sp.Store) -> None:
    sp.submit(file_store, greet, "ana", run_id="r")
    claim = file_store.claim_next("someone-else", 60_000, ["mistakes-greet"])
    assert claim is not None
    with pytest.raises(RunOwned) as owned:
        sp.resume(file_store, "r")
    assert "epoch" not in owned.value.message
    assert "Z (in " in owned.value.message  # an ISO time in UTC, and how far away
    assert owned.value.lease_expires_at == claim.lease_expires_at


def test_a_second_workflow_under_one_name_and_version_is_refused() -> None:
    @sp.workflow("mistakes-twice")
    def first(run: sp.Run) -> int:
        return 1

    with pytest.raises(sp.UsageError, match="registered already"):

        @sp.workflow("mistakes-twice")
        def second(run: sp.Run) -> int:
            return 2

    sp.workflow("mistakes-twice")(first.fn)  # the same code again (a reload) is fine

    @sp.workflow("mistakes-twice", version="2")  # a new version replaces it: a deploy
    def third(run: sp.Run) -> int:
        return 3


def test_a_wait_for_approval_is_raised_without_the_engines_frames(memory_store: sp.Store) -> None:
    effect = sp.Effect("gated", execute=lambda payload, key: {"ok": True})

    @sp.workflow("mistakes-wait")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={"to": "ana"}, approval=True)

    with pytest.raises(sp.AwaitingApproval) as waiting:
        sp.start(memory_store, flow, run_id="r")
    frames = traceback.extract_tb(waiting.value.__traceback__)
    assert len(frames) <= 3, [f.name for f in frames]


@pytest.mark.parametrize("retention", [3600, "23h", dt.timedelta(0), dt.timedelta(hours=-1)])
def test_a_dedup_retention_that_is_not_a_positive_timedelta_is_refused_at_once(retention: Any) -> None:
    """Said when the effect is made, not found only when a crash is reconciled (where a number
    raised AttributeError with the effect in flight, and the run blocked)."""
    with pytest.raises(ValueError, match="dedup_retention"):
        sp.Effect(
            "mistakes.retention",
            execute=lambda payload, key: {"id": "x"},
            reconcile=lambda key: sp.NotApplied(),
            dedup_retention=retention,
        )
