"""Fast unit tests of the pure parts: hashing, the effect rules, crash points, the public API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import safepoint as sp
from safepoint._engine import crashpoints as _crashpoints
from safepoint._rules.canonical import canonical, digest, find_non_json, input_hash
from safepoint._rules.effects import (
    Action,
    after_reconcile,
    mint_effect_key,
    next_action,
    one_commit_to_dispatching,
)
from safepoint.errors import CorruptRecord, NotJSON
from safepoint.types import EffectState

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


def test_rfc8785_canonical_form() -> None:
    # key order by UTF-16 code units, no whitespace, shortest float form
    assert canonical({"b": 1, "a": [1.0, 1e21, "é"]}) == b'{"a":[1,1e+21,"\xc3\xa9"],"b":1}'
    assert input_hash({"x": 1}) == input_hash({"x": 1.0})
    assert digest(b"abc").startswith("sha256:ba7816bf")


@given(json_values)
def test_hash_ignores_key_order(value: object) -> None:
    if isinstance(value, dict):
        reordered = dict(reversed(list(value.items())))
        assert input_hash(value) == input_hash(reordered)
    assert find_non_json(value) is None


@pytest.mark.parametrize(("value", "found"), [
    ({"a": {1, 2}}, ("$.a", "set")),
    ([1, (2, 3)], ("$[1]", "tuple")),
    ({1: "x"}, ("$ key 1", "int")),
    (float("nan"), ("$", "non-finite float nan")),
    (2**60, ("$", "integer beyond 2**53")),
    (b"bytes", ("$", "bytes")),
])
def test_non_json_is_located(value: object, found: tuple[str, str]) -> None:
    assert find_non_json(value) == found


def test_tuples_are_fine_as_inputs() -> None:
    assert find_non_json([1, (2, 3)], allow_tuples=True) is None


# DESIGN §3, "on resume", one row each.
@pytest.mark.parametrize(("state", "reconcile", "verify", "action"), [
    (EffectState.PREPARED, True, False, Action.DISPATCH),
    (EffectState.DISPATCHING, True, False, Action.RECONCILE),
    (EffectState.UNKNOWN, True, False, Action.RECONCILE),
    (EffectState.DISPATCHING, False, False, Action.BLOCK),
    (EffectState.UNKNOWN, False, False, Action.BLOCK),
    (EffectState.APPLIED, True, True, Action.VERIFY),
    (EffectState.APPLIED, True, False, Action.ACCEPT),
    (EffectState.ACCEPTED, True, True, Action.REPLAY),
    (EffectState.REJECTED, True, True, Action.REPLAY_REJECTION),
])
def test_next_action_by_evidence(state: EffectState, reconcile: bool, verify: bool,
                                 action: Action) -> None:
    assert next_action(state, can_reconcile=reconcile, can_verify=verify).action is action


HOUR = timedelta(hours=1)


@pytest.mark.parametrize(("answer", "retention", "age_ms", "count", "action"), [
    (sp.Applied({"id": 1}), None, 0, 1, Action.RECORD_APPLIED),
    (sp.Unknown("index down"), HOUR, 0, 1, Action.BLOCK),
    (sp.NotApplied(), HOUR, 1000, 1, Action.DISPATCH),
    (sp.NotApplied(), None, 1000, 1, Action.BLOCK),              # no dedup promise
    (sp.NotApplied(), HOUR, 3_600_000, 1, Action.BLOCK),         # past retention
    (sp.NotApplied(), HOUR, 1000, 3, Action.BLOCK),              # dispatch budget spent
    ("something else", HOUR, 0, 1, Action.BLOCK),
])
def test_after_reconcile(answer: object, retention: timedelta | None, age_ms: int, count: int,
                         action: Action) -> None:
    decided = after_reconcile(answer, now=10_000_000, first_dispatched_at=10_000_000 - age_ms,
                              dedup_retention=retention, dispatch_count=count, max_dispatches=3)
    assert decided.action is action
    if action is Action.BLOCK:
        assert decided.reason


def _send(payload: object, key: sp.EffectKey) -> object:
    return {"id": 1}


def _lookup(key: sp.EffectKey) -> sp.NotApplied:
    return sp.NotApplied()


@pytest.mark.parametrize(("effect", "approval", "one_commit"), [
    (sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR), False, True),
    (sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR), True, False),  # a gate
    (sp.Effect("e", _send, dedup_retention=HOUR), False, False),          # no reconcile
    (sp.Effect("e", _send, reconcile=_lookup), False, False),             # no dedup promise
    (sp.Effect("e", _send, reconcile=_lookup, dedup_retention=HOUR, max_dispatches=1), False,
     False),                                                              # no dispatch left
    (sp.Effect("e", _send), False, False),
])
def test_prepared_and_dispatching_are_one_commit_only_where_recovery_needs_no_person(
        effect: sp.Effect, approval: bool, one_commit: bool) -> None:
    assert one_commit_to_dispatching(effect, approval=approval) is one_commit
    # A crash right after that one commit leaves "dispatching", dispatched once, just now; the
    # owner has nothing under the key. Recovery must dispatch again, with no person asked.
    reconciles = next_action(EffectState.DISPATCHING, can_reconcile=effect.reconcile is not None,
                             can_verify=False).action is Action.RECONCILE
    redispatches = after_reconcile(sp.NotApplied(), now=5_000, first_dispatched_at=5_000,
                                   dedup_retention=effect.dedup_retention, dispatch_count=1,
                                   max_dispatches=effect.max_dispatches).action is Action.DISPATCH
    assert one_commit == (not approval and reconciles and redispatches)


def test_effect_keys_are_stable_and_distinct() -> None:
    assert mint_effect_key("l", "r", "op") == mint_effect_key("l", "r", "op")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l", "r", "op2")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l", "r2", "op")
    assert mint_effect_key("l", "r", "op") != mint_effect_key("l2", "r", "op")  # per ledger


def test_crash_points_are_free_and_precise() -> None:
    _crashpoints.arm(None)
    _crashpoints.crashpoint("effect.after_dispatching", "x")  # disarmed: nothing happens
    _crashpoints.arm("effect.after_dispatching:pay@2", mode="raise")
    try:
        _crashpoints.crashpoint("effect.after_dispatching", "ship")
        _crashpoints.crashpoint("effect.after_dispatching", "pay")
        with pytest.raises(_crashpoints.SimulatedCrash):
            _crashpoints.crashpoint("effect.after_dispatching", "pay#2")
    finally:
        _crashpoints.arm(None)
    with pytest.raises(ValueError, match="unknown crash point"):
        _crashpoints.arm("effect.nowhere")


def test_errors_carry_fields_and_advice() -> None:
    error = sp.NeedsReconciliation("r", "s", "op", "owner down")
    assert (error.run_id, error.step_id, error.operation_id) == ("r", "s", "op")
    assert "resolve" in str(error)
    assert issubclass(sp.LostOwnership, BaseException)
    assert not issubclass(sp.LostOwnership, Exception)


def test_only_a_process_of_this_very_boot_can_be_declared_dead() -> None:
    from safepoint._engine import ownership as _ownership

    me = _ownership.worker_id()
    host, boot, pidns, _, _ = me.split(":")
    assert not _ownership.owner_is_gone(me)  # this process: alive
    gone = f"{host}:{boot}:{pidns}:999999999:feedbeef"
    assert _ownership.owner_is_gone(gone)  # no such pid on this boot
    # the same host name and pid namespace inode on another machine (another boot): unknowable
    assert not _ownership.owner_is_gone(f"{host}:0123456789ab:{pidns}:999999999:feedbeef")
    assert not _ownership.owner_is_gone(f"other-host:{boot}:{pidns}:999999999:feedbeef")
    assert not _ownership.owner_is_gone("not-an-owner-id")


def test_the_fast_canonical_encoder_writes_exactly_what_rfc_8785_writes() -> None:
    """canonical() takes Python's own encoder for values it writes identically; 3000 random
    values (escapes, controls, non-BMP text, BMP-ordered keys, nesting, edge integers) must
    come out byte for byte as the RFC 8785 library writes them — and floats and keys beyond
    the BMP take the library's path."""
    import random
    import string

    import rfc8785

    from safepoint._rules.canonical import _plain, canonical

    rng = random.Random(8785)
    alphabet = string.printable + "\x00\x01\x1f\x7f\u00e9\u2028\u2029\ufffd\u4e2d\ue000\U0001f600"

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))

    def value(depth: int = 0) -> object:
        roll = rng.random()
        if depth > 3 or roll < 0.35:
            return rng.choice([text(), rng.randint(-2**53 + 1, 2**53 - 1), True, False, None])
        if roll < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {text().replace("\U0001f600", ""): value(depth + 1) for _ in range(rng.randint(0, 4))}

    for _ in range(3000):
        sample = value()
        assert canonical(sample) == rfc8785.dumps(sample), sample
    assert _plain({"\U0001f600": 1}) is False  # UTF-16 order differs: the library decides
    assert canonical({"\U0001f600": 1, "\ue000": 2}) == rfc8785.dumps({"\U0001f600": 1, "\ue000": 2})
    assert _plain([1.5]) is False
    assert canonical([1.0, 1e-7, 0.1, -0.0]) == rfc8785.dumps([1.0, 1e-7, 0.1, -0.0])


