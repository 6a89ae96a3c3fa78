"""How stored rows become records, the same way on every store: each column is checked as it is
read (by its reader in ``_columns``), each table's row read as its record here.

A column that cannot be read makes the row a ``CorruptRecord`` naming the table, the row and
every such column; never a decoder's own ``ValueError`` or ``KeyError``, which would read as a
bug (and to a worker as a store to try again). A listing does not fail for one such row:
``listed_run`` gives an ``UnreadableRun`` with what could not be read and every column that
could.

A store hands these functions the row as its driver returned it, and the stored JSON text of
each column held in an artifact (``inputs``, ``result``: read by the store, which may need I/O
for it) in ``values``. A store with a codec (``storage.codec``) passes it too: a sealed column is
opened before it is read, for the place the row names; a store without one pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any, Protocol

from .._rules.answers import WaitRead
from .._rules.fork import SourceStep
from .._rules.records import record_builder
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    DecryptionFailed,
    KeyUnavailable,
)
from ..types import (
    ApprovalRecord,
    AttemptRecord,
    EffectState,
    EventRecord,
    Ledger,
    MessageRecord,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
    UnreadableRun,
)
from ._columns import (
    NULLABLE,
    Unfetched,
    Unread,
    flag,
    integer,
    integer_or_null,
    json_object,
    json_object_or_null,
    json_value,
    kept_class,
    member,
    number,
    number_or_null,
    retry_policy,
    text,
    text_or_null,
    workflow_manifest,
)
from .codec import SEALED, Codec, abandoned_places, is_sealed, open_copied, open_record, open_text


class Row(Protocol):
    """A row as a driver returns it (a dict, a ``sqlite3.Row``): its columns by name."""

    def __getitem__(self, column: str, /) -> Any: ...

    def keys(self) -> Any: ...


NO_VALUES: Mapping[str, Any] = {}
# What an artifact read raises when the artifact cannot be had: the row's value is unreadable.
ARTIFACT_ERRORS = (ArtifactMissing, ArtifactCorrupt)
# What opening a sealed value raises: for a listing, the value is unreadable, the run listed.
UNOPENED = (KeyUnavailable, DecryptionFailed)

# -- each table's columns ----------------------------------------------------------------------

# Each column: its name, the class of a stored value its field keeps as it is (text as str,
# integers as int: checked inline, no call), and its reader for any other value.
Columns = tuple[tuple[str, type, Callable[[Any], Any]], ...]


def _columns(*pairs: tuple[str, Callable[[Any], Any]]) -> Columns:
    return tuple((name, kept_class(read), read) for name, read in pairs)


_RUN = _columns(
    ("run_id", text),
    ("workflow", text),
    ("workflow_version", text),
    ("status", member(RunStatus)),
    ("input_hash", text),
    ("inputs", json_value),
    ("state_revision", integer),
    ("owner", text_or_null),
    ("lease_expires_at", integer_or_null),
    ("fence", integer),
    ("resume_count", integer),
    ("event_count", integer),
    ("result", json_value),
    ("error", json_object_or_null),
    ("recovery_record", json_object_or_null),
    ("created_at", integer),
    ("updated_at", integer),
    ("resume_budget", integer_or_null),
    ("cancel_requested_at", integer_or_null),
    ("workflow_fingerprint", text_or_null),
    ("workflow_manifest", workflow_manifest),
    ("deadline_at", integer_or_null),
    ("token_budget", integer_or_null),
    ("cost_budget", number_or_null),
    ("tokens_spent", integer),
    ("cost_spent", number),
    ("step_attempts", retry_policy),
    ("waiting_for", json_object_or_null),
    ("step_count", integer),
    ("history_soft_limit", integer_or_null),
    ("history_hard_limit", integer_or_null),
    ("history_warned_at", integer_or_null),
    ("chain_id", text_or_null),
    ("chain_index", integer),
    ("parent_run_id", text_or_null),
    ("successor_run_id", text_or_null),
    ("model_call_budget", integer_or_null),
    ("model_calls_spent", integer),
    ("step_attempt_limit", integer_or_null),
    ("wake_at", integer_or_null),
    ("forked_from", json_object_or_null),
    ("heartbeat_at", integer_or_null),
    ("family_id", text_or_null),
    ("family_generation", integer),
)
# What an unreadable run's listing shows of it, when those columns can be read.
_LISTED = frozenset(UnreadableRun.__dataclass_fields__) - {"run_id", "reason", "columns"}

_STEP = _columns(
    ("step_id", text),
    ("kind", member(StepKind)),
    ("name", text),
    ("input_hash", text),
    ("result", json_value),
    ("seq", integer),
    ("status", member(StepStatus)),
    ("error", json_object_or_null),
    ("next_step_id", text_or_null),
    ("attempt", integer),
    ("model_id", text_or_null),
    ("prompt_hash", text_or_null),
    ("observed_at", integer_or_null),
    ("operation_id", text_or_null),
    ("fence", integer),
    ("recorded_at", integer),
    ("tokens", integer_or_null),
    ("cost", number_or_null),
)

# A step's columns are its record's fields after ``run_id``, in their order: a good row becomes
# its record by position, without a dict of its fields (a ledger's load builds thousands).
_STEP_IN_ORDER = tuple(name for name, _, _ in _STEP) == tuple(StepRecord.__dataclass_fields__)[1:]


_NEW_STEP = record_builder(StepRecord)

_ATTEMPT = _columns(
    ("step_id", text),
    ("attempt", integer),
    ("kind", member(StepKind)),
    ("name", text),
    ("input_hash", text),
    ("error", json_object),
    ("retry_at", integer),
    ("fence", integer),
    ("recorded_at", integer),
)

_OPERATION = _columns(
    ("run_id", text),
    ("operation_id", text),
    ("step_id", text),
    ("effect", text),
    ("state", member(EffectState)),
    ("payload_ref", text),
    ("effect_key", text),
    ("dispatch_count", integer),
    ("first_dispatched_at", integer_or_null),
    ("receipt", json_value),
    ("error", json_value),
    ("fence", integer),
    ("prepared_at", integer),
    ("updated_at", integer),
    ("approval_required", flag),
    ("target_digest", text_or_null),
    ("approval_id", text_or_null),
    ("key_attempt", integer),
    ("dedup_retention_ms", integer_or_null),
    ("family_key", text_or_null),
)

_EVENT = _columns(
    ("event_id", integer),
    ("run_id", text),
    ("at", integer),
    ("kind", text),
    ("step_id", text_or_null),
    ("operation_id", text_or_null),
    ("fence", integer_or_null),
    ("worker", text_or_null),
    ("detail", json_value),
)

_APPROVAL = _columns(
    ("approval_id", text),
    ("run_id", text),
    ("operation_id", text),
    ("step_id", text),
    ("payload_digest", text),
    ("target_digest", text_or_null),
    ("approved_by", text),
    ("approved_at", integer),
    ("expires_at", integer_or_null),
    ("evidence", text_or_null),
    ("revoked_at", integer_or_null),
    ("revoked_by", text_or_null),
    ("revoke_reason", text_or_null),
)


_MESSAGE = _columns(
    ("seq", integer),
    ("run_id", text),
    ("name", text),
    ("payload", json_value),
    ("sent_at", integer),
    ("message_id", text_or_null),
    ("sent_by", text_or_null),
    ("taken_by", text_or_null),
    ("taken_at", integer_or_null),
    ("for_wait", text_or_null),
)

# -- reading a row -----------------------------------------------------------------------------

_MAX_SHAPES = 64  # combinations of classes one statement's rows come in: a handful, never many


class Reading:
    """How the rows of one statement are read, made once for them all: the columns' values
    taken in one call — by position from a row that is a sequence with names (``sqlite3.Row``,
    which looks a name up by comparing it with each column's name in turn), by name from a
    dict — and, for each combination of the values' classes met (a row's *shape*: text, an
    integer, NULL, …), the columns whose values are not kept as they are and go through their
    reader. So a good row costs a few calls in C and one per such column, not one per column."""

    __slots__ = ("columns", "names", "shapes", "take")

    def __init__(self, columns: Columns, at: tuple[int, ...] | None) -> None:
        self.columns = columns
        self.names = tuple(name for name, _, _ in columns)
        self.take = itemgetter(*(self.names if at is None else at))
        self.shapes: dict[tuple[type, ...], tuple[tuple[int, str, Callable[[Any], Any]], ...]] = {}

    def to_read(self, shape: tuple[type, ...]) -> tuple[tuple[int, str, Callable[[Any], Any]], ...]:
        """(index, column, reader) of each column a row of ``shape`` needs read."""
        found = self.shapes.get(shape)
        if found is None:
            found = tuple(
                (index, name, read)
                for index, ((name, kept, read), kind) in enumerate(zip(self.columns, shape, strict=True))
                if not (kind is kept or (kind is type(None) and read in NULLABLE))
            )
            if len(self.shapes) < _MAX_SHAPES:
                self.shapes[shape] = found
        return found


_READINGS: dict[tuple[int, tuple[str, ...] | None], Reading] = {}


def reading(columns: Columns, row: Row) -> Reading:
    """The ``Reading`` of rows like ``row`` (the same for every row of one statement: a loop
    asks once). A sequence row that lacks a column is read by name, which reports which."""
    names = None if isinstance(row, dict) else tuple(row.keys())
    key = (id(columns), names)
    found = _READINGS.get(key)
    if found is not None:
        return found
    at: tuple[int, ...] | None = None
    if names is not None:
        index: dict[str, int] = {}
        for place, name in enumerate(names):  # the first of equal names, as a lookup by name
            index.setdefault(name.lower() if name.isascii() else name, place)
        if all(column in index for column, _, _ in columns):
            at = tuple(index[column] for column, _, _ in columns)
    found = Reading(columns, at)
    if len(_READINGS) < 256:  # a store reads rows of a few shapes: never many
        _READINGS[key] = found
    return found


def _values(how: Reading, row: Row) -> list[Any]:
    """A good row's fields, in the order of its columns (``Unread`` at a column that cannot be
    read: ``_read`` then says which, and why)."""
    got = how.take(row)
    shape = tuple(map(type, got))
    found = list(got)
    for index, _, read in how.to_read(shape):
        found[index] = read(got[index])
    return found


def _read(
    columns: Columns, row: Row, values: Mapping[str, Any], how: Reading | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Every column read: the fields that could be, and (column, why) for each that could
    not. (One ``try`` for a whole good row: replay reads thousands of them.) ``how``: the
    ``reading`` of the row's statement, where the caller has it."""
    try:
        if how is None:
            how = reading(columns, row)
        fields = dict(zip(how.names, _values(how, row), strict=True))
        for column, value in values.items():
            fields[column] = json_value(value)  # the JSON columns an artifact holds
        return fields, []
    except (Unread, KeyError, IndexError):
        pass
    fields, problems = {}, []
    for column, _, read in columns:
        try:
            fields[column] = read(values[column] if column in values else row[column])
        except Unread as exc:
            problems.append((column, str(exc)))
        except (KeyError, IndexError):  # a statement that did not return the column
            problems.append((column, "missing from the row"))
    return fields, problems


