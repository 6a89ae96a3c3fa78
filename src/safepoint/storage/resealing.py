"""Sealed values sealed again, written once for every store as plans (``plans``) over the
``reseal_*`` queries both dialects define alike (see ``storage.codec`` for what is sealed and
for which place).

Three writers need it: a fork, whose rows are copied from its source's in SQL and so stay
sealed for the source's place until they are sealed again for the fork's (in the fork's
transaction); a re-plan, whose ``step.abandoned`` events copy their steps' sealed values in SQL
(``bind_abandoned``, in the re-plan's transaction); and a rotation (``safepoint keys
reencrypt``), which seals every value that is not under the active key yet — or not sealed at
all, stored before the ledger had a codec, or sealed before values were bound to their row
(``codec.UNBOUND``) — with it, one page of rows per transaction, so that it can be stopped and
started again at any point: a value is either still under its old key (or place), which the
keyring keeps (and reads still accept) until the rotation is done, or under the new one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .._rules.canonical import digest as content_digest
from .._rules.canonical import dumps
from ..errors import ArtifactCorrupt, UsageError
from .codec import (
    PREFIX_BYTES,
    SEALED,
    SEALED_EVENTS,
    SEALED_RECORD,
    UNBOUND,
    Codec,
    abandoned_places,
    bound,
    copied_text,
    is_sealed,
    open_artifact,
    open_copied,
    open_text,
    seal_artifact,
    seal_text,
    sealed_key_id,
)
from .ledger import LedgerReads
from .operations import writing
from .plans import Plan, Row

# Each kind of row a rotation walks: its table, its key (the order pages follow, and the row an
# update names), and the queries that read a page of it and write one row back.
TABLES: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "runs": ("safepoint_runs", ("run_id",), "reseal_runs_page", "reseal_runs_update"),
    "steps": ("safepoint_steps", ("run_id", "step_id"), "reseal_steps_page", "reseal_steps_update"),
    "attempts": (
        "safepoint_attempts",
        ("run_id", "step_id", "attempt"),
        "reseal_attempts_page",
        "reseal_attempts_update",
    ),
    "operations": (
        "safepoint_operations",
        ("run_id", "operation_id"),
        "reseal_operations_page",
        "reseal_operations_update",
    ),
    "messages": ("safepoint_messages", ("seq",), "reseal_messages_page", "reseal_messages_update"),
    "events": ("safepoint_events", ("event_id",), "reseal_events_page", "reseal_events_update"),
    "approvals": (
        "safepoint_approvals",
        ("approval_id",),
        "reseal_approvals_page",
        "reseal_approvals_update",
    ),
}
# What sorts before every key: the first page starts after it.
_BEFORE_ALL: dict[str, Any] = {
    "run_id": "",
    "step_id": "",
    "operation_id": "",
    "attempt": -1,
    "seq": -1,
    "event_id": -1,
    "approval_id": "",
}
# The parts of a step's row a ``step.abandoned`` event copies, sealed as the step stored them.
ABANDONED = ("result", "error")
# The rows a fork copies from its source.
FORK_COPIES = ("runs", "steps", "operations")

Key = Mapping[str, Any]


def _sealed_whole(table: str, row: Key) -> bool:
    """Whether the row's ``SEALED`` columns are sealed whole: always, but for an event, whose
    detail is sealed only when it repeats a sealed value (``SEALED_EVENTS``)."""
    return table != "safepoint_events" or row["kind"] in SEALED_EVENTS


# Where each part of a column sealed part by part is sealed for, given the part: (table, column, key…).
Places = Callable[[str], tuple[Any, ...]]


def _inner(row: Key, table: str, run_id: str) -> tuple[str, tuple[str, ...], Places, Places | None]:
    """The column of ``row`` whose JSON holds values sealed one by one inside it, those parts,
    the place each part is sealed for in run ``run_id`` and the place it may have been sealed
    for before (None: none); ("", (), …) when none does. A recovery record seals its reason and
    evidence (``codec.seal_record``); a ``step.abandoned`` event holds its step's result and
    error (``abandoned_places``)."""
    if table == "safepoint_runs":
        return "recovery_record", SEALED_RECORD, lambda part: (table, f"recovery_record.{part}", run_id), None
    if table == "safepoint_events" and row["kind"] == "step.abandoned":
        return "detail", ABANDONED, *abandoned_places(run_id, row["step_id"], row["event_id"])
    return "", (), lambda part: (), None


def bind_abandoned(codec: Codec, rows: list[Row]) -> list[tuple[Any, str]]:
    """The ``step.abandoned`` events a re-plan's statement just wrote (``replan_abandon_steps``
    returns their rows), each holding its step's sealed values as the step's row stored them:
    (event id, detail) of each whose values are sealed again, for the event's own row."""
    bound_rows = []
    for row in rows:
        event, step = abandoned_places(row["run_id"], row["step_id"], row["event_id"])
        detail = _reseal_inner(codec, row["detail"], ABANDONED, step, event, again=True)
        if detail is not None:
            bound_rows.append((row["event_id"], detail))
    return bound_rows


