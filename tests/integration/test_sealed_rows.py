"""A sealed ledger seals every value that can carry the caller's data, each bound to its row.

The walk: one ledger goes through every step kind, a ``NotSent``, a rejection, a message, an
approval given, revoked and given again, a block left blocked, one resolved applied and one
abandoned, a cancel, a retry, a fork, a raised limit, a continue-as-new and a re-plan — each
with a marker in what the caller or a person gave — and then every column of every table of the
database is searched for the marker. A plaintext ledger holds it in each column that carries
such data (so the search can fail); a sealed one holds it nowhere but in the table the
transaction step wrote to, which is the caller's own.

The binding: two messages of one name, or two events of one kind, swapped between their rows
do not open (``DecryptionFailed``, naming the row), on SQLite and PostgreSQL, sync and async;
values sealed before rows were bound still open, and a rotation binds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import ApprovalInvalid, DecryptionFailed, EffectRejected
from safepoint.storage import Encrypted, Keyring, open_store
from safepoint.storage.codec import seal_text
from safepoint.storage.resealing import reencrypt
from safepoint.testing import SimulatedCrash, crash_at, forget_workflows

MARK = "MARKER-sealed-7e11"
KEYRING = Keyring({"k1": Keyring.new_key()}, "k1")
ATTEMPTS: dict[str, int] = {}


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger of each kind: an SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    yield f"{request.getfixturevalue('pg_url')}?schema=s_{uuid.uuid4().hex[:12]}"


# -- the database, as it is stored ---------------------------------------------------------------


def _pg(url: str) -> tuple[str, str]:
    base, _, schema = url.partition("?schema=")
    return base, schema


def marked_columns(url: str) -> set[tuple[str, str]]:
    """(table, column) of every column, of every table the ledger's database (or schema)
    holds, whose stored text contains the marker anywhere in it."""
    found: set[tuple[str, str]] = set()
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                for column in [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]:
                    query = f'SELECT count(*) FROM "{table}" WHERE instr(CAST("{column}" AS TEXT), ?) > 0'
                    if conn.execute(query, (MARK,)).fetchone()[0]:
                        found.add((table, column))
        return found
    import psycopg

    base, schema = _pg(url)
    with psycopg.connect(base, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        assert ("safepoint_events", "detail", "text") in columns
        for table, column, data_type in columns:
            text = f"encode(\"{column}\", 'escape')" if data_type == "bytea" else f'"{column}"::text'
            query = f'SELECT count(*) FROM "{schema}"."{table}" WHERE strpos({text}, %s) > 0'
            if conn.execute(query, (MARK,)).fetchone()[0]:  # type: ignore[index]
                found.add((table, column))
    return found


def execute(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """One statement on the ledger's own tables (``?`` placeholders), committed."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
            return list(conn.execute(query, params).fetchall())
    import psycopg

    base, schema = _pg(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cursor = conn.execute(query.replace("?", "%s"), params)
        return list(cursor.fetchall()) if cursor.description else []


def swap(url: str, table: str, column: str, key: str, first: Any, second: Any) -> None:
    """Swap ``column`` between the rows of ``table`` whose ``key`` is ``first`` and ``second``."""
    (a,), (b,) = (
        execute(url, f"SELECT {column} FROM {table} WHERE {key} = ?", k)[0] for k in (first, second)
    )
    assert a != b
    execute(url, f"UPDATE {table} SET {column} = ? WHERE {key} = ?", b, first)
    execute(url, f"UPDATE {table} SET {column} = ? WHERE {key} = ?", a, second)


# -- the walk ------------------------------------------------------------------------------------


def _read_once(case: str) -> dict[str, Any]:
    ATTEMPTS["read"] = ATTEMPTS.get("read", 0) + 1
    if ATTEMPTS["read"] == 1:
        raise ValueError(f"{MARK}: the case service failed")  # a failed attempt's error
    return {"case": case}


def _draft(**params: Any) -> dict[str, Any]:
    return {"text": f"{MARK} drafted", "usage": {"input_tokens": 3, "output_tokens": 2}}


def _insert(tx: Any, note: str) -> dict[str, Any]:
    mark = "?" if tx.dialect == "sqlite" else "%s"
    tx.execute("CREATE TABLE IF NOT EXISTS orders (note TEXT)")
    tx.execute(f"INSERT INTO orders (note) VALUES ({mark})", (note,))  # the caller's own table
    return {"stored": note}


def _send_once(payload: Any, key: sp.EffectKey) -> Any:
    ATTEMPTS["send"] = ATTEMPTS.get("send", 0) + 1
    if ATTEMPTS["send"] == 1:
        raise sp.NotSent(f"{MARK}: the mail server refused the connection")
    return {"id": "mail-1", "to": payload["to"]}


def _rejected(payload: Any, key: sp.EffectKey) -> Any:
    raise sp.Rejected({"why": f"{MARK} is over the card's limit"})


def _unsure(payload: Any, key: sp.EffectKey) -> Any:
    raise TimeoutError(f"{MARK}: the carrier timed out")


def _cannot_tell(key: sp.EffectKey) -> sp.Unknown:
    return sp.Unknown(f"{MARK}: the carrier cannot say")


_mails = sp.Effect("mail", execute=_send_once)
_cards = sp.Effect("card", execute=_rejected)
_refunds = sp.Effect("refund", execute=lambda payload, key: {"refunded": payload["memo"]})
_shipments = sp.Effect("shipment", execute=_unsure, reconcile=_cannot_tell)


@sp.workflow("sealed-walk")
def _walk(run: sp.Run, case: str) -> Any:
    run.pure("pure", lambda: f"{MARK} pure")
    run.pure("large", lambda: MARK * 1200)  # past the inline limit: an artifact
    run.read("read", _read_once, case, retry=sp.Retry(attempts=2, backoff=0))
    run.model("model", _draft, model="m-1", messages=[{"role": "user", "content": case}])
    run.decide("decide", lambda: {"next_step_id": "route.refund", "why": f"{MARK} asked for it"})
    run.transaction("transaction", _insert, case)
    run.now()
    run.random()
    run.uuid()
    run.effect("mail", _mails, payload={"to": f"{MARK}@example.com"})
    with contextlib.suppress(EffectRejected):
        run.effect("card", _cards, payload={"memo": case})
    answer = run.wait_for("answer")
    run.effect("refund", _refunds, payload={"memo": case}, approval=True)
    shipped = run.effect("ship", _shipments, payload={"memo": case})
    return {"case": case, "answer": answer, "shipped": shipped}


@sp.workflow("sealed-gated")
def _gated(run: sp.Run, case: str) -> Any:
    return run.effect("refund", _refunds, payload={"memo": case}, approval=True)


@sp.workflow("sealed-blocks")
def _blocks(run: sp.Run, case: str) -> Any:
    return run.effect("ship", _shipments, payload={"memo": case})


def _fails_always(case: str) -> Any:
    raise ValueError(f"{MARK}: no invoice for {case}")


@sp.workflow("sealed-fails")
def _fails(run: sp.Run, case: str) -> Any:
    return run.pure("invoice", _fails_always, case)


@sp.workflow("sealed-limited", budget=sp.Budget(tokens=1))
def _limited(run: sp.Run) -> Any:
    return [run.model(f"turn.{n}", _draft, model="m-1", messages=[]) for n in range(3)]


@sp.workflow("sealed-chain")
def _chain(run: sp.Run, index: int, note: str) -> Any:
    if index == 0:
        run.continue_as_new(1, f"{note} carried")
    return note


def _replan(store: sp.Store) -> None:
    """A run whose read a later version re-plans: the step moves into a ``step.abandoned``."""

    @sp.workflow("sealed-replan", version="1")
    def v1(run: sp.Run) -> str:
        return str(run.read("case", lambda: f"{MARK} first answer"))

    with crash_at("run.before_complete"), pytest.raises(SimulatedCrash):
        sp.start(store, v1, run_id="replan", lease_ms=0)
    forget_workflows("sealed-replan")

    @sp.workflow("sealed-replan", version="2", compatibility="replan")
    def v2(run: sp.Run) -> str:
        return str(run.read("case", lambda: "second answer"))

    assert sp.resume(store, "replan") == "second answer"
    forget_workflows("sealed-replan")


def walk(store: sp.Store) -> None:
    """Every kind of write a ledger takes, each with the marker in what it was given."""
    ATTEMPTS.clear()
    case = f"case of {MARK}"
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, _walk, case, run_id="walk")
    sp.send(store, "walk", "answer", {"said": f"{MARK} yes"}, by="ana")
    with pytest.raises(sp.AwaitingApproval):
        sp.resume(store, "walk")
    sp.approve(store, "walk", "refund", by="ana", evidence=f"{MARK}: the customer called")
    sp.revoke_approval(store, "walk", "refund", by="ana", reason=f"{MARK}: wrong customer")
    with pytest.raises(ApprovalInvalid):  # it waits again, saying why: the revocation's reason
        sp.resume(store, "walk")
    sp.approve(store, "walk", "refund", by="bo", evidence=f"{MARK}: the right customer now")
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(store, "walk")
    revision = store.get_run("walk").state_revision
    receipt = {"tracking": f"{MARK}-track"}
    sp.resolve(
        store, "walk", "applied", revision=revision, by="ana", receipt=receipt, evidence=f"{MARK} seen"
    )
    assert sp.resume(store, "walk")["shipped"] == receipt
    for run_id in ("blocked", "abandoned"):
        with pytest.raises(sp.NeedsReconciliation):
            sp.start(store, _blocks, case, run_id=run_id)
    revision = store.get_run("abandoned").state_revision
    sp.resolve(store, "abandoned", "abandon", revision=revision, by="ana", evidence=f"{MARK}: gave up")
    with pytest.raises(sp.AwaitingApproval):  # left waiting at a gate whose approval was revoked
        sp.start(store, _gated, case, run_id="gated")
    sp.approve(store, "gated", "refund", by="ana")
    sp.revoke_approval(store, "gated", "refund", by="ana", reason=f"{MARK}: not this one")
    with pytest.raises(ApprovalInvalid):
        sp.resume(store, "gated")
    sp.submit(store, _blocks, case, run_id="cancelled")
    sp.cancel(store, "cancelled", by="ana", reason=f"{MARK}: the customer withdrew")
    with pytest.raises(sp.StepFailed):
        sp.start(store, _fails, case, run_id="fails")
    sp.retry(store, "fails", by="ana", reason=f"{MARK}: the invoice is there now")
    with pytest.raises(sp.StepFailed):
        sp.resume(store, "fails")
    sp.fork(store, "walk", from_step="decide", new_run_id="fork", by="ana", reason=f"{MARK}: again")
    with pytest.raises(sp.LimitReached):
        sp.start(store, _limited, run_id="limited")
    sp.extend_limits(store, "limited", tokens=1000, by="ana", reason=f"{MARK}: a long case")
    assert sp.start(store, _chain, 0, case, run_id="chain") == f"{case} carried"
    _replan(store)


