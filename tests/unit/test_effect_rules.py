"""The effect rules: what each state of an operation allows, what an owner's answer to a
reconcile means, when prepared and dispatching are one commit, and how keys are minted."""

from __future__ import annotations

from datetime import timedelta

import pytest

import safepoint as sp
from safepoint._rules.effects import (
    Action,
    after_reconcile,
    mint_effect_key,
    next_action,
    one_commit_to_dispatching,
)
from safepoint.types import EffectState

# DESIGN §3, "on resume", one row each.
HOUR = timedelta(hours=1)


def _send(payload: object, key: sp.EffectKey) -> object:
    return {"id": 1}


def _lookup(key: sp.EffectKey) -> sp.NotApplied:
    return sp.NotApplied()


@pytest.mark.parametrize(
    ("state", "reconcile", "verify", "action"),
    [
        (EffectState.PREPARED, True, False, Action.DISPATCH),
        (EffectState.DISPATCHING, True, False, Action.RECONCILE),
        (EffectState.UNKNOWN, True, False, Action.RECONCILE),
        (EffectState.DISPATCHING, False, False, Action.BLOCK),
        (EffectState.UNKNOWN, False, False, Action.BLOCK),
        (EffectState.APPLIED, True, True, Action.VERIFY),
        (EffectState.APPLIED, True, False, Action.ACCEPT),
        (EffectState.ACCEPTED, True, True, Action.REPLAY),
        (EffectState.REJECTED, True, True, Action.REPLAY_REJECTION),
    ],
)
def test_next_action_by_evidence(state: EffectState, reconcile: bool, verify: bool, action: Action) -> None:
    assert next_action(state, can_reconcile=reconcile, can_verify=verify).action is action


@pytest.mark.parametrize(
    ("answer", "retention", "age_ms", "count", "action"),
    [
        (sp.Applied({"id": 1}), None, 0, 1, Action.RECORD_APPLIED),
        (sp.Unknown("index down"), HOUR, 0, 1, Action.BLOCK),
        (sp.NotApplied(), HOUR, 1000, 1, Action.DISPATCH),
        (sp.NotApplied(), None, 1000, 1, Action.BLOCK),  # no dedup promise
        (sp.NotApplied(), HOUR, 3_600_000, 1, Action.BLOCK),  # past retention
        (sp.NotApplied(), HOUR, 1000, 3, Action.BLOCK),  # dispatch budget spent
        ("something else", HOUR, 0, 1, Action.BLOCK),
    ],
)
def test_after_reconcile(
    answer: object, retention: timedelta | None, age_ms: int, count: int, action: Action
) -> None:
    decided = after_reconcile(
        answer,
        now=10_000_000,
        first_dispatched_at=10_000_000 - age_ms,
        dedup_retention=retention,
        dispatch_count=count,
        max_dispatches=3,
    )
    assert decided.action is action
    if action is Action.BLOCK:
        assert decided.reason


@pytest.mark.parametrize(
    ("effect", "approval", "one_commit"),
    [
        (sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR), False, True),
        (sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR), True, False),  # a gate
        (sp.Effect("e", _send, dedup_retention=HOUR), False, False),  # no reconcile
        (sp.Effect("e", _send, reconcile=_lookup), False, False),  # no dedup promise
        (
            sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR, max_dispatches=1),
            False,
            False,
        ),  # no dispatch left
        (sp.Effect("e", _send), False, False),
    ],
)
def test_prepared_and_dispatching_are_one_commit_only_where_recovery_needs_no_person(
    effect: sp.Effect, approval: bool, one_commit: bool
) -> None:
    assert one_commit_to_dispatching(effect, approval=approval) is one_commit
    # A crash right after that one commit leaves "dispatching", dispatched once, just now; the
    # owner has nothing under the key. Recovery must dispatch again, with no person asked.
    reconciles = (
        next_action(
            EffectState.DISPATCHING, can_reconcile=effect.reconcile is not None, can_verify=False
        ).action
        is Action.RECONCILE
    )
    redispatches = (
        after_reconcile(
            sp.NotApplied(),
            now=5_000,
            first_dispatched_at=5_000,
            dedup_retention=effect.dedup_retention,
            dispatch_count=1,
            max_dispatches=effect.max_dispatches,
        ).action
        is Action.DISPATCH
    )
    assert one_commit == (not approval and reconciles and redispatches)


def test_effect_keys_are_stable_and_distinct() -> None:
    assert mint_effect_key("l", "r", "op") == mint_effect_key("l", "r", "op")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l", "r", "op2")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l", "r2", "op")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l2", "r", "op")  # per ledger