def _reseal_inner(
    codec: Codec,
    text: Any,
    parts: tuple[str, ...],
    old: Places,
    new: Places,
    again: bool,
    earlier: Places | None = None,
) -> str | None:
    """A column's JSON whose ``parts`` are sealed one by one (``_inner``), each sealed with the
    active key for its ``new`` place (opened for its ``old`` one, or its ``earlier`` one); None
    when no part changes. ``again``: parts already under the active key too (a fork's, sealed
    for its source); without it, a part under the active key is sealed again only when it does
    not open for its ``new`` place (sealed for an ``earlier`` one)."""
    if text.__class__ is not str:
        return None
    try:
        value = json.loads(text)
    except ValueError:  # a column a read reports unreadable: left as it is
        return None
    if not isinstance(value, dict):
        return None
    changed = False
    for part in parts:
        found = value.get(part)
        if found is None:
            continue
        sealed = copied_text(found)
        if (
            sealed is not None
            and not again
            and found.get("kid") == codec.key_id
            and (earlier is None or bound(codec, sealed, *new(part)))
        ):
            continue
        before = None if earlier is None else earlier(part)
        plain = found if sealed is None else open_copied(codec, found, *old(part), earlier=before)
        value[part] = json.loads(seal_text(codec, json.dumps(plain), *new(part)) or "null")
        changed = True
    return json.dumps(value) if changed else None


def _codec(reads: LedgerReads) -> Codec:
    if reads.codec is None:
        raise UsageError("sealing values again needs a store opened with a codec (a keyring)")
    return reads.codec


def reseal_page(
    reads: LedgerReads,
    kind: str,
    after: Key | None,
    limit: int,
    *,
    run_id: str | None = None,
    sealed_for: str | None = None,
) -> Plan[tuple[int, Key | None]]:
    """Seal again the values of one page of ``kind``'s rows (``TABLES``) after ``after``:
    (how many rows changed, the page's last key — None when it was the last page).
    ``run_id``: only that run's rows. ``sealed_for``: the run whose place the values are sealed
    for (a fork's source), each sealed again for its own row; without it, only what is not
    under the active key is."""
    codec = _codec(reads)
    table, key, page, update = TABLES[kind]
    columns, place_columns = SEALED[table]
    start = after or {name: _BEFORE_ALL[name] for name in key}
    rows = yield reads.q(page, run_id=run_id, limit=limit, **{f"after_{k}": v for k, v in start.items()})
    changed = 0
    for row in rows:
        place = tuple(row[name] for name in place_columns)
        was = place if sealed_for is None else (sealed_for, *place[1:])
        if table == "safepoint_events" and row["run_id"] == "":  # the ledger's mark (sealed_since)
            mark = dumps({"key_id": codec.key_id})
            if sealed_for is None and row["detail"] != mark:
                yield reads.q(update, event_id=row["event_id"], detail=mark)
                changed += 1
            continue
        values, moved = {}, False
        inner, parts, new_places, earlier = _inner(row, table, place[0])
        if inner:
            old_places = _inner(row, table, was[0])[2]
            values[inner] = row[inner]
            again = sealed_for is not None
            resealed = _reseal_inner(codec, row[inner], parts, old_places, new_places, again, earlier)
            if resealed is not None:
                values[inner], moved = resealed, True
        for column in columns:
            if column == inner:  # sealed part by part, above
                continue
            value = row[column]
            values[column] = value
            if value.__class__ is not str or not _sealed_whole(table, row):
                continue  # NULL (or text a read would report unreadable), or never sealed whole
            if is_sealed(value):
                if (
                    sealed_for is None
                    and sealed_key_id(value) == codec.key_id
                    and (table not in UNBOUND or bound(codec, value, table, column, *place))
                ):
                    continue  # under the active key, for its row: nothing to do
                value = open_text(codec, value, table, column, *was)
            values[column] = seal_text(codec, value, table, column, *place)
            moved = True
        if moved:
            yield reads.q(update, **{name: row[name] for name in key}, **values)
            changed += 1
    last = {name: rows[-1][name] for name in key} if len(rows) == limit else None
    return changed, last