def _reason(problems: list[tuple[str, str]]) -> str:
    return "; ".join(f"{column}: {why}" for column, why in problems)


def _key(row: Row, *names: str) -> str:
    return " ".join(f"{name}={_plain(_column(row, name))}" for name in names)


def _column(row: Row, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, IndexError):
        return None


def _plain(value: Any) -> str:
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


def opened(
    table: str,
    row: Row,
    values: Mapping[str, Any],
    codec: Codec,
    key: tuple[Any, ...],
    *,
    listing: bool = False,
) -> Row:
    """The row with each sealed column of ``table`` opened for its place (``key``: the row's
    key, as ``codec.SEALED`` names it); the row itself when none is sealed. ``listing``: a
    value that does not open is kept as ``Unfetched``, to show, instead of raised."""
    found: dict[str, Any] | None = None
    for column in SEALED[table][0]:
        if column in values:
            continue  # held in an artifact: opened as it was read
        value = _column(row, column)
        if not is_sealed(value):
            continue
        if found is None:
            found = {name: row[name] for name in row.keys()}  # noqa: SIM118 (sqlite3.Row)
        try:
            found[column] = open_text(codec, value, table, column, *key)
        except UNOPENED as exc:
            if not listing:
                raise
            found[column] = Unfetched(exc)
    return row if found is None else found