def test_the_database_clock_estimate_follows_the_server_and_never_goes_back() -> None:
    import time

    from safepoint.storage.postgres.clock import ClockEstimate

    clock = ClockEstimate(resample_s=60)
    assert clock.due()
    local = time.time()
    clock.sample(server_ms=round(local * 1000) + 5_000, before_s=local, after_s=local)
    assert not clock.due()  # read again only once the resample interval passed
    first = clock.now()
    assert abs(first - (time.time() * 1000 + 5_000)) < 1_000  # the server runs 5 s ahead
    clock.sample(server_ms=round(local * 1000) - 5_000, before_s=local, after_s=local)
    assert clock.now() >= first  # a later, earlier-looking sample never moves "now" back


def test_a_stored_value_this_version_cannot_read_is_a_corrupt_record_naming_row_and_columns(
        ) -> None:
    """Every column of a row is checked as it is read: an unknown enum value, NULL where a
    value is required, a time that is not an integer, JSON of the wrong shape — each named,
    all at once, never a decoder's own error."""
    from safepoint.storage._rows import operation_record

    row = {"run_id": "r", "operation_id": "op-1", "step_id": "s", "effect": "pay",
           "state": "accepted", "payload_ref": "sha256:0", "effect_key": "k",
           "dispatch_count": 1, "first_dispatched_at": None, "receipt": '{"id": 1}',
           "error": None, "fence": 1, "prepared_at": 5, "updated_at": 6,
           "approval_required": 0, "target_digest": None, "approval_id": None}
    op = operation_record(row)
    assert (op.state, op.receipt, op.approval_required) == (EffectState.ACCEPTED, {"id": 1},
                                                            False)
    bad = {**row, "state": "teleported", "effect_key": None, "updated_at": "6", "receipt": "{"}
    with pytest.raises(CorruptRecord) as corrupt:
        operation_record(bad)
    assert (corrupt.value.table, corrupt.value.key) == (
        "safepoint_operations", "run_id=r operation_id=op-1")
    reason = corrupt.value.reason
    assert "state: unknown value 'teleported'" in reason
    assert "effect_key: NULL where text is required" in reason
    assert "updated_at: '6' is not an integer" in reason
    assert "receipt: '{' is not JSON" in reason


