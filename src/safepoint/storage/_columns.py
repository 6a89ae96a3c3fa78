"""How one stored column becomes its field's value, checked as it is read: the column readers.

Each reader takes the stored value as the driver returned it and gives the field's value, or
raises ``Unread`` saying why it cannot: JSON that does not parse or is not the shape its field
holds (a list where an object belongs), a value this version does not know (a status, a kind, a
state), NULL where a value is required, a time that is not an integer, text that is not UTF-8
(``Undecodable``), a value kept in an artifact or sealed that could not be had (``Unfetched``).
``_rows`` reads a row's columns with them and turns every ``Unread`` into one
``CorruptRecord`` naming the table, the row and the columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from .._rules.canonical import loads
from ..errors import StoreError, UsageError
from ..types import Retry

E = TypeVar("E", bound=Enum)


class Unread(Exception):
    """A stored value its field cannot hold; the message says why."""


class Undecodable(bytes):
    """Stored text that is not UTF-8, as a driver that was asked not to fail on it returns it
    (SQLite: see ``tolerant_text``)."""


class Unfetched:
    """A value kept in an artifact that could not be read (missing, or altered), or sealed with a
    key that does not open it: for a listing, which shows the run as unreadable instead of
    failing."""

    def __init__(self, error: StoreError) -> None:
        self.reason = error.message


def tolerant_text(data: bytes) -> str | Undecodable:
    """A text column's bytes as ``str`` — or, when they are not UTF-8, as ``Undecodable``: for a
    row to be reported unreadable, column by column, instead of failing the whole statement."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return Undecodable(data)


def _shown(value: Any) -> str:
    text = repr(bytes(value) if isinstance(value, Undecodable) else value)
    return text if len(text) <= 200 else text[:200] + "…"


def _wrong(value: Any, wanted: str) -> Unread:
    if value is None:
        return Unread(f"NULL where {wanted} is required")
    if isinstance(value, Undecodable):
        return Unread(f"{_shown(value)} is not UTF-8 text")
    return Unread(f"{_shown(value)} is not {wanted}")


# -- column readers: the stored value in, the field's value out (or Unread) --------------------


def text(value: Any) -> str:
    if value.__class__ is str:
        return value
    raise _wrong(value, "text")


def text_or_null(value: Any) -> str | None:
    return None if value is None else text(value)


def integer(value: Any) -> int:
    if value.__class__ is int:
        return value
    raise _wrong(value, "an integer")


def integer_or_null(value: Any) -> int | None:
    return None if value is None else integer(value)


def number(value: Any) -> float:
    if value.__class__ in (int, float) and math.isfinite(value):
        return value
    raise _wrong(value, "a finite number")


def number_or_null(value: Any) -> float | None:
    return None if value is None else number(value)


def flag(value: Any) -> bool:
    if value in (0, 1) and value.__class__ in (bool, int):  # SQLite keeps booleans as 0 / 1
        return bool(value)
    raise _wrong(value, "true or false")


def json_value(value: Any) -> Any:
    """Stored JSON text (or UTF-8 bytes) parsed; None for NULL."""
    if value is None:
        return None
    if isinstance(value, Unfetched):
        raise Unread(value.reason)
    try:
        return loads(value.decode() if isinstance(value, bytes) else value)
    except UnicodeDecodeError:
        raise Unread(f"{_shown(value)} is not UTF-8 text") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise Unread(f"{_shown(value)} is not JSON ({exc})") from None


def json_object_or_null(value: Any) -> dict[str, Any] | None:
    parsed = json_value(value)
    if parsed is None or isinstance(parsed, dict):
        return parsed
    raise Unread(f"{_shown(value)} is not a JSON object")


def json_object(value: Any) -> dict[str, Any]:
    parsed = json_object_or_null(value)
    if parsed is None:
        raise _wrong(None, "a JSON object")
    return parsed


def workflow_manifest(value: Any) -> dict[str, Any] | None:
    """A run's workflow manifest (``_rules.compat.manifest_of``): tools and prompts as objects of
    digests, models as a list of ids — the shapes a deploy's comparison reads them as."""
    parsed = json_object_or_null(value)
    if parsed is None:
        return None
    for part in ("tools", "prompts"):
        if not isinstance(parsed.get(part) or {}, dict):
            raise Unread(f"{_shown(value)} is not a workflow manifest ({part} not an object)")
    models = parsed.get("models") or []
    if not (isinstance(models, list) and all(isinstance(m, str) for m in models)):
        raise Unread(f"{_shown(value)} is not a workflow manifest (models not a list of ids)")
    return parsed


def retry_policy(value: Any) -> Retry | None:
    """A run's default step attempts (``Retry.as_json``), or None."""
    parsed = json_object_or_null(value)
    if parsed is None:
        return None
    try:
        return Retry.from_json(parsed)
    except (ValueError, KeyError, TypeError, UsageError):
        raise Unread(f"{_shown(value)} is not a step attempts policy") from None


_MEMBERS: dict[type[Enum], dict[Any, Enum]] = {}


def member(kind: type[E]) -> Callable[[Any], E]:
    """The reader of one enum: a value this version of safepoint does not know is unreadable."""
    members = _MEMBERS.get(kind)
    if members is None:
        members = _MEMBERS[kind] = {m.value: m for m in kind}

    def read(value: Any) -> E:
        found = members.get(value) if value.__class__ is str else None
        if found is None:
            known = ", ".join(str(key) for key in members)
            raise Unread(f"unknown value {_shown(value)} (this safepoint knows {known})")
        return found  # type: ignore[return-value]

    return read


# -- what a row's reading may skip ----------------------------------------------------------------


class _Never:
    """The class of no stored value: the column is always read by its reader."""


_KEPT: dict[Callable[[Any], Any], type] = {text: str, text_or_null: str, integer: int, integer_or_null: int}


def kept_class(read: Callable[[Any], Any]) -> type:
    """The class of a stored value ``read`` keeps as it is (text as str, integers as int): a
    row's reading checks it inline, with no call."""
    return _KEPT.get(read, _Never)


# Readers that read NULL as None: a NULL in their column is kept as it is, like a kept class.
NULLABLE = frozenset(
    {
        text_or_null,
        integer_or_null,
        number_or_null,
        json_value,
        json_object_or_null,
        workflow_manifest,
        retry_policy,
    }
)
