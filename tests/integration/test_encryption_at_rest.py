"""Encryption at rest, end to end: runs with an effect over real HTTP on a real SQLite file and on
PostgreSQL, whose inputs, step results, payload and receipt hold a marker — then the database's
raw bytes (the SQLite file and its WAL; PostgreSQL's tables dumped with COPY) are searched for
it. A plaintext run leaves it there, column by column, so the search can fail; an encrypted one
does not. Then what must not change with encryption: a resume after a crash replays the
encrypted steps, approvals bind to the plaintext digest; and keys: rotation, a missing or a
wrong key, a value copied to another row."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._rules.canonical import canonical, digest
from safepoint.errors import DecryptionFailed, KeyUnavailable
from safepoint.ops.cli import cli
from safepoint.storage import Encrypted, Keyring, Store, open_store
from safepoint.storage.resealing import reencrypt
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunStatus

MARK = "MARKER-c0ffee-42"
K1 = Keyring({"k1": Keyring.new_key()}, "k1")
charges = owner_effect("charges")
reads: list[str] = []


def look_up(case: str) -> dict[str, Any]:
    reads.append(case)
    return {"case": case, "note": f"{MARK} seen"}


@sp.workflow("sealed-e2e")
def sealed_flow(run: sp.Run, case: str) -> dict[str, Any]:
    seen = run.read("read.case", look_up, case)
    large = run.pure("pure.large", lambda: MARK * 1200)  # past the inline limit (16 KiB): an artifact
    charge = run.effect("effect.charge", charges, payload={"memo": MARK, "amount": 5})
    return {"charge": charge["id"], "note": seen["note"], "large": len(large)}


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger of each kind: an SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    pg_url = request.getfixturevalue("pg_url")
    yield f"{pg_url}?schema=e_{uuid.uuid4().hex[:12]}"


def _schema(url: str) -> tuple[str, str]:
    base, _, query = url.partition("?")
    return base, query.removeprefix("schema=")


def raw_bytes(url: str) -> bytes:
    """Every byte the ledger holds as the database keeps it: the SQLite file and its WAL, or
    every safepoint table of the schema dumped as text by COPY (artifacts' bytes escaped, so
    that text in them stays text)."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    import psycopg
    from psycopg import sql

    base, schema = _schema(url)
    dumped = bytearray()
    with psycopg.connect(base, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            )
        ]
        assert "safepoint_artifacts" in tables
        for table in tables:
            name = sql.Identifier(schema, table)
            query = (
                sql.SQL("COPY (SELECT digest, encode(content, 'escape') FROM {}) TO STDOUT").format(name)
                if table == "safepoint_artifacts"
                else sql.SQL("COPY {} TO STDOUT").format(name)
            )
            with conn.cursor().copy(query) as copy:
                for chunk in copy:
                    dumped += bytes(chunk)
    return bytes(dumped)