# Where a plaintext ledger keeps what the walk gave it: payloads, results, evidence, reasons,
# messages, details, recovery records and errors (and the caller's own table).
CARRIERS = {
    ("safepoint_runs", "inputs"),
    ("safepoint_runs", "result"),
    ("safepoint_runs", "error"),
    ("safepoint_runs", "recovery_record"),
    ("safepoint_runs", "waiting_for"),
    ("safepoint_steps", "result"),
    ("safepoint_steps", "error"),
    ("safepoint_attempts", "error"),
    ("safepoint_operations", "receipt"),
    ("safepoint_operations", "error"),
    ("safepoint_messages", "payload"),
    ("safepoint_artifacts", "content"),
    ("safepoint_events", "detail"),
    ("safepoint_approvals", "evidence"),
    ("safepoint_approvals", "revoke_reason"),
    ("orders", "note"),
}


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_no_column_of_a_sealed_ledger_holds_the_callers_data_in_clear(where: str, sealed: bool) -> None:
    store = open_store(where, codec=Encrypted(KEYRING) if sealed else None)
    try:
        walk(store)
        found = marked_columns(where)
        if not sealed:
            assert found == CARRIERS  # the walk reaches every column that carries such data
            return
        assert found == {("orders", "note")}  # the caller's own table, which it wrote itself
        # and it is all there, opened: the events that quote it, the approvals, the messages
        shown = repr(
            [
                (store.events(run_id), store.approvals(run_id), store.messages(run_id))
                for run_id in (
                    "walk",
                    "gated",
                    "abandoned",
                    "cancelled",
                    "fails",
                    "fork",
                    "limited",
                    "replan",
                )
            ]
        )
        for said in ("refused the connection", "over the card's limit", "the customer called"):
            assert f"{MARK}: the mail server {said}" in shown or said in shown, said
        assert f"{MARK}: wrong customer" in shown
        assert f"{MARK}: not this one" in str(store.get_run("gated").waiting_for)
    finally:
        store.close()


