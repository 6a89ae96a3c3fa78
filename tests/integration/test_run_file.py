"""A run read out of a real store as its run file (``safepoint.export_run``) and read back
(``recorded_run``): the same records, on SQLite and PostgreSQL, sync and async; the same
document from either store for the same run, but for what a store mints or clocks itself; and a
sealed ledger's values exported plain with its keyring, refused without it."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from run_file_flows import record_every_part
from safepoint._engine.exported import export_flow
from safepoint._engine.flow import drive
from safepoint._rules.canonical import canonical, digest
from safepoint._rules.run_file import recorded_run, run_document
from safepoint.errors import KeyUnavailable
from safepoint.storage import Encrypted, Keyring, open_store
from safepoint.types import StepKind


def test_a_run_file_reads_back_as_the_records_it_was_made_of(store: sp.Store) -> None:
    record_every_part(store, "r")
    recorded = drive(store, export_flow("r"))
    document = run_document(recorded)
    assert {step["kind"] for step in document["steps"]} == set(StepKind)  # every kind, so every
    assert list(document["attempts"]) == ["read.quote"]  # part of the file, is read back here
    assert [a["approved_by"] for a in document["approvals"]] == ["ana"]
    assert [(m["name"], m["taken_by"]) for m in document["messages"]] == [("go", "go"), ("later", None)]
    assert document["run"]["step_attempts"] == sp.Retry(attempts=2, backoff=0.0).as_json()
    assert document["operations"][0]["payload"] == {"case": "c-1", "amount": 12.5}
    text = json.dumps(document)
    assert recorded_run(json.loads(text)) == recorded  # through JSON text, as a file is read
    assert recorded_run(document) == recorded
    assert json.dumps(document) == text  # reading it changed nothing
    for op in recorded.operations.values():
        assert recorded.payloads[op.payload_ref] == store.get_artifact(op.payload_ref)
    assert sp.export_run(store, "r") == document


def test_export_run_async_exports_the_same_document(store_url: str) -> None:
    """On an async store (PostgreSQL's), and on a sync one from async code (SQLite's, which
    ``open_async_store`` leaves to ``open_store``)."""
    store = sp.open_store(store_url)
    record_every_part(store, "r")
    expected = sp.export_run(store, "r")

    async def export() -> dict[str, Any]:
        if store_url.startswith("sqlite"):
            return await sp.export_run_async(store, "r")
        async_store = await sp.open_async_store(store_url)
        try:
            return await sp.export_run_async(async_store, "r")
        finally:
            await async_store.close()

    assert asyncio.run(export()) == expected
    store.close()


# What legitimately differs between two stores that recorded the same run from the same inputs:
# the moments, each on its own store's clock; the ids a store mints at random (an approval's id;
# an effect key, which names its ledger); what the value steps recorded (now(), uuid()). A field
# named here is compared by whether it holds a value, and its type: anything else that differs
# fails.
MOMENTS = {
    "run": {"created_at", "updated_at"},
    "steps": {"recorded_at", "observed_at"},
    "operations": {"prepared_at", "updated_at", "first_dispatched_at"},
    "attempts": {"recorded_at", "retry_at"},
    "approvals": {"approved_at"},
    "messages": {"sent_at", "taken_at"},
    "events": {"at"},
}
MINTED = {"operations": {"approval_id", "effect_key"}, "approvals": {"approval_id"}}
EVENT_DETAIL = {"since", "approval_id"}  # run.waiting: since when; run.approved: which approval
VALUE_STEPS = {"value.now", "value.uuid"}


def _mark(value: Any) -> Any:
    return None if value is None else f"<{type(value).__name__}>"


def _marked(entry: dict[str, Any], names: set[str]) -> dict[str, Any]:
    return {name: _mark(value) if name in names else value for name, value in entry.items()}


def normalised(document: dict[str, Any]) -> dict[str, Any]:
    fields = {part: MOMENTS.get(part, set()) | MINTED.get(part, set()) for part in MOMENTS}
    out = dict(document)
    out["run"] = _marked(document["run"], fields["run"])
    for part in ("steps", "operations", "approvals", "messages", "events"):
        out[part] = [_marked(entry, fields[part]) for entry in document[part]]
    out["attempts"] = {
        step_id: [_marked(a, fields["attempts"]) for a in tried]
        for step_id, tried in document["attempts"].items()
    }
    for event in out["events"]:
        if isinstance(event["detail"], dict):
            event["detail"] = _marked(event["detail"], EVENT_DETAIL)
    for step in out["steps"]:
        if step["step_id"] in VALUE_STEPS:
            step["result"] = _mark(step["result"])
    return out


def test_sqlite_and_postgresql_write_the_same_run_file_for_the_same_run(tmp_path: Path, pg_url: str) -> None:
    documents = []
    for url in (f"sqlite:///{tmp_path / 'ledger.db'}", f"{pg_url}?schema=rf_{uuid.uuid4().hex[:12]}"):
        with closing(sp.open_store(url)) as store:
            record_every_part(store, "r")
            documents.append(sp.export_run(store, "r"))
    on_sqlite, on_postgres = documents
    assert on_sqlite != on_postgres  # they do differ, in what is normalised below
    assert normalised(on_sqlite) == normalised(on_postgres)


KEYRING = Keyring({"k1": Keyring.new_key()}, "k1")
MARK = "MARKER-run-file-5e41ed"


@sp.workflow("run-file-sealed")
def sealed(run: sp.Run, case: str) -> str:
    seen = run.read("read.case", lambda: {"case": case, "note": MARK})
    run.effect("effect.send", sp.Effect("run-file.sealed", execute=lambda p, k: {"id": 1}), payload=seen)
    return str(seen["note"])


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return f"{request.getfixturevalue('pg_url')}?schema=rfs_{uuid.uuid4().hex[:12]}"


def test_a_sealed_ledger_exports_plain_values_with_its_keyring_and_nothing_without(where: str) -> None:
    with closing(open_store(where, codec=Encrypted(KEYRING))) as store:
        sp.start(store, sealed, MARK, run_id="r")
        document = sp.export_run(store, "r")
    assert document["run"]["inputs"] == {"args": [MARK], "kwargs": {}}
    assert document["steps"][0]["result"] == {"case": MARK, "note": MARK}
    [op] = document["operations"]
    assert op["payload"] == {"case": MARK, "note": MARK}
    assert op["payload_ref"] == digest(canonical(op["payload"]))  # the plain payload's digest
    assert recorded_run(document).payloads[op["payload_ref"]] == canonical(op["payload"])
    with pytest.raises(KeyUnavailable) as unkeyed:
        open_store(where)
    assert unkeyed.value.key_id == "k1"
    other = Keyring({"k9": Keyring.new_key()}, "k9")
    with (
        closing(open_store(where, codec=Encrypted(other))) as lacking,
        pytest.raises(KeyUnavailable) as refused,
    ):
        sp.export_run(lacking, "r")
    assert refused.value.key_id == "k1"


def test_a_sealed_ledgers_run_replays_with_its_keyring_and_is_refused_without(where: str) -> None:
    """Replay reads a sealed run as a resume does: with the key, it replays to its end; without
    it, the store's ``KeyUnavailable`` says which key is missing, and nothing is replayed."""
    from safepoint.testing import replay

    with closing(open_store(where, codec=Encrypted(KEYRING))) as store:
        sp.start(store, sealed, MARK, run_id="r")
        report = replay(store, "r")
    assert report.ok, report
    assert report.reached.value == "end"
    assert report.result == MARK
    other = Keyring({"k9": Keyring.new_key()}, "k9")
    with closing(open_store(where, codec=Encrypted(other))) as lacking, pytest.raises(KeyUnavailable):
        replay(lacking, "r")