def _key_of(table: str, row: Row) -> tuple[Any, ...]:
    return tuple(_column(row, name) for name in SEALED[table][1])


def _whole(
    table: str,
    columns: Columns,
    row: Row,
    values: Mapping[str, Any],
    *key: str,
    codec: Codec | None = None,
    place: tuple[Any, ...] | None = None,
    how: Reading | None = None,
) -> dict[str, Any]:
    if codec is not None:  # a row opened is a dict: read by name, never with a sequence's reading
        row, how = opened(table, row, values, codec, place or _key_of(table, row)), None
    fields, problems = _read(columns, row, values, how)
    if problems:
        raise CorruptRecord(table, _key(row, *key), _reason(problems))
    return fields


def run_record(row: Row, values: Mapping[str, Any] = NO_VALUES, codec: Codec | None = None) -> RunRecord:
    """A ``safepoint_runs`` row as a ``RunRecord``; ``CorruptRecord`` when it cannot be read."""
    fields = _whole("safepoint_runs", _RUN, row, values, "run_id", codec=codec)
    if codec is not None and fields["recovery_record"] is not None:
        fields["recovery_record"] = open_record(codec, fields["recovery_record"], fields["run_id"])
    return RunRecord(**fields)


def listed_run(
    row: Row, values: Mapping[str, Any] = NO_VALUES, codec: Codec | None = None
) -> RunRecord | UnreadableRun:
    """A ``safepoint_runs`` row as a listing shows it: a ``RunRecord``, or an ``UnreadableRun``
    with what could not be read and the columns that could."""
    if codec is not None:
        row = opened("safepoint_runs", row, values, codec, _key_of("safepoint_runs", row), listing=True)
    fields, problems = _read(_RUN, row, values)
    if codec is not None and fields.get("recovery_record") is not None:
        try:
            fields["recovery_record"] = open_record(codec, fields["recovery_record"], fields["run_id"])
        except UNOPENED as exc:
            fields.pop("recovery_record")
            problems.append(("recovery_record", exc.message))
    if not problems:
        return RunRecord(**fields)
    return UnreadableRun(
        run_id=fields.get("run_id") or _plain(_column(row, "run_id")),
        reason=_reason(problems),
        columns=tuple(column for column, _ in problems),
        **{name: value for name, value in fields.items() if name in _LISTED},
    )