def reseal_artifacts_page(reads: LedgerReads, after: str | None, limit: int) -> Plan[tuple[int, str | None]]:
    """``reseal_page`` for artifacts: each not under the active key sealed with it, checked
    against its digest first."""
    codec = _codec(reads)
    rows = yield reads.q("reseal_artifacts_page", after_digest=after or "", limit=limit)
    changed = 0
    for row in rows:
        digest, data = row["digest"], bytes(row["content"])
        if data.startswith(PREFIX_BYTES) and sealed_key_id(data.decode(errors="replace")) == codec.key_id:
            continue
        plain = open_artifact(codec, data, digest)
        actual = content_digest(plain)
        if actual != digest:
            raise ArtifactCorrupt(digest, actual)
        yield reads.q("reseal_artifacts_update", digest=digest, content=seal_artifact(codec, plain, digest))
        changed += 1
    return changed, (str(rows[-1]["digest"]) if len(rows) == limit else None)


def reseal_fork(reads: LedgerReads, source_run_id: str, run_id: str) -> Plan[None]:
    """A fork's copied rows, sealed for its source's, sealed again for the fork's own."""
    for kind in FORK_COPIES:
        after: Key | None = None
        while True:
            _, after = yield from reseal_page(
                reads, kind, after, 500, run_id=run_id, sealed_for=source_run_id
            )
            if after is None:
                break


class Resealing(Protocol):
    """A store that seals values again a page at a time (``SqliteStore``, ``PostgresStore``)."""

    def reseal_page(self, kind: str, after: Key | None, limit: int) -> tuple[int, Key | None]: ...

    def reseal_artifacts_page(self, after: str | None, limit: int) -> tuple[int, str | None]: ...


def reencrypt(
    store: object, *, batch: int = 500, progress: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Seal every value of the ledger that is not under the keyring's active key — or not
    sealed at all — with it, ``batch`` rows per transaction: how many rows of each kind
    changed. Safe to stop at any point and run again (what is done is not done twice); once
    it has run to the end, keys older than the active one may leave the keyring.
    ``progress``: told (kind, rows changed) after each page."""
    if not (hasattr(store, "reseal_page") and hasattr(store, "reseal_artifacts_page")):
        raise UsageError(f"{type(store).__name__} cannot seal values again: use SqliteStore or PostgresStore")
    if batch < 1:
        raise UsageError(f"a batch of {batch} rows is not one: give 1 or more")
    resealer: Resealing = store
    changed: dict[str, int] = {}
    for kind in TABLES:
        after: Key | None = None
        changed[kind] = 0
        while True:
            count, after = resealer.reseal_page(kind, after, batch)
            changed[kind] += count
            if progress is not None:
                progress(kind, count)
            if after is None:
                break
    changed["artifacts"] = 0
    digest: str | None = None
    while True:
        count, digest = resealer.reseal_artifacts_page(digest, batch)
        changed["artifacts"] += count
        if progress is not None:
            progress("artifacts", count)
        if digest is None:
            break
    return changed


class ResealOperations:
    """A key rotation's pages, each in one transaction (``operations``)."""

    reseal_page = writing(reseal_page)
    reseal_artifacts_page = writing(reseal_artifacts_page)