def test_inputs_of_any_json_type_hash_as_their_json_and_a_lone_surrogate_key_is_refused() -> None:
    """The input scan tests exact types first: subclasses (enums, ordered dicts, named tuples)
    must still hash as the JSON they encode to, and a key Python cannot write as UTF-8 must
    be refused as not JSON, naming the key, never escape as a UnicodeEncodeError."""
    import collections
    import enum

    import rfc8785

    from safepoint._rules.canonical import canonical, canonical_if_json, checked_canonical

    class Level(enum.IntEnum):
        HIGH = 3

    class Colour(enum.StrEnum):
        RED = "red"

    pair = collections.namedtuple("pair", "a b")
    assert canonical([Level.HIGH, Colour.RED]) == b'[3,"red"]'
    assert canonical(collections.OrderedDict(b=1, a=[True, None])) == rfc8785.dumps(
        {"a": [True, None], "b": 1})
    assert canonical_if_json(pair(1, "x"), allow_tuples=True) == b'[1,"x"]'
    assert canonical_if_json((1, 2)) is None  # tuples only where inputs allow them
    assert canonical_if_json({"a": 2**53}) is None
    assert canonical_if_json({"\ud800": 1}) is None
    with pytest.raises(NotJSON, match="lone surrogate") as refused:
        checked_canonical({"ok": {"\ud800": 1}}, "inputs", "s1")
    assert "\\ud800" in str(refused.value)


def test_deeply_nested_inputs_hash_as_before() -> None:
    """The input scan takes one frame per level of nesting: inputs nested 600 deep, which every
    earlier version hashed, still hash (two frames per level would refuse them as not JSON)."""
    from safepoint._rules.canonical import canonical_if_json

    nested_list: object = 1
    nested_dict: object = 1
    for _ in range(600):
        nested_list, nested_dict = [nested_list], {"k": nested_dict}
    assert canonical_if_json(nested_list) == b"[" * 600 + b"1" + b"]" * 600
    assert canonical_if_json(nested_dict, allow_tuples=True) is not None