# -- each value bound to its row -----------------------------------------------------------------


@sp.workflow("sealed-asks")
def _asks(run: sp.Run) -> Any:
    return [run.wait_for("answer"), run.wait_for("answer")]


@sp.workflow("sealed-asks-async")
async def _asks_async(run: sp.AsyncRun) -> Any:
    return [await run.wait_for("answer"), await run.wait_for("answer")]


def _card(payload: Any, key: sp.EffectKey) -> Any:
    raise sp.Rejected({"why": f"card {payload['n']} is over its limit"})


_two_cards = sp.Effect("card", execute=_card)


@sp.workflow("sealed-two-rejections")
def _two_rejections(run: sp.Run) -> Any:
    for n in (1, 2):
        with contextlib.suppress(EffectRejected):
            run.effect(f"card.{n}", _two_cards, payload={"n": n})
    return "both refused"


@sp.workflow("sealed-two-rejections-async")
async def _two_rejections_async(run: sp.AsyncRun) -> Any:
    for n in (1, 2):
        with contextlib.suppress(EffectRejected):
            await run.effect(f"card.{n}", _two_cards, payload={"n": n})
    return "both refused"


def _carried(where: str, mode: str, verb: str, workflow: Any, run_id: str, *after: Any) -> Any:
    """``verb`` ("start" or "resume") of ``run_id`` on a sealed store at ``where``, sync or
    async (on PostgreSQL, the async store); ``after(store)`` is called in the same process, with
    the same kind of store, and its answer returned (awaited when async)."""
    codec = Encrypted(KEYRING)
    if mode == "sync":
        store = open_store(where, codec=codec)
        try:
            if verb == "start":
                sp.start(store, workflow, run_id=run_id)
            else:
                sp.resume(store, run_id, lease_ms=0)  # a run left held by a resume that failed
            return [call(store) for call in after]
        finally:
            store.close()

    async def main() -> Any:
        on_pg = where.startswith("postgresql")
        store: Any = (
            await sp.open_async_store(where, codec=codec) if on_pg else open_store(where, codec=codec)
        )
        try:
            if verb == "start":
                await sp.start_async(store, workflow, run_id=run_id)
            else:
                await sp.resume_async(store, run_id, lease_ms=0)
            found = [call(store) for call in after]
            return [await got if asyncio.iscoroutine(got) else got for got in found]
        finally:
            closed = store.close()
            if asyncio.iscoroutine(closed):
                await closed

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_messages_of_one_name_swapped_between_their_rows_do_not_open(where: str, mode: str) -> None:
    workflow = _asks if mode == "sync" else _asks_async
    with pytest.raises(sp.AwaitingMessage):
        _carried(where, mode, "start", workflow, "asks")
    store = open_store(where, codec=Encrypted(KEYRING))
    first = sp.send(store, "asks", "answer", {"n": 1})
    second = sp.send(store, "asks", "answer", {"n": 2})
    swap(where, "safepoint_messages", "payload", "seq", first.seq, second.seq)
    with pytest.raises(DecryptionFailed) as failed:  # the wait takes the first: it does not open
        _carried(where, mode, "resume", workflow, "asks")
    assert (failed.value.key_id, failed.value.where) == (
        "k1",
        f"safepoint_messages.payload (asks, answer, {first.seq})",
    )
    with pytest.raises(DecryptionFailed):
        store.messages("asks")
    swap(where, "safepoint_messages", "payload", "seq", first.seq, second.seq)  # put back: it opens
    assert [m.payload for m in store.messages("asks")] == [{"n": 1}, {"n": 2}]
    left = store.get_run("asks")  # not blocked, not failed: carried on by a process that reads it
    assert (left.status, left.recovery_record) == (sp.types.RunStatus.RUNNING, None)
    store.close()
    assert _carried(where, mode, "resume", workflow, "asks", lambda s: s.get_run("asks")) != []
    store = open_store(where, codec=Encrypted(KEYRING))
    assert store.get_run("asks").result == [{"n": 1}, {"n": 2}]
    store.close()


