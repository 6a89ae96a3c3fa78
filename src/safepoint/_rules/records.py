"""Records built without their ``__init__``: the ledger's load makes a step record for every
row, and the engine revises each step and operation record once or twice on its way."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar

from ..types import OperationRecord, StepRecord

_R = TypeVar("_R")

# One builder per class, whoever asks for it (the ledger's load, ``revised``).
_BUILT: dict[type[Any], Callable[..., Any]] = {}


def record_builder(cls: type[_R]) -> Callable[..., _R]:
    """A function that makes a frozen, slotted dataclass's instance from every one of its
    fields, by position, without its ``__init__``: that one assigns each field through
    ``object.__setattr__``, a lookup and a call per field, more than half of what building a
    step's record cost. Made once, the way ``dataclasses`` makes ``__init__``: each field set
    by its slot's own setter. For classes with no ``__post_init__`` and no checks of their own."""
    found = _BUILT.get(cls)
    if found is not None:
        return found
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    if getattr(cls, "__post_init__", None) is not None or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: a slotted dataclass without __post_init__ is needed")
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{name}": cls.__dict__[name].__set__ for name in names})
    lines = [f"def build({', '.join(names)}):", "    made = _new(_cls)"]
    lines += [f"    _set_{name}(made, {name})" for name in names]
    lines.append("    return made")
    exec("\n".join(lines), scope)  # the text is made of the class's own field names
    built: Callable[..., _R] = scope["build"]
    _BUILT[cls] = built
    return built


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


def record_fields(record: Any) -> dict[str, Any]:
    """A record's fields by name, and a record in one of them as its fields too: what
    ``dataclasses.asdict`` gives, without its copy of every list and dict in a recorded value —
    two calls a level, which a value as deep as the ledger takes runs out of (RecursionError)."""
    return {field.name: _field_value(getattr(record, field.name)) for field in dataclasses.fields(record)}


def _field_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return record_fields(value)
    return value
