"""Step and operation records as the engine builds them: ``revised``, a cheap copy with some
fields changed (every recorded step and effect operation goes through it once or twice), a
step's input hash, and the next step a decision's value names."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, TypeVar

from .._rules.canonical import canonical_if_json, checked_canonical, require_json, sha256_hex
from .._rules.records import record_builder
from .._rules.secrets import hashed_form
from ..errors import InvalidDecision
from ..types import JSON, OperationRecord, StepRecord

Record = TypeVar("Record", StepRecord, OperationRecord)


class _Shape:
    """How ``revised`` copies a record of one class: its fields' getter, each field's place,
    and the builder that sets every field by its slot's own setter (``record_builder``)."""

    __slots__ = ("at", "build", "values")

    def __init__(self, cls: type[Any]) -> None:
        names = tuple(cls.__dataclass_fields__)
        self.values = attrgetter(*names)
        self.at = {name: index for index, name in enumerate(names)}
        self.build = record_builder(cls)


_SHAPES = {cls: _Shape(cls) for cls in (StepRecord, OperationRecord)}


def revised(record: Record, **changes: Any) -> Record:
    """``dataclasses.replace`` for a step or operation record (the same record), without its
    checks of every field on every call: each recorded step and each effect's operation is
    revised once or twice on its way. (Neither class has a ``__post_init__`` to run.)"""
    shape = _SHAPES[type(record)]
    values = list(shape.values(record))
    for name, value in changes.items():
        values[shape.at[name]] = value
    built: Record = shape.build(*values)
    return built


def next_step_id(sid: str, value: JSON) -> str:
    """The step a decision step's value names next (a str, or a dict with ``next_step_id``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("next_step_id"), str):
        return str(value["next_step_id"])
    raise InvalidDecision(sid, f"a {type(value).__name__}")


def input_hash(inputs: Any, sid: str) -> str:
    """sha256 of a step's inputs as their hash covers them (``hashed_form``: Secrets masked,
    Transcripts by reference). Most inputs hold neither, and are encoded as they are in one
    walk; only the others are copied into their hashed form first."""
    encoded = canonical_if_json(inputs, allow_tuples=True)
    if encoded is None:
        try:
            shaped = hashed_form(inputs)
        except RecursionError:  # nested too deep, or containing itself: say where
            require_json(inputs, "inputs", sid, allow_tuples=True)
            raise
        encoded = checked_canonical(shaped, "inputs", sid, allow_tuples=True)
    return sha256_hex(encoded)
