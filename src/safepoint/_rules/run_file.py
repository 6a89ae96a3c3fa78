"""A recorded run as a portable document: what ``safepoint export`` writes and a replay reads.

``RecordedRun`` is everything a replay needs of one run, as records: the run, its steps,
operations (with the payload each carries), failed attempts, approvals, messages and events.
``run_document`` makes the versioned JSON document of it (``schemas/run-file.v1.schema.json``
describes it); ``recorded_run`` reads such a document back, checked, or says what is wrong
(``RunFileInvalid``, naming the place: ``steps[3].kind``). No I/O here: the store is read
elsewhere (``_engine.exported``).

Each record is written as its fields by name (``record_fields``): enums as their values, times
as epoch milliseconds on the recording store's clock, a run's step attempts as the numbers the
ledger keeps of them (``Retry.as_json``: ``retry_on`` is code, which no ledger keeps). An
operation carries its payload as the JSON value it is: the bytes the ledger keeps are that
value's canonical form (RFC 8785), the one whose digest is ``payload_ref``, and the reader
makes them again and checks the digest. Bytes that are not the canonical form of a JSON value
(a store's caller may keep any bytes) are carried whole as well, in ``payload_base64``, so
that nothing is lost.

Versions: a document says its ``version``. A record that gains a field is a new version, since
a reader that does not know the field would drop it: this reader refuses a newer version (with
a message to upgrade safepoint) and any field it does not know, and reads an older version as it
was written — a field that version did not have takes its default.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import NoneType, UnionType
from typing import Any

from ..errors import RunFileInvalid, UsageError
from ..types import (
    ApprovalRecord,
    AttemptRecord,
    EventRecord,
    MessageRecord,
    OperationRecord,
    Retry,
    RunRecord,
    StepRecord,
)
from .canonical import canonical, canonical_if_json, digest, find_non_json, loads
from .records import record_fields

FORMAT = "safepoint.run"
VERSION = 1

# The parts of a document, in the order it is written; each one is required.
_PARTS = ("run", "steps", "operations", "attempts", "approvals", "messages", "events")
# What an operation carries besides its record's fields.
_PAYLOAD, _PAYLOAD_BYTES = "payload", "payload_base64"


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """One run as its ledger holds it."""

    run: RunRecord
    steps: Mapping[str, StepRecord] = field(default_factory=dict)
    operations: Mapping[str, OperationRecord] = field(default_factory=dict)
    attempts: Mapping[str, list[AttemptRecord]] = field(default_factory=dict)
    approvals: list[ApprovalRecord] = field(default_factory=list)
    messages: list[MessageRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    payloads: Mapping[str, bytes] = field(default_factory=dict)  # payload_ref -> the bytes stored


# -- writing ---------------------------------------------------------------------------------------


def run_document(recorded: RecordedRun) -> dict[str, Any]:
    """The JSON-ready document of ``recorded`` (format ``FORMAT``, version ``VERSION``): steps in
    the order they were recorded, operations in the order they were prepared, attempts by step
    id, approvals, messages and events as the store lists them.

    An operation whose payload ``recorded`` lacks is written with a null payload (``safepoint
    show --json`` of a run whose artifact cannot be read); ``recorded_run`` refuses it, since
    its digest does not match."""
    run = record_fields(recorded.run)
    if recorded.run.step_attempts is not None:
        run["step_attempts"] = recorded.run.step_attempts.as_json()
    operations = sorted(recorded.operations.values(), key=lambda op: (op.prepared_at, op.operation_id))
    return {
        "format": FORMAT,
        "version": VERSION,
        "run": run,
        "steps": [record_fields(step) for step in sorted(recorded.steps.values(), key=lambda s: s.seq)],
        "operations": [operation_fields(op, recorded.payloads.get(op.payload_ref)) for op in operations],
        "attempts": {
            step_id: [record_fields(attempt) for attempt in tried]
            for step_id, tried in sorted(recorded.attempts.items())
        },
        "approvals": [record_fields(approval) for approval in recorded.approvals],
        "messages": [record_fields(message) for message in recorded.messages],
        "events": [record_fields(event) for event in recorded.events],
    }


def operation_fields(op: OperationRecord, stored: bytes | None) -> dict[str, Any]:
    """An operation's fields and its payload: the JSON value its stored bytes hold, and the
    bytes themselves (base64) when they are not that value's canonical form. ``stored`` None:
    the payload could not be had; it is written null."""
    entry = record_fields(op)
    entry[_PAYLOAD] = None
    if stored is None:
        return entry
    entry[_PAYLOAD], form = _held(stored)
    if form != stored:
        entry[_PAYLOAD_BYTES] = base64.b64encode(stored).decode("ascii")
    return entry


def _held(stored: bytes) -> tuple[Any, bytes | None]:
    """The JSON value stored bytes hold and its canonical form; (None, None) when they hold
    none (not UTF-8, not JSON, or not the JSON the ledger records: NaN, an integer past 2**53)."""
    try:
        value = loads(stored)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None, None
    form = canonical_if_json(value)
    return (None, None) if form is None else (value, form)


# -- reading ---------------------------------------------------------------------------------------

_UPGRADE = "upgrade safepoint to read it (pip install --upgrade safepoint)"


def recorded_run(document: Any) -> RecordedRun:
    """The run a document holds; ``RunFileInvalid`` naming what is wrong and where."""
    if not isinstance(document, dict):
        raise RunFileInvalid("$", f"the document is {_kind(document)}, not a JSON object")
    _check_format(document)
    unknown = [key for key in document if key not in ("format", "version", *_PARTS)]
    if unknown:
        raise RunFileInvalid(str(unknown[0]), f"is not part of a run file of version {VERSION}")
    for part in _PARTS:
        if part not in document:
            raise RunFileInvalid(part, "is missing")
    run = _record(RunRecord, document["run"], "run")
    steps: dict[str, StepRecord] = {}
    for path, value in _items(document, "steps"):
        step = _owned(_record(StepRecord, value, path), run, path)
        if step.step_id in steps:
            raise RunFileInvalid(f"{path}.step_id", f"step {step.step_id!r} is recorded twice")
        steps[step.step_id] = step
    operations: dict[str, OperationRecord] = {}
    payloads: dict[str, bytes] = {}
    for path, value in _items(document, "operations"):
        op, stored = _operation(value, path)
        _owned(op, run, path)
        if op.operation_id in operations:
            raise RunFileInvalid(f"{path}.operation_id", f"operation {op.operation_id!r} is listed twice")
        operations[op.operation_id] = op
        payloads[op.payload_ref] = stored
    return RecordedRun(
        run=run,
        steps=steps,
        operations=operations,
        attempts=_attempts(document["attempts"], run),
        approvals=[_owned(_record(ApprovalRecord, v, p), run, p) for p, v in _items(document, "approvals")],
        messages=[_owned(_record(MessageRecord, v, p), run, p) for p, v in _items(document, "messages")],
        events=[_owned(_record(EventRecord, v, p), run, p) for p, v in _items(document, "events")],
        payloads=payloads,
    )


def _check_format(document: dict[str, Any]) -> None:
    if "format" not in document:
        raise RunFileInvalid("format", f"is missing: a run file says format {FORMAT!r}")
    if document["format"] != FORMAT:
        raise RunFileInvalid(
            "format", f"is {_shown(document['format'])}, not {FORMAT!r}: this is no safepoint run file"
        )
    version = document.get("version")
    if "version" not in document:
        raise RunFileInvalid("version", "is missing: a run file says its version")
    if type(version) is not int or version < 1:
        raise RunFileInvalid("version", f"is {_shown(version)}, not a version (an integer of 1 or more)")
    if version > VERSION:
        raise RunFileInvalid(
            "version",
            f"the file is of version {version}, and this safepoint reads versions up to {VERSION}",
            _UPGRADE,
        )


def _items(document: dict[str, Any], part: str) -> list[tuple[str, Any]]:
    """The items of one list of the document, each with its path (``steps[3]``)."""
    values = document[part]
    if not isinstance(values, list):
        raise RunFileInvalid(part, f"is {_kind(values)}, not an array")
    return [(f"{part}[{index}]", value) for index, value in enumerate(values)]


def _attempts(value: Any, run: RunRecord) -> dict[str, list[AttemptRecord]]:
    if not isinstance(value, dict):
        raise RunFileInvalid("attempts", f"is {_kind(value)}, not an object of step ids")
    attempts: dict[str, list[AttemptRecord]] = {}
    for step_id, tried in value.items():
        if not isinstance(step_id, str):
            raise RunFileInvalid("attempts", f"has the key {_shown(step_id)}, not a step id")
        where = f"attempts[{json.dumps(step_id, ensure_ascii=False)}]"
        if not isinstance(tried, list):
            raise RunFileInvalid(where, f"is {_kind(tried)}, not an array")
        attempts[step_id] = []
        for index, item in enumerate(tried):
            path = f"{where}[{index}]"
            attempt = _owned(_record(AttemptRecord, item, path), run, path)
            if attempt.step_id != step_id:
                raise RunFileInvalid(
                    f"{path}.step_id", f"is {attempt.step_id!r}, an attempt of another step than {step_id!r}"
                )
            attempts[step_id].append(attempt)
    return attempts


def _operation(value: Any, path: str) -> tuple[OperationRecord, bytes]:
    """An operation's record and its payload's bytes, checked against its ``payload_ref``."""
    if not isinstance(value, dict):
        raise RunFileInvalid(path, f"is {_kind(value)}, not an object")
    if _PAYLOAD not in value:
        raise RunFileInvalid(f"{path}.{_PAYLOAD}", "is missing")
    op = _record(
        OperationRecord, {k: v for k, v in value.items() if k not in (_PAYLOAD, _PAYLOAD_BYTES)}, path
    )
    payload = value[_PAYLOAD]
    where = f"{path}.{_PAYLOAD}"
    if _PAYLOAD_BYTES in value:
        where = f"{path}.{_PAYLOAD_BYTES}"
        stored = _payload_bytes(value[_PAYLOAD_BYTES], payload, where)
        what = "its payload_base64 bytes"
    else:
        found = find_non_json(payload)
        if found is not None:
            raise RunFileInvalid(f"{path}.{_PAYLOAD}{found[0][1:]}", f"is a {found[1]}, not a JSON value")
        stored = canonical(payload)
        what = "its payload's canonical bytes"
    if digest(stored) != op.payload_ref:
        raise RunFileInvalid(
            where,
            f"{what} have the digest {digest(stored)}, not its payload_ref {op.payload_ref}:"
            " the payload is not the one recorded",
        )
    return op, stored


def _payload_bytes(text: Any, payload: Any, path: str) -> bytes:
    """The stored bytes a ``payload_base64`` holds, which must hold ``payload`` (null for bytes
    that hold no JSON value)."""
    if not isinstance(text, str):
        raise RunFileInvalid(path, f"is {_kind(text)}, not base64 text")
    try:
        stored = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RunFileInvalid(path, "is not base64 text") from None
    if _held(stored)[0] != payload:
        raise RunFileInvalid(path, "holds another value than the operation's payload")
    return stored


def _owned(record: Any, run: RunRecord, path: str) -> Any:
    """``record``, once its ``run_id`` is the run's: a run file holds one run."""
    if record.run_id != run.run_id:
        raise RunFileInvalid(
            f"{path}.run_id", f"is {record.run_id!r}, another run than the file's ({run.run_id!r})"
        )
    return record


