"""Reading the ledger, written once for every store: runs, a run's whole ledger, its events,
approvals and artifacts, as plans (``plans``) over the named queries both dialects define
alike (``get_run``, ``list_runs``, ``load_ledger_*``, ``events``, ``get_artifact`` …), and
how a JSON value is stored — inline, or as an artifact when it is large.

Rows become records in ``_rows`` (column by column, an unreadable one a ``CorruptRecord``);
what this module adds is the I/O a record needs — a value kept in an artifact is read, and
verified against its digest, in the same plan (the same snapshot, where the executor gives
one) — and the order of the reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._rules.canonical import digest as content_digest
from .._rules.canonical import dumps
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    KeyUnavailable,
    RunNotFound,
    UsageError,
)
from ..types import (
    JSON,
    ApprovalRecord,
    EventRecord,
    Ledger,
    LedgerIdentity,
    MessageRecord,
    OperationRecord,
    Resolution,
    RunPage,
    RunQuery,
    RunRecord,
    RunStatus,
    UnreadableRun,
)
from ._columns import Unfetched
from ._rows import (
    ARTIFACT_ERRORS,
    NO_VALUES,
    UNOPENED,
    approval_record,
    event_record,
    ledger,
    listed_run,
    message_record,
    operation_record,
    run_record,
    stored_json,
)
from .codec import SEALED_EVENTS, Codec, open_artifact, seal_artifact, seal_text
from .operations import reading
from .plans import Plan, Queries, Row, Stmt


def stored(
    value: JSON, inline_limit: int, codec: Codec | None = None, *place: Any
) -> tuple[str | None, str | None, bytes | None]:
    """A JSON value as it is stored: (text, None, None) inline, or when it is large
    (None, ref, bytes): the artifact to store it in. With a codec, sealed — inline for its
    ``place`` (table, column, the row's key), an artifact for its digest."""
    text = dumps(value)
    if len(text) <= inline_limit:
        if codec is not None:
            text = seal_text(codec, text, *place)  # type: ignore[assignment]
        return text, None, None
    data = text.encode()
    ref = content_digest(data)
    return None, ref, data if codec is None else seal_artifact(codec, data, ref)


def seals_event(codec: Codec | None, kind: str, detail: JSON) -> bool:
    """Whether an event's detail is stored sealed: with a codec, a detail of a kind that can
    quote the caller's data (``codec.SEALED_EVENTS``)."""
    return codec is not None and detail is not None and kind in SEALED_EVENTS


def event_json(codec: Codec | None, detail: JSON, run_id: str, kind: str, event_id: int | None) -> str | None:
    """An event's detail as it is stored: sealed for its row (``event_id``, taken from the
    table's sequence first: ``sealed_event``) when ``seals_event``."""
    if detail is None:
        return None
    text = dumps(detail)
    if codec is None or kind not in SEALED_EVENTS:
        return text
    assert event_id is not None, "a sealed detail is bound to its row: take its event id first"
    return seal_text(codec, text, "safepoint_events", "detail", run_id, kind, event_id)


def sealed_event(
    reads: LedgerReads, detail: JSON, run_id: str, kind: str
) -> Plan[tuple[int | None, str | None]]:
    """An event's id and detail as they are stored: when ``seals_event``, the id taken from
    the table's sequence (``next_event_id``, in the transaction that inserts the event, right
    before it) and the detail sealed for that row; otherwise no id (the insert takes the next
    one) and the detail as it is."""
    if not seals_event(reads.codec, kind, detail):
        return None, json_or_none(detail)
    rows = yield reads.q("next_event_id")
    event_id = int(rows[0]["event_id"])
    return event_id, event_json(reads.codec, detail, run_id, kind, event_id)


def message_seq(reads: LedgerReads) -> Plan[int | None]:
    """The seq a message is inserted with: on a sealed ledger taken from the table's sequence
    first (``next_message_seq``, right before the insert), so that its payload is sealed for
    its row; None otherwise (the insert takes the next one)."""
    if reads.codec is None:
        return None
    rows = yield reads.q("next_message_seq")
    return int(rows[0]["seq"])


def approval_words(
    codec: Codec | None, text: str | None, column: str, run_id: str, approval_id: str
) -> str | None:
    """A person's words on an approval (its ``evidence``, a ``revoke_reason``) as stored: with a
    codec, sealed for the approval's row."""
    if codec is None or text is None:
        return text
    return seal_text(codec, text, "safepoint_approvals", column, run_id, approval_id)


def revoke_reasons(
    codec: Codec | None, reason: str, run_id: str, revoked: Iterable[ApprovalRecord]
) -> dict[str, Any]:
    """The ``revoke_approval`` statement's reason: one for every row in clear, or with a codec
    each revoked approval's own, sealed for its row (``sealed_reasons``, by approval id)."""
    if codec is None:
        return {"revoke_reason": reason, "sealed_reasons": "{}"}
    sealed = {
        a.approval_id: approval_words(codec, reason, "revoke_reason", run_id, a.approval_id) for a in revoked
    }
    return {"revoke_reason": None, "sealed_reasons": dumps(sealed)}


def json_or_none(value: JSON) -> str | None:
    """A JSON column's text, NULL for None."""
    return None if value is None else dumps(value)


def verified(digest: str, rows: list[Row], codec: Codec | None = None) -> bytes:
    """The artifact's bytes from its row (opened, with a codec), checked against ``digest``."""
    if not rows:
        raise ArtifactMissing(digest)
    data = bytes(rows[0]["content"])
    if codec is not None:
        data = open_artifact(codec, data, digest)
    actual = content_digest(data)
    if actual != digest:
        raise ArtifactCorrupt(digest, actual)
    return data


def identity(rows: list[Row]) -> LedgerIdentity:
    """The ledger's identity from its singleton row."""
    if len(rows) != 1:
        raise CorruptRecord(
            "safepoint_ledger",
            "singleton",
            "the ledger's identity row is missing: it is minted once, by migration 1, and never removed",
        )
    return LedgerIdentity(str(rows[0]["ledger_id"]), int(rows[0]["keyed_since"]))


class LedgerReads:
    """The reading plans every store runs (see the module docstring). ``snapshot``: the
    statement that makes ``load_ledger``'s reads one snapshot, where the dialect needs one;
    ``codec``: what sealed values are opened with (``storage.codec``), None for none;
    ``clock``: the store's clock where the process keeps it (SQLite), or None where the
    statements read the database's (PostgreSQL: ``now=None`` in a statement's parameters)."""

    def __init__(
        self,
        queries: Queries,
        *,
        snapshot: str | None = None,
        codec: Codec | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.q = queries
        self._snapshot = snapshot
        self.codec = codec
        self.clock = clock

    def now(self) -> Plan[int]:
        """The store's clock, as a plan reads it: here the process's (``clock``); a dialect
        whose statements read the database's reads it by a statement (PostgreSQL)."""
        yield from ()
        if self.clock is None:
            raise UsageError("this ledger's store keeps no clock of its own")
        return self.clock()

    def wake_workers(self, workflow: str) -> Plan[None]:
        """A run of ``workflow`` is pending: tell the idle workers, where the dialect can
        (PostgreSQL's NOTIFY). SQLite's workers look for work themselves."""
        yield from ()

    def get_artifact(self, digest: str) -> Plan[bytes]:
        return verified(digest, (yield self.q("get_artifact", digest=digest)), self.codec)

    def artifact_values(self, row: Row, *columns: str, listing: bool = False) -> Plan[dict[str, Any]]:
        """The stored JSON of each of these columns kept in an artifact (``<column>_ref``): for
        a listing, one that cannot be had is a value to show unreadable, not an error."""
        values: dict[str, Any] = {}
        for column in columns:
            ref = row[f"{column}_ref"]
            if ref is not None:
                try:
                    values[column] = yield from self.get_artifact(ref)
                except (*ARTIFACT_ERRORS, *UNOPENED) as exc:
                    if not listing:
                        raise
                    values[column] = Unfetched(exc)
        return values

    # -- runs ----------------------------------------------------------------------------------

    def run_row(self, run_id: str, query: str = "get_run") -> Plan[Row]:
        rows = yield self.q(query, run_id=run_id)
        if not rows:
            raise RunNotFound(run_id)
        return rows[0]

    def run_record(self, row: Row) -> Plan[RunRecord]:
        return run_record(row, (yield from self.artifact_values(row, "inputs", "result")), self.codec)

    def listed(self, row: Row) -> Plan[RunRecord | UnreadableRun]:
        values = yield from self.artifact_values(row, "inputs", "result", listing=True)
        return listed_run(row, values, self.codec)

    def get_run(self, run_id: str) -> Plan[RunRecord]:
        return (yield from self.run_record((yield from self.run_row(run_id))))

    def find_run(self, run_id: str) -> Plan[RunRecord | UnreadableRun]:
        return (yield from self.listed((yield from self.run_row(run_id))))

    def list_runs(
        self, status: RunStatus | None = None, limit: int = 100
    ) -> Plan[list[RunRecord | UnreadableRun]]:
        runs = []
        rows = yield self.q("list_runs", status=status.value if status else None, limit=limit)
        for row in rows:
            runs.append((yield from self.listed(row)))
        return runs

    def query_runs(self, query: RunQuery) -> Plan[RunPage]:
        """One page of the runs ``query`` asks for, and the counts of the runs it matches: the
        filtering, counting and paging happen in SQL, never over every run."""
        if query.limit < 1:
            raise UsageError(f"a page holds one run or more, not {query.limit}: ask for limit >= 1")
        filters = {
            "workflow": query.workflow,
            "workflow_version": query.workflow_version,
            "search": query.search or None,
            "created_from": query.created_from,
            "created_to": query.created_to,
            "updated_from": query.updated_from,
            "updated_to": query.updated_to,
        }
        after_created, after_run_id = query.after if query.after is not None else (None, None)
        rows = yield self.q(
            "query_runs",
            **filters,
            status=query.status.value if query.status else None,
            after_created=after_created,
            after_run_id=after_run_id,
            limit=query.limit + 1,
        )
        counted = yield self.q("count_runs", **filters)
        counts = dict.fromkeys(RunStatus, 0)
        for row in counted:
            if row["status"] in counts:  # a status this version does not know is not counted
                counts[RunStatus(row["status"])] = int(row["runs"])
        total = counts[query.status] if query.status else sum(int(row["runs"]) for row in counted)
        page = rows[: query.limit]
        runs = []
        for row in page:
            runs.append((yield from self.listed(row)))
        last = page[-1] if page and len(rows) > query.limit else None
        next_after = None if last is None else (int(last["created_at"]), str(last["run_id"]))
        return RunPage(runs, total, counts, next_after)

    def load_ledger(self, run_id: str) -> Plan[Ledger]:
        if self._snapshot is not None:  # one snapshot of the run, its rows and artifacts
            yield Stmt(self._snapshot)
        run_rows = yield self.q("get_run", run_id=run_id)
        step_rows = yield self.q("load_ledger_steps", run_id=run_id)
        op_rows = yield self.q("load_ledger_operations", run_id=run_id)
        attempt_rows = yield self.q("load_ledger_attempts", run_id=run_id)
        if not run_rows:
            raise RunNotFound(run_id)
        run = yield from self.run_record(run_rows[0])
        steps = []
        for row in step_rows:  # most results are inline: no generator step for them
            steps.append(
                (
                    row,
                    NO_VALUES
                    if row["result_ref"] is None
                    else (yield from self.artifact_values(row, "result")),
                )
            )
        return ledger(run, steps, op_rows, attempt_rows, self.codec)

    def events(self, run_id: str) -> Plan[list[EventRecord]]:
        return [event_record(row, self.codec) for row in (yield self.q("events", run_id=run_id))]

    def chain_operation(self, chain_id: str, operation_id: str) -> Plan[OperationRecord | None]:
        rows = yield self.q("chain_operation", chain_id=chain_id, operation_id=operation_id)
        return operation_record(rows[0], self.codec) if rows else None

    def read_identity(self) -> Plan[LedgerIdentity]:
        return identity((yield self.q("ledger_identity")))

    def check_sealing(self, now: int | None = None) -> Plan[None]:
        """On open: a store with a codec marks the ledger as holding sealed values (once, with
        the key it first sealed with); a store without one refuses a ledger so marked
        (``KeyUnavailable``), which it would read envelopes from instead of values."""
        found = yield self.q("sealed_since")
        if self.codec is not None:
            if not found:
                yield self.q("mark_sealed", now=now, detail=dumps({"key_id": self.codec.key_id}))
            return
        if found:
            detail = stored_json(found[0]["detail"], "safepoint_events", "kind=ledger.sealed")
            key_id = detail.get("key_id") if isinstance(detail, dict) else None
            raise KeyUnavailable(str(key_id or "?"), "the ledger")

    def resolved_already(self, run_id: str, resolution: Resolution) -> Plan[bool]:
        """Whether the run's last event is this very resolution (repeating it is a no-op)."""
        last = yield self.q("resolve_last_event", run_id=run_id)
        return (
            bool(last)
            and last[0]["kind"] == "run.resolved"
            and stored_json(
                last[0]["detail"],
                "safepoint_events",
                f"run_id={run_id}",
                None
                if self.codec is None
                else (self.codec, "detail", (run_id, "run.resolved", last[0]["event_id"])),
            )
            == resolution.detail()
        )

    # -- approvals -----------------------------------------------------------------------------

    def approvals(self, run_id: str) -> Plan[list[ApprovalRecord]]:
        return [approval_record(row, self.codec) for row in (yield self.q("approvals", run_id=run_id))]

    def approvals_of(self, run_id: str, operation_id: str) -> Plan[list[ApprovalRecord]]:
        rows = yield self.q("approvals_of_operation", run_id=run_id, operation_id=operation_id)
        return [approval_record(row, self.codec) for row in rows]

    def step_approvals(
        self, run_id: str, step_id: str
    ) -> Plan[tuple[RunRecord, OperationRecord | None, list[ApprovalRecord]]]:
        """The run — its row locked until the transaction ends (``lock_run``), which serialises
        a person's approval with the gate and the dispatch — the operation its step
        ``step_id`` prepared, and that one's approvals."""
        run = yield from self.run_record((yield from self.run_row(run_id, "lock_run")))
        found = yield self.q("operation_of_step", run_id=run_id, step_id=step_id)
        op = operation_record(found[0], self.codec) if found else None
        approvals = (yield from self.approvals_of(run_id, op.operation_id)) if op else []
        return run, op, approvals

    # -- messages (see safepoint._rules.waits) --------------------------------------------------

    def locked_run(self, run_id: str) -> Plan[RunRecord]:
        """The run, its row locked until the transaction ends (``lock_run``): a message sent
        is serialised with the gate of a wait, as an approval is with the dispatch."""
        return (yield from self.run_record((yield from self.run_row(run_id, "lock_run"))))

    def message(self, row: Row) -> Plan[MessageRecord]:
        """A message from its row, its payload read from its artifact when it is large."""
        return message_record(row, (yield from self.artifact_values(row, "payload")), self.codec)

    def messages(self, run_id: str) -> Plan[list[MessageRecord]]:
        found = []
        for row in (yield self.q("messages", run_id=run_id)):
            found.append((yield from self.message(row)))
        return found


class LedgerOperations:
    """The reads every store runs as the plans above, one line each (``operations``)."""

    get_artifact = reading(LedgerReads.get_artifact)
    get_run = reading(LedgerReads.get_run)
    find_run = reading(LedgerReads.find_run)
    list_runs = reading(LedgerReads.list_runs)
    query_runs = reading(LedgerReads.query_runs)
    load_ledger = reading(LedgerReads.load_ledger, atomic=True)
    events = reading(LedgerReads.events)
    approvals = reading(LedgerReads.approvals)
    chain_operation = reading(LedgerReads.chain_operation)
    messages = reading(LedgerReads.messages)
