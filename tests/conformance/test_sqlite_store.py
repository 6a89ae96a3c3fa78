"""The SQLite store on real files: migrations, durability, bad data, several processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import (
    ArtifactCorrupt,
    CorruptRecord,
    IncompatibleWorkflow,
    InvalidStoreURL,
    MigrationMismatch,
    SchemaTooNew,
    WorkflowNotFound,
)
from safepoint.storage.migrations import load_migrations
from safepoint.testing import SimulatedCrash
from safepoint.types import RunStatus


def test_migrations_are_recorded_with_checksums(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = sp.open_store(str(path))
    rows = (
        sqlite3.connect(path)
        .execute("SELECT version, name, checksum FROM safepoint_schema_version")
        .fetchall()
    )
    shipped = load_migrations("sqlite")
    assert [(v, n) for v, n, _ in rows] == [(v, n) for v, n, _ in shipped]
    assert all(len(checksum) == 64 for _, _, checksum in rows)
    assert store.schema_version() == len(shipped)
    tables = {
        r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert all(t.startswith(("safepoint_", "sqlite_")) for t in tables)
    sp.open_store(str(path))  # opening again applies nothing and raises nothing


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    sp.open_store(str(path))
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO safepoint_schema_version VALUES (99, '0099_x.sql', 'c', 0)")
    with pytest.raises(SchemaTooNew) as error:
        sp.open_store(str(path))
    assert (error.value.found, error.value.known) == (99, len(load_migrations("sqlite")))
    assert "upgrade safepoint" in str(error.value)


def test_an_edited_migration_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    sp.open_store(str(path))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE safepoint_schema_version SET checksum = 'x' WHERE version = 1")
    with pytest.raises(MigrationMismatch):
        sp.open_store(str(path))


def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(sp.StoreError):
        sp.open_store(str(path))


@pytest.mark.parametrize(
    ("url", "durability"),
    [
        ("sqlite:///{dir}/a.db", "process_crash"),
        ("sqlite:///{dir}/a.db?durability=power_loss", "power_loss"),
        ("{dir}/b.db", "process_crash"),
    ],
)
def test_store_urls_and_durability(tmp_path: Path, url: str, durability: str) -> None:
    store = sp.open_store(url.format(dir=tmp_path))
    assert store.durability.value == durability  # type: ignore[attr-defined]
    sync = store._conn().execute("PRAGMA synchronous").fetchone()[0]  # type: ignore[attr-defined]
    assert sync == (2 if durability == "power_loss" else 1)  # FULL / NORMAL
    mode = store._conn().execute("PRAGMA journal_mode").fetchone()[0]  # type: ignore[attr-defined]
    assert mode == "wal"


@pytest.mark.parametrize("url", ["sqlite://host/a.db", "ftp://x", "a.db?durability=never"])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(InvalidStoreURL):
        sp.open_store(url)


def test_default_url_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEPOINT_URL", f"sqlite:///{tmp_path / 'env.db'}")
    sp.open_store()
    assert (tmp_path / "env.db").exists()
    monkeypatch.delenv("SAFEPOINT_URL")
    monkeypatch.chdir(tmp_path)
    sp.open_store()
    assert (tmp_path / "safepoint.db").exists()


def test_large_results_are_verified_artifacts(file_store: sp.Store, crash_at: Any) -> None:
    big = "x" * 100_000

    @sp.workflow("big")
    def flow(run: sp.Run) -> int:
        return len(run.pure("big", lambda: {"text": big})["text"])

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    path = file_store.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT result, result_ref FROM safepoint_steps").fetchone()
        assert row[0] is None
        assert row[1].startswith("sha256:")
        # tamper with the stored bytes
        conn.execute("UPDATE safepoint_artifacts SET content = ? WHERE digest = ?", (b'{"text":"y"}', row[1]))
    with pytest.raises(ArtifactCorrupt) as corrupt:
        sp.resume(file_store, "r")
    assert corrupt.value.digest == row[1]
    run = file_store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record["phase"] == "unreadable_record"


def test_corrupt_row_blocks_the_run_and_keeps_it(file_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("corrupt")
    def flow(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 1))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    path = file_store.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE safepoint_steps SET result = '{not json' WHERE step_id = 'p'")
    with pytest.raises(CorruptRecord) as corrupt:
        sp.resume(file_store, "r")
    assert corrupt.value.table == "safepoint_steps"
    assert file_store.get_run("r").status is RunStatus.BLOCKED
    with sqlite3.connect(path) as conn:  # the bad row is still there for a person to see
        assert conn.execute("SELECT result FROM safepoint_steps").fetchone()[0] == "{not json"


def test_changed_workflow_version_blocks(file_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("versioned", version="1")
    def v1(run: sp.Run) -> int:
        return 1

    crash_at("run.after_start")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, v1, run_id="r", lease_ms=0)
    crash_at(None)

    @sp.workflow("versioned", version="2")
    def v2(run: sp.Run) -> int:
        return 2

    with pytest.raises(IncompatibleWorkflow) as error:
        sp.resume(file_store, "r")
    assert (error.value.recorded, error.value.current) == ("versioned@1", "versioned@2")
    assert file_store.get_run("r").recovery_record["phase"] == "incompatible_workflow"


def test_unregistered_workflow_is_a_clear_error(file_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("soon-gone")
    def flow(run: sp.Run) -> int:
        return 1

    crash_at("run.after_start")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    from safepoint._engine import workflow as _workflow

    del _workflow._registry["soon-gone"]
    with pytest.raises(WorkflowNotFound, match="--import"):
        sp.resume(file_store, "r")


_WORKER = """
import sys, safepoint as sp
sys.path.insert(0, {tests!r})
import flows
store = sp.open_store({url!r})
for i in range({runs}):
    assert sp.start(store, flows.many_steps, 20, run_id=f"{{sys.argv[1]}}-{{i}}") == 190
print("ok")
"""


def test_two_processes_share_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    code = _WORKER.format(tests=str(Path(__file__).parents[1]), url=url, runs=15)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    store = sp.open_store(url)
    runs = store.list_runs(limit=100)
    assert len(runs) == 30
    assert all(run.status is RunStatus.COMPLETED and run.result == 190 for run in runs)
    assert all(len(store.load_ledger(run.run_id).steps) == 20 for run in runs)


_RACER = """
import sys, json, safepoint as sp
from safepoint.errors import RunOwned
sys.path.insert(0, {tests!r})
import flows
store = sp.open_store({url!r})
try:
    print(json.dumps({{"result": sp.resume(store, "contended")}}))
except RunOwned as exc:
    print(json.dumps({{"owned": exc.owner}}))
"""


def test_two_processes_resuming_one_run(tmp_path: Path, owner_env: Any) -> None:
    """Both processes try to take over a run left by a killed worker: one claim wins, the
    other is refused or attaches to the finished result; the owner counts one charge."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    from safepoint.testing import run_child

    first = run_child(
        "flows:every_kind",
        store_url=url,
        run_id="contended",
        args=["c-1"],
        crash_at="effect.after_dispatching:effect.charge",
        owner_url=owner_env.url,
        pythonpath=[str(Path(__file__).parents[1])],
    )
    assert first.killed
    code = _RACER.format(tests=str(Path(__file__).parents[1]), url=url)
    env = {**__import__("os").environ, "SAFEPOINT_OWNER_URL": owner_env.url}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=60) for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), outputs
    results = [__import__("json").loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert any("result" in r for r in results), results
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (2, 0)
    store = sp.open_store(url)
    assert store.get_run("contended").status is RunStatus.COMPLETED