# -- a record from its fields ----------------------------------------------------------------------

Reader = Callable[[Any, str], Any]
_FIELDS: dict[type[Any], dict[str, Reader]] = {}


def _record(cls: type[Any], value: Any, path: str) -> Any:
    """The record of class ``cls`` whose fields ``value`` holds, each checked: every field there,
    none other, each of the type the record declares."""
    readers = _FIELDS.get(cls)
    if readers is None:
        hints = typing.get_type_hints(cls)
        readers = _FIELDS[cls] = {f.name: _reader(hints[f.name]) for f in dataclasses.fields(cls)}
    if not isinstance(value, dict):
        raise RunFileInvalid(path, f"is {_kind(value)}, not an object")
    unknown = [key for key in value if key not in readers]
    if unknown:
        raise RunFileInvalid(
            f"{path}.{unknown[0]}", f"is no field of {cls.__name__} in a run file of version {VERSION}"
        )
    fields = {}
    for name, read in readers.items():
        if name not in value:
            raise RunFileInvalid(f"{path}.{name}", "is missing")
        fields[name] = read(value[name], f"{path}.{name}")
    return cls(**fields)


def _reader(hint: Any) -> Reader:
    """How a field declared ``hint`` is read: checked, and made the value the record holds."""
    parts = typing.get_args(hint) if isinstance(hint, UnionType) else ()
    if NoneType in parts:
        (inner,) = (part for part in parts if part is not NoneType)
        read = _reader(inner)
        return lambda value, path: None if value is None else read(value, path)
    if hint is Any:
        return _json
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return _enum(hint)
    if hint is Retry:
        return _retry
    if typing.get_origin(hint) is dict:
        return lambda value, path: _json(_typed(value, path, dict, "an object"), path)
    simple: dict[Any, Reader] = {
        str: lambda value, path: _typed(value, path, str, "a string"),
        bool: lambda value, path: _typed(value, path, bool, "true or false"),
        int: _integer,
        float: _number,
    }
    if hint not in simple:
        raise TypeError(f"a record field of type {hint!r}: say how a run file reads it")
    return simple[hint]