def column_text(url: str, query: str) -> str:
    """What one query of the ledger's own tables answers, as text."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return repr(conn.execute(query).fetchall())
    import psycopg

    base, schema = _schema(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        rows = [[bytes(v) if isinstance(v, memoryview) else v for v in row] for row in conn.execute(query)]
        return repr(rows)


def run_it(store: Store, run_id: str) -> dict[str, Any]:
    result = sp.start(store, sealed_flow, f"case {MARK}", run_id=run_id)
    assert isinstance(result, dict)
    return result


def test_a_plaintext_run_leaves_the_marker_in_every_column_it_is_looked_for(
    where: str, owner_env: OwnerService
) -> None:
    store = open_store(where)
    run_it(store, "plain")
    for query in (
        "SELECT inputs FROM safepoint_runs",
        "SELECT result FROM safepoint_steps WHERE step_id = 'read.case'",
        "SELECT receipt FROM safepoint_operations",
        "SELECT content FROM safepoint_artifacts",
    ):
        assert MARK in column_text(where, query), query
    assert MARK.encode() in raw_bytes(where)
    store.close()


def test_an_encrypted_run_leaves_no_plaintext_in_the_database(where: str, owner_env: OwnerService) -> None:
    store = open_store(where, codec=Encrypted(K1))
    result = run_it(store, "sealed")
    assert result["note"] == f"{MARK} seen"  # the run saw its values as they are
    ledger = store.load_ledger("sealed")
    assert ledger.run.inputs == [f"case {MARK}"] or MARK in json.dumps(ledger.run.inputs)
    assert ledger.steps["read.case"].result == {"case": f"case {MARK}", "note": f"{MARK} seen"}
    op = ledger.operations["effect.charge"]
    assert (op.state, op.receipt["memo"]) == (EffectState.ACCEPTED, MARK)
    payload = {"memo": MARK, "amount": 5}
    assert op.payload_ref == digest(canonical(payload))  # the digest of the plaintext
    assert json.loads(store.get_artifact(op.payload_ref)) == payload
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    assert MARK.encode() not in raw_bytes(where)
    assert b'"$sp_enc":1,"kid":"k1"' in raw_bytes(where)
    store.close()
    # every process that opens the ledger opens it with the keyring: without one, it is refused
    with pytest.raises(KeyUnavailable) as missing:
        open_store(where)
    assert missing.value.key_id == "k1"


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
def test_messages_and_errors_are_encrypted_too(where: str, sealed: bool) -> None:
    """A message's payload, and a failure's message in the run's error, its step's error, and
    the run.failed event that repeats it: present in a plaintext ledger, absent when encrypted."""
    store = open_store(where, codec=Encrypted(K1) if sealed else None)

    @sp.workflow("sealed-message")
    def answered(run: sp.Run) -> str:
        return str(run.wait_for("answer")["memo"])

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, answered, run_id="asks")
    sp.send(store, "asks", "answer", {"memo": f"answer {MARK}"})
    assert sp.resume(store, "asks") == f"answer {MARK}"

    def refuse() -> None:
        raise ValueError(f"refused: {MARK}")

    @sp.workflow("sealed-failure")
    def failing(run: sp.Run) -> None:
        run.pure("refuse", refuse)

    with pytest.raises(sp.StepFailed):  # the run fails with it
        sp.start(store, failing, run_id="fails")
    assert store.get_run("fails").status is RunStatus.FAILED
    assert MARK in str(store.get_run("fails").error)  # read back as it was raised
    assert MARK in json.dumps([e.detail for e in store.events("fails")])

    def times_out(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError(f"timed out: {MARK}")

    uncertain = sp.Effect("uncertain", execute=times_out, reconcile=lambda key: sp.Unknown(f"said {MARK}"))

    @sp.workflow("sealed-block")
    def blocks(run: sp.Run) -> Any:
        return run.effect("send", uncertain, payload={"n": 1})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, blocks, run_id="blocks")
    record = store.get_run("blocks").recovery_record or {}
    assert record["phase"] == "reconcile_effect"
    assert MARK in record["reason"]  # a person reads the record as it was written
    assert isinstance(record["state_revision"], int)
    for query in (
        "SELECT payload FROM safepoint_messages",
        "SELECT result FROM safepoint_steps WHERE run_id = 'asks'",
        "SELECT error FROM safepoint_runs WHERE run_id = 'fails'",
        "SELECT error FROM safepoint_steps WHERE run_id = 'fails'",
        "SELECT detail FROM safepoint_events WHERE run_id = 'fails' AND kind = 'run.failed'",
        "SELECT recovery_record FROM safepoint_runs WHERE run_id = 'blocks'",
        "SELECT error FROM safepoint_operations WHERE run_id = 'blocks'",
    ):
        assert (MARK in column_text(where, query)) is not sealed, query
    assert (MARK.encode() in raw_bytes(where)) is not sealed
    store.close()


def test_a_resume_after_a_crash_replays_the_encrypted_steps(
    where: str, owner_env: OwnerService, crash_at: Any
) -> None:
    store = open_store(where, codec=Encrypted(K1))
    reads.clear()
    crash_at("effect.after_receiver_commit:effect.charge")  # the owner committed; the ledger never heard
    with pytest.raises(SimulatedCrash):
        sp.start(store, sealed_flow, f"case {MARK}", run_id="crashed", lease_ms=0)
    crash_at(None)
    other = open_store(where, codec=Encrypted(K1))  # another process, the same keyring
    result = sp.resume(other, "crashed")
    assert result["note"] == f"{MARK} seen"
    assert reads == [f"case {MARK}"]  # the read step was replayed from the ledger, not read again
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)  # reconciled, never sent twice
    assert other.get_run("crashed").status is RunStatus.COMPLETED
    assert MARK.encode() not in raw_bytes(where)
    store.close()
    other.close()


def test_a_process_without_the_key_leaves_the_run_as_it_is(where: str, crash_at: Any) -> None:
    store = open_store(where, codec=Encrypted(K1))

    @sp.workflow("sealed-stops")
    def flow(run: sp.Run) -> str:
        first = run.pure("first", lambda: MARK)
        run.pure("second", lambda: "two")
        return first

    crash_at("step.after_record:first")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="half", lease_ms=0)
    crash_at(None)
    other_key = Keyring({"k1": Keyring.new_key()}, "k1")  # the right id, not the right key
    wrong = open_store(where, codec=Encrypted(other_key))
    with pytest.raises(DecryptionFailed) as failed:
        sp.resume(wrong, "half", lease_ms=0)
    assert failed.value.key_id == "k1"
    assert "safepoint_runs" in failed.value.where or "safepoint_steps" in failed.value.where
    lacking = open_store(where, codec=Encrypted(Keyring({"k9": Keyring.new_key()}, "k9")))
    with pytest.raises(KeyUnavailable) as missing:
        sp.resume(lacking, "half", lease_ms=0)
    assert missing.value.key_id == "k1"
    run = store.get_run("half")
    assert run.status is RunStatus.RUNNING  # not blocked, not failed: resumable as it was
    assert run.recovery_record is None
    assert sp.resume(store, "half") == MARK
    for opened in (store, wrong, lacking):
        opened.close()


def test_approvals_bind_to_the_plaintext_digest(where: str, owner_env: OwnerService) -> None:
    store = open_store(where, codec=Encrypted(K1))
    payload = {"account": "acct-1", "memo": MARK}
    refunds = owner_effect("refunds")

    @sp.workflow("sealed-approval")
    def flow(run: sp.Run) -> str:
        return str(run.effect("refund", refunds, payload=payload, approval=True)["id"])

    with pytest.raises(sp.AwaitingApproval) as waits:
        sp.start(store, flow, run_id="ask")
    expected = digest(canonical(payload))
    assert waits.value.payload_digest == expected
    approval = sp.approve(store, "ask", "refund", by="ana", payload_digest=expected)
    assert approval.payload_digest == expected
    assert sp.resume(store, "ask").startswith("re")
    assert owner_env.client.stats()["applied"] == 1
    assert MARK.encode() not in raw_bytes(where)
    store.close()


def test_a_ciphertext_copied_to_another_row_does_not_decrypt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url, codec=Encrypted(K1))

    @sp.workflow("sealed-copy")
    def flow(run: sp.Run, n: int) -> int:
        return run.pure("value", lambda: n * 10)

    sp.start(store, flow, 1, run_id="one")
    sp.start(store, flow, 2, run_id="two")
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute(
            "UPDATE safepoint_steps SET result ="
            " (SELECT result FROM safepoint_steps WHERE run_id = 'one') WHERE run_id = 'two'"
        )
    with pytest.raises(DecryptionFailed) as moved:
        store.load_ledger("two")
    assert (moved.value.key_id, moved.value.where) == ("k1", "safepoint_steps.result (two, value)")
    assert store.load_ledger("one").steps["value"].result == 10  # the original still opens
    listed = {run.run_id: run for run in store.list_runs()}
    assert not isinstance(listed["two"], sp.types.UnreadableRun)  # its run row is untouched
    store.close()


def test_rotation_reads_old_keys_and_reencrypts_everything_to_the_new_one(
    where: str, owner_env: OwnerService
) -> None:
    plain = open_store(where)
    run_it(plain, "before")  # recorded before the ledger was encrypted
    plain.close()
    first = open_store(where, codec=Encrypted(K1))
    run_it(first, "under-k1")
    first.close()
    rotated = Keyring({"k2": Keyring.new_key(), "k1": K1.key("k1") or b""}, "k2")
    store = open_store(where, codec=Encrypted(rotated))
    run_it(store, "under-k2")
    for run_id in ("before", "under-k1", "under-k2"):  # old values read with old keys (or none)
        assert store.load_ledger(run_id).steps["read.case"].result["note"] == f"{MARK} seen"
    dump = raw_bytes(where)
    assert b'"kid":"k1"' in dump
    assert b'"kid":"k2"' in dump
    assert MARK.encode() in dump
    changed = reencrypt(store, batch=2)  # small pages: many transactions
    assert changed["runs"] == 2
    assert changed["steps"] >= 4
    assert changed["artifacts"] >= 2
    assert reencrypt(store, batch=2) == dict.fromkeys(changed, 0)  # nothing left to do
    store.close()
    dump = raw_bytes(where)
    assert b'"kid":"k1"' not in dump
    assert MARK.encode() not in dump
    only_new = open_store(where, codec=Encrypted(Keyring({"k2": rotated.key("k2") or b""}, "k2")))
    for run_id in ("before", "under-k1", "under-k2"):
        ledger = only_new.load_ledger(run_id)
        assert ledger.steps["read.case"].result["note"] == f"{MARK} seen"
        assert ledger.operations["effect.charge"].receipt["memo"] == MARK
        assert (
            json.loads(only_new.get_artifact(ledger.operations["effect.charge"].payload_ref))["memo"] == MARK
        )
    only_new.close()


def test_the_cli_makes_keys_and_reencrypts_with_the_keyring_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "new", "2026-06"])
    assert made.exit_code == 0, made.output
    entry = made.output.strip()
    assert entry.startswith("2026-06:")
    assert len(Keyring.parse(entry).key("2026-06") or b"") == 32
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    plain = open_store(url)

    @sp.workflow("sealed-cli")
    def flow(run: sp.Run) -> str:
        return run.pure("value", lambda: MARK)

    sp.start(plain, flow, run_id="r")
    plain.close()
    refused = runner.invoke(cli, ["keys", "reencrypt", "--store", url])
    assert refused.exit_code == 1
    assert "no keyring" in refused.output
    keyfile = tmp_path / "keyring"
    keyfile.write_text(f"# the active key first\n{entry}\n")
    monkeypatch.setenv("SAFEPOINT_KEYRING_FILE", str(keyfile))
    done = runner.invoke(cli, ["keys", "reencrypt", "--store", url, "--batch", "1"])
    assert done.exit_code == 0, done.output
    assert "re-encrypted 2 rows (runs 1, steps 1)" in done.output  # the run (inputs, result), its step
    assert MARK.encode() not in raw_bytes(url)
    shown = runner.invoke(cli, ["show", "r", "--store", url])
    assert shown.exit_code == 0
    assert MARK in shown.output
    monkeypatch.delenv("SAFEPOINT_KEYRING_FILE")
    unkeyed = runner.invoke(cli, ["show", "r", "--store", url])
    assert unkeyed.exit_code != 0
    assert "2026-06" in unkeyed.output


@sp.workflow("sealed-queued")
def queued(run: sp.Run, text: str) -> str:
    return run.pure("echo", lambda: text)


def test_a_worker_without_the_key_gives_the_run_back_and_never_blocks_it(tmp_path: Path) -> None:
    import threading

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = open_store(url, codec=Encrypted(K1))
    sp.submit(store, queued, MARK, run_id="queued")
    lacking = open_store(url, codec=Encrypted(Keyring({"k9": Keyring.new_key()}, "k9")))
    worker = sp.Worker(lacking, workflows=["sealed-queued"])
    threading.Timer(1.0, worker.stop).start()
    stats = worker.run(handle_signals=False)
    assert stats.interrupted >= 1  # claimed, found unreadable with this keyring, given back
    assert (stats.blocked, stats.failed, stats.completed) == (0, 0, 0)
    run = store.get_run("queued")
    assert run.status in (RunStatus.PENDING, RunStatus.RUNNING)  # claimable: released, not blocked
    assert (run.owner, run.recovery_record) == (None, None)
    done = sp.Worker(store, workflows=["sealed-queued"]).run(until_idle=True, handle_signals=False)
    assert done.completed == 1
    assert store.get_run("queued").result == MARK
    lacking.close()
    store.close()


def test_a_rotation_reseals_events_and_recovery_records_so_the_old_key_can_go(where: str) -> None:
    """Every state a ledger holds — a failed run's events, a blocked run's recovery record (its
    reason and evidence sealed inside it), a stopped run's — reads with the new key alone once
    ``reencrypt`` has run: nothing is left under the old key."""
    from console_states import build_states

    store = open_store(where, codec=Encrypted(K1))
    ids = build_states(store)
    store.close()
    rotated = Keyring({"k2": Keyring.new_key(), "k1": K1.key("k1") or b""}, "k2")
    store = open_store(where, codec=Encrypted(rotated))
    reencrypt(store, batch=3)
    store.close()
    assert b'"kid":"k1"' not in raw_bytes(where)
    with pytest.raises(KeyUnavailable) as unkeyed:  # refused, naming the key it needs now
        open_store(where)
    assert unkeyed.value.key_id == "k2"
    only_new = open_store(where, codec=Encrypted(Keyring({"k2": rotated.key("k2") or b""}, "k2")))
    unreadable = [run.run_id for run in only_new.list_runs() if isinstance(run, sp.types.UnreadableRun)]
    assert unreadable == []
    for state in ("failed", "blocked", "stopped", "fork"):
        ledger = only_new.load_ledger(ids[state])
        assert only_new.events(ids[state])
        if state in ("blocked", "stopped"):
            assert ledger.run.recovery_record is not None
            assert isinstance(ledger.run.recovery_record["reason"], str)
    only_new.close()


def test_a_rotation_reseals_what_a_replan_moved_into_the_history(where: str, crash_at: Any) -> None:
    """A re-plan moves the stale steps into ``step.abandoned`` events, their results as the
    steps' rows stored them (sealed for the step): a rotation seals those again too."""
    from safepoint.testing import forget_workflows

    store = open_store(where, codec=Encrypted(K1))

    @sp.workflow("sealed-replan", version="1")
    def v1(run: sp.Run) -> str:
        return str(run.read("case", lambda: MARK))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, v1, run_id="r", lease_ms=0)
    crash_at(None)
    forget_workflows("sealed-replan")

    @sp.workflow("sealed-replan", version="2", compatibility="replan")
    def v2(run: sp.Run) -> str:
        return str(run.read("case", lambda: "again"))

    assert sp.resume(store, "r") == "again"
    store.close()
    rotated = Keyring({"k2": Keyring.new_key(), "k1": K1.key("k1") or b""}, "k2")
    store = open_store(where, codec=Encrypted(rotated))
    reencrypt(store)
    store.close()
    assert b'"kid":"k1"' not in raw_bytes(where)
    only_new = open_store(where, codec=Encrypted(Keyring({"k2": rotated.key("k2") or b""}, "k2")))
    abandoned = [event for event in only_new.events("r") if event.kind == "step.abandoned"]
    assert [event.detail["result"] for event in abandoned] == [MARK]
    only_new.close()


