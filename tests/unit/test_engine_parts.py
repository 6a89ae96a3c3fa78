"""Small parts of the engine, alone: crash points, the errors' fields and advice, who may be
declared dead, the database clock estimate, and stored values this version cannot read."""

from __future__ import annotations

import pytest

import safepoint as sp
from safepoint._engine import crashpoints as _crashpoints
from safepoint.errors import CorruptRecord, UsageError
from safepoint.types import EffectState


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
    with pytest.raises(UsageError, match="unknown crash point"):
        _crashpoints.arm("effect.nowhere")
    # a misspelt mode or occurrence is refused, never taken for "kill" or for the first time
    with pytest.raises(UsageError, match="crash mode 'rasie'"):
        _crashpoints.arm("effect.after_dispatching", mode="rasie")
    for spec in ("effect.after_dispatching@0", "effect.after_dispatching@two"):
        with pytest.raises(UsageError, match="occurrence"):
            _crashpoints.arm(spec, mode="raise")


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


def test_a_stored_value_this_version_cannot_read_is_a_corrupt_record_naming_row_and_columns() -> None:
    """Every column of a row is checked as it is read: an unknown enum value, NULL where a
    value is required, a time that is not an integer, JSON of the wrong shape — each named,
    all at once, never a decoder's own error."""
    from safepoint.storage._rows import operation_record

    row = {
        "run_id": "r",
        "operation_id": "op-1",
        "step_id": "s",
        "effect": "pay",
        "state": "accepted",
        "payload_ref": "sha256:0",
        "effect_key": "k",
        "dispatch_count": 1,
        "first_dispatched_at": None,
        "receipt": '{"id": 1}',
        "error": None,
        "fence": 1,
        "prepared_at": 5,
        "updated_at": 6,
        "approval_required": 0,
        "target_digest": None,
        "approval_id": None,
        "key_attempt": 1,
        "dedup_retention_ms": None,
        "family_key": "op op-1",
    }
    op = operation_record(row)
    assert (op.state, op.receipt, op.approval_required) == (EffectState.ACCEPTED, {"id": 1}, False)
    bad = {**row, "state": "teleported", "effect_key": None, "updated_at": "6", "receipt": "{"}
    with pytest.raises(CorruptRecord) as corrupt:
        operation_record(bad)
    assert (corrupt.value.table, corrupt.value.key) == ("safepoint_operations", "run_id=r operation_id=op-1")
    reason = corrupt.value.reason
    assert "state: unknown value 'teleported'" in reason
    assert "effect_key: NULL where text is required" in reason
    assert "updated_at: '6' is not an integer" in reason
    assert "receipt: '{' is not JSON" in reason


def test_a_record_builder_makes_the_record_its_init_makes() -> None:
    import dataclasses

    import pytest

    from safepoint._rules.records import record_builder
    from safepoint.types import OperationRecord, StepKind, StepRecord

    step = StepRecord("r", "s", StepKind.READ, "n", "h", {"a": [1]}, seq=3, observed_at=7, cost=0.5)
    built = record_builder(StepRecord)(*dataclasses.astuple(step))
    assert built == step
    assert [getattr(built, f.name) for f in dataclasses.fields(StepRecord)] == list(dataclasses.astuple(step))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.result = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        record_builder(StepRecord)("r", "s")  # every field, by position
    assert record_builder(OperationRecord).__name__ == "build"

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            raise ValueError

    with pytest.raises(TypeError):
        record_builder(Checked)  # its checks would be skipped
    assert record_builder(StepRecord) is record_builder(StepRecord)  # made once per class