def _typed(value: Any, path: str, kind: type[Any], what: str) -> Any:
    if type(value) is not kind:
        raise RunFileInvalid(path, f"is {_kind(value)}, not {what}")
    return value


def _integer(value: Any, path: str) -> int:
    if type(value) is not int:
        raise RunFileInvalid(path, f"is {_kind(value)}, not an integer")
    return value


def _number(value: Any, path: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RunFileInvalid(path, f"is {_kind(value)}, not a finite number")
    result: float = value
    return result


def _json(value: Any, path: str) -> Any:
    """A recorded JSON value, as a copy: the record must not share its lists and dicts with the
    document, which the caller may go on changing."""
    found = find_non_json(value)
    if found is not None:
        raise RunFileInvalid(f"{path}{found[0][1:]}", f"is a {found[1]}, not a JSON value")
    return copy.deepcopy(value)


def _enum(kind: type[StrEnum]) -> Reader:
    known = {member.value: member for member in kind}

    def read(value: Any, path: str) -> StrEnum:
        if isinstance(value, str) and value in known:  # its value, or the member itself
            return known[value]
        raise RunFileInvalid(
            path,
            f"{_shown(value)} is not a {kind.__name__} this safepoint knows ({', '.join(known)});"
            " a value a newer safepoint recorded",
            _UPGRADE,
        )

    return read


_RETRY_FIELDS = ("attempts", "backoff", "multiplier", "max_backoff", "jitter")


def _retry(value: Any, path: str) -> Retry:
    """A run's step attempts, as ``Retry.as_json`` writes them."""
    if not isinstance(value, dict):
        raise RunFileInvalid(path, f"is {_kind(value)}, not an object")
    for name in value:
        if name not in _RETRY_FIELDS:
            raise RunFileInvalid(f"{path}.{name}", "is no field of a run's step attempts")
    for name in _RETRY_FIELDS:
        if name not in value:
            raise RunFileInvalid(f"{path}.{name}", "is missing")
    _integer(value["attempts"], f"{path}.attempts")
    for name in _RETRY_FIELDS[1:]:
        _number(value[name], f"{path}.{name}")
    try:
        return Retry.from_json(value)
    except UsageError as exc:
        raise RunFileInvalid(path, exc.message) from None


def _kind(value: Any) -> str:
    """What a JSON value is, as a reason says it."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names.update({list: "an array", dict: "an object"})
    return names.get(type(value), f"a {type(value).__name__}")


def _shown(value: Any) -> str:
    """A value as a reason quotes it: short, whatever it is."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"