def ledger(
    run: RunRecord,
    steps: Iterable[tuple[Row, Mapping[str, Any]]],
    operations: Iterable[Row],
    attempts: Iterable[Row],
    codec: Codec | None = None,
) -> Ledger:
    """A run's ledger from its rows: its steps (each with the stored JSON of its result when
    that is an artifact), operations and failed attempts."""
    found = Ledger(run)
    run_id = run.run_id
    place: tuple[Any, ...] | None
    how: Reading | None = None
    for row, values in steps:
        step = None
        if codec is None:  # sealed rows are opened first, column by column
            if how is None:
                how = reading(_STEP, row)
            step = _step_in_order(run_id, how, row) if _STEP_IN_ORDER and not values else None
        if step is None:  # read column by column, naming each that cannot be read
            place = None if codec is None else (run_id, row["step_id"])
            step = StepRecord(
                run_id=run_id,
                **_whole(
                    "safepoint_steps",
                    _STEP,
                    row,
                    values,
                    "run_id",
                    "step_id",
                    codec=codec,
                    place=place,
                    how=how,
                ),
            )
        found.steps[step.step_id] = step
    for row in operations:
        op = operation_record(row, codec)
        found.operations[op.operation_id] = op
    for row in attempts:
        place = None if codec is None else (run_id, row["step_id"], row["attempt"])
        attempt = AttemptRecord(
            run_id=run_id,
            **_whole(
                "safepoint_attempts",
                _ATTEMPT,
                row,
                NO_VALUES,
                "run_id",
                "step_id",
                "attempt",
                codec=codec,
                place=place,
            ),
        )
        found.attempts.setdefault(attempt.step_id, []).append(attempt)
    return found