def test_a_rotation_on_postgres_never_writes_back_a_value_older_than_a_concurrent_write(
    pg_url: str,
) -> None:
    """A rotation reads a page of rows and writes them back sealed with the new key. A worker
    that writes one of those rows in between (a run completing: its result) must not have its
    write undone: the page is read under the rows' locks, so it waits for the worker's commit
    and seals what the worker wrote."""
    import threading

    import psycopg
    from psycopg import sql

    schema = f"e_{uuid.uuid4().hex[:12]}"
    url = f"{pg_url}?schema={schema}"
    store = open_store(url, codec=Encrypted(K1))

    @sp.workflow("sealed-race")
    def flow(run: sp.Run) -> str:
        return str(run.pure("value", lambda: "before"))

    sp.start(store, flow, run_id="r")
    store.close()
    rotated = open_store(
        url, codec=Encrypted(Keyring({"k2": Keyring.new_key(), "k1": K1.key("k1") or b""}, "k2"))
    )
    with psycopg.connect(pg_url) as worker:  # a transaction, not autocommit: it holds the row
        worker.execute(
            sql.SQL("UPDATE {} SET result = %s WHERE run_id = 'r'").format(
                sql.Identifier(schema, "safepoint_runs")
            ),
            ('"after"',),  # stored before the rotation seals it: plain JSON, read as it is
        )
        rotation = threading.Thread(target=lambda: rotated.reseal_page("runs", None, 10))  # type: ignore[attr-defined]
        rotation.start()
        rotation.join(timeout=0.5)  # the rotation reads (and waits, once fixed) meanwhile
        worker.commit()
    rotation.join(timeout=10)
    assert not rotation.is_alive()
    assert rotated.get_run("r").result == "after"  # the worker's write stands
    rotated.close()