def _rejection_events(store: sp.Store, run_id: str) -> list[int]:
    return [e.event_id for e in store.events(run_id) if e.kind == "effect.rejected"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_events_of_one_kind_swapped_between_their_rows_do_not_open(where: str, mode: str) -> None:
    workflow = _two_rejections if mode == "sync" else _two_rejections_async
    (events,) = _carried(where, mode, "start", workflow, "cards", lambda s: s.events("cards"))
    first, second = (e for e in events if e.kind == "effect.rejected")
    assert [first.detail["error"]["why"], second.detail["error"]["why"]] == [
        "card 1 is over its limit",
        "card 2 is over its limit",
    ]
    swap(where, "safepoint_events", "detail", "event_id", first.event_id, second.event_id)
    with pytest.raises(DecryptionFailed) as failed:
        _carried(where, mode, "resume", workflow, "cards", lambda s: s.events("cards"))
    assert (failed.value.key_id, failed.value.where) == (
        "k1",
        f"safepoint_events.detail (cards, effect.rejected, {first.event_id})",
    )
    swap(where, "safepoint_events", "detail", "event_id", first.event_id, second.event_id)  # put back
    store = open_store(where, codec=Encrypted(KEYRING))
    assert len(_rejection_events(store, "cards")) == 2  # both open again
    execute(  # nor does one copied over another row of its kind
        where,
        "UPDATE safepoint_events SET detail = (SELECT detail FROM safepoint_events WHERE event_id = ?)"
        " WHERE event_id = ?",
        first.event_id,
        second.event_id,
    )
    with pytest.raises(DecryptionFailed) as copied:
        store.events("cards")
    assert copied.value.where == f"safepoint_events.detail (cards, effect.rejected, {second.event_id})"
    store.close()


def _old_binding(where: str, table: str, column: str, key: str, row: Any, value: Any, *place: Any) -> None:
    """Store ``value`` in ``column`` of the row as a safepoint that bound it to ``place`` only
    (before values were bound to their rows) sealed it."""
    text = seal_text(Encrypted(KEYRING), sp.storage.codec.json.dumps(value), table, column, *place)
    execute(where, f"UPDATE {table} SET {column} = ? WHERE {key} = ?", text, row)


def test_values_sealed_before_rows_were_bound_still_open_and_a_rotation_binds_them(where: str) -> None:
    store = open_store(where, codec=Encrypted(KEYRING))
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, _asks, run_id="asks")
    messages = [sp.send(store, "asks", "answer", {"n": n}).seq for n in (1, 2)]
    sp.start(store, _two_rejections, run_id="cards")
    events = _rejection_events(store, "cards")
    for n, seq in enumerate(messages, 1):
        _old_binding(where, "safepoint_messages", "payload", "seq", seq, {"n": n}, "asks", "answer")
    for n, event_id in enumerate(events, 1):
        detail = {"error": {"why": f"card {n} is over its limit"}}
        _old_binding(
            where, "safepoint_events", "detail", "event_id", event_id, detail, "cards", "effect.rejected"
        )
    # they open, as they were sealed
    assert [m.payload for m in store.messages("asks")] == [{"n": 1}, {"n": 2}]
    details = [e.detail for e in store.events("cards") if e.kind == "effect.rejected"]
    assert [d["error"]["why"] for d in details] == ["card 1 is over its limit", "card 2 is over its limit"]
    changed = reencrypt(store, batch=1)  # the same key: what is not bound to its row yet is
    assert changed["messages"] == 2
    assert changed["events"] >= 2  # and the effect.prepared details written in clear
    assert reencrypt(store) == dict.fromkeys(changed, 0)  # and nothing twice
    assert [m.payload for m in store.messages("asks")] == [{"n": 1}, {"n": 2}]
    swap(where, "safepoint_messages", "payload", "seq", *messages)
    swap(where, "safepoint_events", "detail", "event_id", *events)
    with pytest.raises(DecryptionFailed):
        store.messages("asks")
    with pytest.raises(DecryptionFailed):
        store.events("cards")
    store.close()


def test_the_sequences_sealed_rows_take_their_ids_from_are_the_tables_own(pg_url: str) -> None:
    """On PostgreSQL a sealed event or message takes its id from the sequence the queries
    name (``next_event_id``, ``next_message_seq``) — the one the table's identity uses, so that
    the ids a statement takes itself and those taken first never meet."""
    url = f"{pg_url}?schema=s_{uuid.uuid4().hex[:12]}"
    open_store(url, codec=Encrypted(KEYRING)).close()
    found = execute(
        url,
        "SELECT pg_get_serial_sequence('safepoint_events', 'event_id'),"
        " pg_get_serial_sequence('safepoint_messages', 'seq')",
    )
    schema = _pg(url)[1]
    assert found == [(f"{schema}.safepoint_events_event_id_seq", f"{schema}.safepoint_messages_seq_seq")]