def _step_in_order(run_id: str, how: Reading, row: Row) -> StepRecord | None:
    """A good step row's record, built from its fields by position (most rows); None for a row
    that cannot be read so."""
    try:
        return _NEW_STEP(run_id, *_values(how, row))
    except (Unread, KeyError, IndexError):
        return None


def operation_record(row: Row, codec: Codec | None = None) -> OperationRecord:
    return OperationRecord(
        **_whole("safepoint_operations", _OPERATION, row, NO_VALUES, "run_id", "operation_id", codec=codec)
    )


def event_record(row: Row, codec: Codec | None = None) -> EventRecord:
    fields = _whole("safepoint_events", _EVENT, row, NO_VALUES, "event_id", codec=codec)
    detail = fields["detail"]
    if codec is not None and fields["kind"] == "step.abandoned" and isinstance(detail, dict):
        # the step's row as it was stored, sealed again for this event's row by the re-plan
        # (or, written before values were bound to their row, still for the step's)
        event, step = abandoned_places(fields["run_id"], fields["step_id"], fields["event_id"])
        for column in ("result", "error"):
            if column in detail:
                detail[column] = open_copied(codec, detail[column], *event(column), earlier=step(column))
    return EventRecord(**fields)


def approval_record(row: Row, codec: Codec | None = None) -> ApprovalRecord:
    """A ``safepoint_approvals`` row as an ``ApprovalRecord`` (its evidence and revocation
    reason opened, with a codec)."""
    return ApprovalRecord(
        **_whole("safepoint_approvals", _APPROVAL, row, NO_VALUES, "approval_id", codec=codec)
    )


def message_record(
    row: Row, values: Mapping[str, Any] = NO_VALUES, codec: Codec | None = None
) -> MessageRecord:
    """A ``safepoint_messages`` row as a ``MessageRecord`` (``values``: its payload's stored
    JSON when an artifact holds it)."""
    return MessageRecord(**_whole("safepoint_messages", _MESSAGE, row, values, "run_id", "seq", codec=codec))


_WAIT_STEP = _columns(("kind", member(StepKind)), ("name", text), ("status", member(StepStatus)))


def wait_read(step: Row | None, answered: MessageRecord | None, timeout_at: int | None) -> WaitRead:
    """What an answer to a wait is decided on (``_rules.answers.WaitRead``): the wait's step row
    as recorded (``answer_wait_step``; None: not recorded), the message that answered it, and
    the timeout instant recorded when it first waited."""
    if step is None:
        return WaitRead(answered=answered, timeout_at=timeout_at)
    fields = _whole("safepoint_steps", _WAIT_STEP, step, NO_VALUES, "name")
    return WaitRead(fields["kind"], fields["name"], fields["status"], answered, timeout_at)


def stored_json(
    value: Any, table: str, key: str, sealed: tuple[Codec, str, tuple[Any, ...]] | None = None
) -> Any:
    """One stored JSON value read back (None for NULL); ``CorruptRecord`` (naming the row) for
    one that cannot be read. ``sealed``: the store's codec, the column and the row's key, to
    open the value with when it is sealed."""
    if sealed is not None and is_sealed(value):
        codec, column, row_key = sealed
        value = open_text(codec, value, table, column, *row_key)
    try:
        return json_value(value)
    except Unread as exc:
        raise CorruptRecord(table, key, str(exc)) from None


_SOURCE_STEP = _columns(
    ("step_id", text),
    ("seq", integer),
    ("kind", text),
    ("operation_id", text_or_null),
    ("tokens", integer_or_null),
    ("cost", number_or_null),
    ("recorded_at", integer),
)


def source_step(row: Row) -> SourceStep:
    """A ``safepoint_steps`` row as a fork reads it (``fork_run_steps``): where it stands and
    what it spent."""
    return SourceStep(**_whole("safepoint_steps", _SOURCE_STEP, row, NO_VALUES, "run_id", "step_id"))
