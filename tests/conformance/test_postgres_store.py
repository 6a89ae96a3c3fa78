"""The PostgreSQL store against a real server: migrations, errors, the database clock, races
between a write and a claim, SKIP LOCKED, LISTEN/NOTIFY, and the shared conformance suite.

The session creates its own database (``safepoint_test_<uuid>``) through the server's
``postgres`` database and drops it at the end; tests that need an empty ledger use their own
schema in it. The server is ``$SAFEPOINT_TEST_POSTGRES`` (default: local, trust auth). When it is
unreachable the tests are skipped with the reason — except under CI (``$CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import PoolTimeout
except ImportError:  # the extra is not installed
    if os.environ.get("CI"):
        raise
    pytest.skip("psycopg is not installed: pip install 'safepoint[postgres]'", allow_module_level=True)

import safepoint as sp
from postgres_server import with_database
from safepoint._rules.canonical import digest
from safepoint.errors import ArtifactCorrupt, InvalidStoreURL, MigrationMismatch, SchemaTooNew
from safepoint.storage import Store
from safepoint.storage.base import NewRun
from safepoint.storage.migrations import load_migrations
from safepoint.storage.open_async import open_async_store
from safepoint.storage.plans import load_queries
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres.connection import dict_rows
from safepoint.storage.postgres.pool import PROBE_AFTER_S, Checkout, checkout, connection_lost
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.testing import OwnerService
from safepoint.testing.conformance import CLAIMS, StoreConformance, SyncOverAsync
from safepoint.types import (
    Claim,
    Durability,
    EffectState,
    OperationRecord,
    RunRetry,
    RunStatus,
    StepKind,
    StepRecord,
)

CLOCK_SQL = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now"


def _uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def admin(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection to the test database, for looking behind the store's back."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema_url(pg_url: str) -> str:
    """The URL of an empty schema of this test's own (created by the store on open)."""
    return f"{pg_url}?schema=t_{_uid()}"


@pytest.fixture
def opened() -> Iterator[Callable[[str], PostgresStore]]:
    """Open stores that are closed when the test ends."""
    stores: list[PostgresStore] = []

    def open_(url: str) -> PostgresStore:
        stores.append(PostgresStore(url))
        return stores[-1]

    yield open_
    for store in stores:
        store.close()


def _param(url: str, **params: str) -> str:
    joined = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{url}{'&' if '?' in url else '?'}{joined}"


def _new_run(run_id: str, owner: str | None, workflow: str = "wf", lease_ms: int = 60_000) -> NewRun:
    return NewRun(
        run_id=run_id,
        workflow=workflow,
        workflow_version="v1",
        input_hash="h",
        inputs={"args": [], "kwargs": {}},
        owner=owner,
        lease_ms=lease_ms,
    )


def _step(run_id: str, step_id: str) -> StepRecord:
    return StepRecord(
        run_id=run_id,
        step_id=step_id,
        kind=StepKind.PURE,
        name="fn",
        input_hash="h",
        result={"ok": True},
        seq=1,
    )


def _operation(run_id: str, payload: bytes, step_id: str = "s", effect: str = "e") -> OperationRecord:
    """A prepared operation of ``run_id`` whose payload is ``payload``."""
    return OperationRecord(
        run_id=run_id,
        operation_id="op",
        step_id=step_id,
        effect=effect,
        state=EffectState.PREPARED,
        payload_ref=digest(payload),
        effect_key="k",
    )


def _wait_until_blocked(admin: psycopg.Connection[Any], application_name: str) -> None:
    """Return once a backend of ``application_name`` waits on a lock (never guess by sleeping)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"{application_name} never blocked on the runs row lock")


class Background:
    """Run one call on a thread and keep what it returned or raised (LostOwnership included)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.result = call()
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=body)
        self._thread.start()

    def join(self) -> Background:
        self._thread.join(timeout=15)
        assert not self._thread.is_alive(), "the call never returned"
        return self


# -- migrations and opening ------------------------------------------------------------------


def test_migrations_are_recorded_with_checksums(
    schema_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(schema_url)
    schema = schema_url.rsplit("schema=", 1)[1]
    rows = admin.execute(
        sql.SQL("SELECT version, name, checksum FROM {}.safepoint_schema_version ORDER BY version").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    shipped = load_migrations("postgres")
    assert [(v, n) for v, n, _ in rows] == [(v, n) for v, n, _ in shipped]
    assert all(len(checksum) == 64 for _, _, checksum in rows)
    assert store.schema_version() == len(shipped)
    tables = {
        r[0]
        for r in admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        )
    }
    assert tables >= {
        "safepoint_runs",
        "safepoint_steps",
        "safepoint_operations",
        "safepoint_events",
        "safepoint_artifacts",
        "safepoint_schema_version",
    }
    assert all(t.startswith("safepoint_") for t in tables)
    opened(schema_url)  # opening again applies nothing and raises nothing
    assert admin.execute(
        sql.SQL("SELECT count(*) FROM {}.safepoint_schema_version").format(sql.Identifier(schema))
    ).fetchone() == (len(shipped),)


def test_concurrent_openers_migrate_once(schema_url: str, admin: psycopg.Connection[Any]) -> None:
    barrier = threading.Barrier(6)
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_() -> None:
        barrier.wait()
        try:
            stores.append(PostgresStore(schema_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in stores:
        store.close()
    assert errors == []
    schema = schema_url.rsplit("schema=", 1)[1]
    versions = admin.execute(
        sql.SQL("SELECT version FROM {}.safepoint_schema_version").format(sql.Identifier(schema))
    ).fetchall()
    assert sorted(v for (v,) in versions) == [v for v, _, _ in load_migrations("postgres")]


def test_a_newer_schema_is_refused_and_left_untouched(
    schema_url: str, admin: psycopg.Connection[Any]
) -> None:
    PostgresStore(schema_url).close()
    table = sql.SQL("{}.safepoint_schema_version").format(sql.Identifier(schema_url.rsplit("schema=", 1)[1]))
    admin.execute(sql.SQL("INSERT INTO {} VALUES (99, '0099_x.sql', 'c', 0)").format(table))
    with pytest.raises(SchemaTooNew) as error:
        PostgresStore(schema_url)
    assert (error.value.found, error.value.known) == (  # type: ignore[attr-defined]
        99,
        len(load_migrations("postgres")),
    )
    assert "upgrade safepoint" in str(error.value)
    assert admin.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (
        len(load_migrations("postgres")) + 1,
    )


def test_an_edited_migration_is_detected(schema_url: str, admin: psycopg.Connection[Any]) -> None:
    PostgresStore(schema_url).close()
    admin.execute(
        sql.SQL("UPDATE {}.safepoint_schema_version SET checksum = 'x' WHERE version = 1").format(
            sql.Identifier(schema_url.rsplit("schema=", 1)[1])
        )
    )
    with pytest.raises(MigrationMismatch):
        PostgresStore(schema_url)


def test_an_unreachable_server_is_a_clear_store_error_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(sp.StoreError) as error:
        PostgresStore("postgresql://postgres:hunter2@127.0.0.1:1/safepoint")
    assert time.monotonic() - started < 5
    message = str(error.value)
    assert "cannot reach the PostgreSQL store at postgresql://postgres:***@127.0.0.1:1" in message
    assert "check that the server is running" in message
    assert "hunter2" not in message
    assert isinstance(error.value.__cause__, psycopg.OperationalError)


def test_a_missing_database_says_so(pg_url: str) -> None:
    with pytest.raises(sp.StoreError) as error:
        PostgresStore(with_database(pg_url, f"safepoint_missing_{_uid()}"))
    assert "does not exist" in str(error.value)


@pytest.mark.parametrize("query", ["nonsense=1", "durability=never", "schema=", "claim=sideways"])
def test_bad_url_parameters_are_invalid_store_urls(pg_url: str, query: str) -> None:
    with pytest.raises(InvalidStoreURL):
        PostgresStore(f"{pg_url}?{query}")


def test_the_url_shown_has_no_password(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    parts = urlsplit(pg_url)
    with_password = urlunsplit(
        parts._replace(netloc=f"{parts.username}:s3cret@{parts.hostname}:{parts.port}")
    )
    store = opened(with_password)  # trust auth ignores the password
    assert "s3cret" not in store.url
    assert ":***@" in store.url


@pytest.mark.parametrize(("durability", "expected"), [(None, "off"), ("power_loss", "on")])
def test_durability_is_stated_per_connection(
    pg_url: str, durability: str | None, expected: str, opened: Callable[[str], PostgresStore]
) -> None:
    # Pretend the server's default is synchronous_commit=off: the default durability keeps the
    # server's setting, power_loss overrides it on every connection.
    url = _param(pg_url, options="-csynchronous_commit%3Doff")
    store = opened(_param(url, durability=durability) if durability else url)
    assert store.durability is Durability(durability or "process_crash")
    with store._pool.connection() as conn:  # the setting is only visible on a connection
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    assert row["synchronous_commit"] == expected


def test_open_store_opens_postgres_urls(pg_url: str) -> None:
    for url in (pg_url, pg_url.replace("postgresql://", "postgres://", 1)):
        store = sp.open_store(_param(url, durability="power_loss"))
        try:
            assert isinstance(store, PostgresStore)
            assert store.durability is Durability.POWER_LOSS
        finally:
            store.close()


def test_without_the_extra_a_postgres_url_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    for name in [m for m in sys.modules if m.startswith("safepoint.storage.postgres")]:
        monkeypatch.delitem(sys.modules, name)  # the store's modules, imported afresh
    with pytest.raises(sp.UsageError) as error:
        sp.open_store("postgresql://nobody@127.0.0.1:1/none")
    assert "pip install 'safepoint[postgres]'" in str(error.value)
    assert isinstance(error.value.__cause__, ImportError)


def test_importing_safepoint_does_not_import_psycopg() -> None:
    code = "import sys, safepoint; safepoint.open_store('memory:'); print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the database clock ----------------------------------------------------------------------


def test_now_is_the_database_clock(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(pg_url)
    for _ in range(5):
        before = admin.execute(CLOCK_SQL).fetchone()
        now = store.now()
        after = admin.execute(CLOCK_SQL).fetchone()
        assert before is not None
        assert after is not None
        # estimated between readings of the server's clock (ClockEstimate): within a few ms
        assert before[0] - 5 <= now <= after[0] + 5


def test_leases_are_granted_and_judged_on_the_database_clock(
    schema_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """Move this schema's clock a day ahead: leases follow it, not the worker's clock."""
    store = opened(schema_url)
    day = 86_400_000
    schema = sql.Identifier(schema_url.rsplit("schema=", 1)[1])
    admin.execute(
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}.safepoint_now_ms() RETURNS bigint LANGUAGE sql VOLATILE"
            " AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000 $$"
        ).format(schema)
    )
    worker_now = int(time.time() * 1000)
    assert store.now() >= worker_now + day - 60_000
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=1_000))
    assert claim is not None
    assert claim.lease_expires_at >= worker_now + day - 60_000
    # By the worker's clock the lease is a day away; by the database's it expires in a second.
    time.sleep(1.1)
    taken = store.claim_run(run.run_id, run.state_revision, "worker-b", 60_000)
    assert taken is not None
    assert store.events(run.run_id)[-1].at >= worker_now + day - 60_000


# -- a write racing a claim --------------------------------------------------------------------


def _racing_stores(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> tuple[PostgresStore, PostgresStore, str, str]:
    writer_app, claimer_app = f"sp-writer-{_uid()}", f"sp-claimer-{_uid()}"
    return (
        opened(_param(pg_url, application_name=writer_app)),
        opened(_param(pg_url, application_name=claimer_app)),
        writer_app,
        claimer_app,
    )


def _lock_run(pg_url: str, run_id: str) -> psycopg.Connection[Any]:
    """Hold the runs row lock in an open transaction, so contenders queue in a known order."""
    blocker = psycopg.connect(pg_url)
    blocker.execute("SELECT 1 FROM safepoint_runs WHERE run_id = %s FOR UPDATE", (run_id,))
    return blocker


def test_a_claim_that_queued_first_wins_and_the_waiting_write_is_fenced_out(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    writer, claimer, writer_app, claimer_app = _racing_stores(pg_url, opened)
    run, old = writer.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=1))
    assert old is not None
    time.sleep(0.01)  # the 1 ms lease is over
    blocker = _lock_run(pg_url, run.run_id)
    claim = Background(lambda: claimer.claim_run(run.run_id, run.state_revision, "worker-b", 60_000))
    _wait_until_blocked(admin, claimer_app)
    write = Background(lambda: writer.record_step(old, _step(run.run_id, "late")))
    _wait_until_blocked(admin, writer_app)  # the write is queued behind the claim
    blocker.commit()
    blocker.close()
    new = claim.join().result
    assert isinstance(new, Claim)
    assert new.fence == old.fence + 1
    assert isinstance(write.join().error, sp.LostOwnership)
    assert "late" not in writer.load_ledger(run.run_id).steps


def test_a_write_that_queued_first_commits_and_the_claim_sees_the_moved_revision(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    writer, claimer, writer_app, claimer_app = _racing_stores(pg_url, opened)
    run, old = writer.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=1))
    assert old is not None
    time.sleep(0.01)
    blocker = _lock_run(pg_url, run.run_id)
    write = Background(lambda: writer.record_step(old, _step(run.run_id, "first")))
    _wait_until_blocked(admin, writer_app)
    claim = Background(lambda: claimer.claim_run(run.run_id, run.state_revision, "worker-b", 60_000))
    _wait_until_blocked(admin, claimer_app)  # the claim is queued behind the write
    blocker.commit()
    blocker.close()
    assert write.join().error is None
    assert claim.join().result is None  # compare-and-set: the revision it read has moved
    assert writer.load_ledger(run.run_id).steps["first"].fence == old.fence
    assert claimer.get_run(run.run_id).owner == "worker-a"  # nobody took the run over


def test_a_stale_worker_cannot_reach_dispatching(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    store = opened(pg_url)
    run, old = store.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=1))
    assert old is not None
    payload = b'{"amount":5}'
    op = _operation(run.run_id, payload, step_id="pay", effect="pay")
    store.prepare_effect(old, op, payload)
    time.sleep(0.01)
    assert (
        store.claim_run(run.run_id, store.get_run(run.run_id).state_revision, "worker-b", 60_000) is not None
    )
    with pytest.raises(sp.LostOwnership):
        store.mark_dispatching(old, "op")
    assert store.load_ledger(run.run_id).operations["op"].state is EffectState.PREPARED


def test_a_refused_step_write_leaves_no_artifact_behind(
    pg_url: str, opened: Callable[[str], PostgresStore], admin: psycopg.Connection[Any]
) -> None:
    """A large step result is stored by the fenced statement itself: a stale worker's write is
    refused whole, its artifact included; the owner's write stores it, and it reads back."""
    from dataclasses import replace

    from safepoint._rules.canonical import dumps

    store = opened(pg_url)
    run, old = store.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=1))
    assert old is not None
    large = {"text": f"{_uid()}-" + "x" * 20_000}  # past the inline limit: an artifact
    ref = digest(dumps(large).encode())
    step = replace(_step(run.run_id, "big"), result=large)
    time.sleep(0.01)
    new = store.claim_run(run.run_id, store.get_run(run.run_id).state_revision, "worker-b", 60_000)
    assert new is not None

    def stored() -> int:
        return admin.execute("SELECT count(*) FROM safepoint_artifacts WHERE digest = %s", (ref,)).fetchone()[
            0
        ]

    with pytest.raises(sp.LostOwnership):
        store.record_steps(old, [step])
    assert stored() == 0
    store.record_steps(new, [step, replace(step, step_id="big-again", seq=2)])
    assert stored() == 1
    steps = store.load_ledger(run.run_id).steps
    assert steps["big"].result == large == steps["big-again"].result


def test_a_pruned_runs_copy_of_a_large_value_goes_though_another_run_holds_the_same(
    pg_url: str, opened: Callable[[str], PostgresStore], admin: psycopg.Connection[Any]
) -> None:
    """Each run keeps its own copy of a large value (an artifact, by digest): pruning one run
    deletes its copy, and the other run's copy — which its rows read — stays."""
    from dataclasses import replace

    from safepoint._rules.canonical import dumps
    from safepoint._rules.retention import PRUNABLE
    from safepoint.storage.prune import PruneRequest

    store = opened(pg_url)
    large = {"text": f"{_uid()}-" + "x" * 20_000}  # past the inline limit: an artifact
    ref = digest(dumps(large).encode())
    workflows = (f"prune-copy-{_uid()}", f"kept-copy-{_uid()}")
    runs = []
    for workflow in workflows:
        run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a", workflow=workflow))
        assert claim is not None
        store.record_steps(claim, [replace(_step(run.run_id, "big"), result=large)])
        store.finish_run(claim, RunStatus.COMPLETED, result=large)
        runs.append(run.run_id)
    pruned, other = runs

    def copies() -> list[str]:
        rows = admin.execute(
            "SELECT run_id FROM safepoint_artifacts WHERE digest = %s ORDER BY run_id", (ref,)
        )
        return [row[0] for row in rows.fetchall()]

    assert copies() == sorted(runs)
    batch = store.prune_runs(
        PruneRequest(statuses=PRUNABLE, before=store.now() + 1_000, workflow=workflows[0])
    )
    assert batch.runs == (pruned,)
    assert copies() == [other]
    assert batch.artifacts == 1
    assert store.load_ledger(other).steps["big"].result == large == store.get_run(other).result
    batch = store.prune_runs(
        PruneRequest(statuses=PRUNABLE, before=store.now() + 1_000, workflow=workflows[1])
    )
    assert (batch.runs, batch.artifacts, copies()) == ((other,), 1, [])


# -- claim_next and SKIP LOCKED ----------------------------------------------------------------


def _with_claim(url: str, claim: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}claim={claim}"


@pytest.fixture(params=["skip_locked", "per_run"])
def claiming_url(request: pytest.FixtureRequest, pg_url: str) -> str:
    """The session's database, claimed in one statement across every run or run by run."""
    return _with_claim(pg_url, request.param)


def test_claim_next_skips_a_run_being_claimed_instead_of_waiting(
    pg_url: str, claiming_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(claiming_url)
    workflow = f"wf-{_uid()}"
    first, _ = store.create_run(_new_run(f"a-{_uid()}", None, workflow))
    time.sleep(0.005)
    second, _ = store.create_run(_new_run(f"b-{_uid()}", None, workflow))
    blocker = _lock_run(pg_url, first.run_id)
    try:
        started = time.monotonic()
        got = store.claim_next("worker-b", 60_000, [workflow])
        assert time.monotonic() - started < 1.0
        assert got is not None
        assert got.run_id == second.run_id
        assert store.claim_next("worker-b", 60_000, [workflow]) is None
    finally:
        blocker.rollback()
        blocker.close()
    got = store.claim_next("worker-b", 60_000, [workflow])
    assert got is not None
    assert got.run_id == first.run_id


def test_claim_next_under_threads_never_hands_out_a_run_twice(
    claiming_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    shared = opened(claiming_url)  # one pool for half the threads, a store each for the rest
    workflow = f"wf-{_uid()}"
    mine = {shared.create_run(_new_run(f"r-{_uid()}", None, workflow))[0].run_id for _ in range(60)}
    stores = [shared] * 4 + [opened(claiming_url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    taken: list[str] = []
    lock = threading.Lock()

    def drain(store: PostgresStore, owner: str) -> None:
        barrier.wait()
        while (claim := store.claim_next(owner, 60_000, [workflow])) is not None:
            with lock:
                taken.append(claim.run_id)

    threads = [threading.Thread(target=drain, args=(s, f"w{i}")) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(taken) == sorted(mine)
    for run_id in mine:
        assert [e.kind for e in shared.events(run_id)] == ["run.submitted", "run.claimed"]


def test_a_released_run_is_claimable_at_once(
    claiming_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(claiming_url)
    workflow = f"wf-{_uid()}"
    _, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a", workflow))
    assert claim is not None
    store.release_run(claim)
    again = store.claim_next("worker-b", 60_000, [workflow])
    assert again is not None
    assert again.run_id == claim.run_id
    assert again.fence > claim.fence + 1  # the release moved it on, and the claim again


# -- LISTEN / NOTIFY ---------------------------------------------------------------------------


def _wake_time(waiter: PostgresStore, act: Callable[[], Any], timeout: float = 10.0) -> float:
    ready = threading.Event()
    woke: list[float] = []

    def wait() -> None:
        waiter.wait_for_work(0.01)  # LISTEN on this thread's connection, drop old news
        ready.set()
        started = time.monotonic()
        waiter.wait_for_work(timeout)
        woke.append(time.monotonic() - started)

    thread = threading.Thread(target=wait)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.05)  # inside notifies() by now; a notification before that also counts
    act()
    thread.join(timeout + 5)
    assert woke, "wait_for_work did not return"
    return woke[0]


def test_a_submitted_run_wakes_a_waiting_worker_promptly(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    waiter, submitter = opened(pg_url), opened(pg_url)
    elapsed = _wake_time(waiter, lambda: submitter.create_run(_new_run(f"r-{_uid()}", None)))
    assert elapsed < 1.0


def test_ledgers_in_two_schemas_of_one_database_do_not_wake_each_others_workers(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    """NOTIFY reaches the whole database: each schema's ledger has a channel of its own."""
    here_url, there_url = f"{pg_url}?schema=t_{_uid()}", f"{pg_url}?schema=t_{_uid()}"
    waiter, here, there = opened(here_url), opened(here_url), opened(there_url)
    heard: list[bool] = []
    ready, first = threading.Event(), threading.Event()

    def wait() -> None:
        waiter.wait_for_work(0.01)  # LISTEN on this thread's connection, drop old news
        ready.set()
        heard.append(waiter.wait_for_work(1.0))  # the other ledger's run: not news here
        first.set()
        heard.append(waiter.wait_for_work(10))  # this ledger's (news kept while nobody waits)

    thread = threading.Thread(target=wait)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.05)
    there.create_run(_new_run(f"r-{_uid()}", None))
    assert first.wait(10)
    here.create_run(_new_run(f"r-{_uid()}", None))
    thread.join(15)
    assert heard == [False, True]


def test_an_async_store_hears_only_its_own_schemas_news(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    here_url, there_url = f"{pg_url}?schema=t_{_uid()}", f"{pg_url}?schema=t_{_uid()}"
    here, there = opened(here_url), opened(there_url)

    async def body() -> list[bool]:
        async with AsyncPostgresStore(here_url) as waiter:
            await waiter.wait_for_work(0.01)  # LISTEN; drop old news
            other = asyncio.create_task(waiter.wait_for_work(1.0))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(there.create_run, _new_run(f"r-{_uid()}", None))
            own = asyncio.create_task(waiter.wait_for_work(10))
            await asyncio.wait_for(other, 5)
            await asyncio.to_thread(here.create_run, _new_run(f"r-{_uid()}", None))
            return [await other, await asyncio.wait_for(own, 5)]

    assert asyncio.run(body()) == [False, True]


def test_a_released_run_wakes_a_waiting_worker(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    waiter, holder = opened(pg_url), opened(pg_url)
    _, claim = holder.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    assert _wake_time(waiter, lambda: holder.release_run(claim)) < 1.0


def test_a_retried_run_wakes_a_waiting_worker(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    waiter, person = opened(pg_url), opened(pg_url)
    _, claim = person.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    person.finish_run(claim, RunStatus.FAILED, error={"type": "ValueError", "message": "no"})
    failed = person.get_run(claim.run_id)
    retry = RunRetry(by="ana")
    assert _wake_time(waiter, lambda: person.retry_run(failed.run_id, failed.state_revision, retry)) < 1.0


def test_a_run_started_by_its_owner_wakes_nobody(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    waiter, starter = opened(pg_url), opened(pg_url)
    elapsed = _wake_time(waiter, lambda: starter.create_run(_new_run(f"r-{_uid()}", "me")), timeout=0.5)
    assert elapsed >= 0.45


def test_connections_killed_by_the_server_are_replaced(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """What a server restart looks like to a store: every backend gone at once."""
    app = f"sp-victim-{_uid()}"
    store, submitter = opened(_param(pg_url, application_name=app)), opened(pg_url)
    run, _ = store.create_run(_new_run(f"r-{_uid()}", None))
    store.wait_for_work(0.01)  # open this thread's listener too
    killed = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (app,)
    ).fetchone()
    assert killed is not None
    assert killed[0] >= 2
    assert store.get_run(run.run_id) == run  # the pool's check on checkout caught it
    store.wait_for_work(0.2)  # the dead listener is dropped, not raised
    elapsed = _wake_time(store, lambda: submitter.create_run(_new_run(f"r-{_uid()}", None)))
    assert elapsed < 1.0


# -- sessions the server ends, and round trips ------------------------------------------------


@pytest.mark.parametrize(
    ("rested_s", "unsolicited", "verdict"),
    [
        (0.001, False, Checkout.USE),
        (PROBE_AFTER_S - 0.001, False, Checkout.USE),
        (PROBE_AFTER_S, False, Checkout.PROBE),
        (None, False, Checkout.PROBE),  # never seen handed back: prove it
        (0.001, True, Checkout.DISCARD),  # the server spoke unasked: it is ending the session
        (None, True, Checkout.DISCARD),
    ],
)
def test_the_check_on_checkout(rested_s: float | None, unsolicited: bool, verdict: Checkout) -> None:
    assert checkout(rested_s, unsolicited) is verdict


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Every file descriptor below 1100 taken, as in a busy server process: the next sockets get
    numbers above select()'s FD_SETSIZE (1024)."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        if hard != resource.RLIM_INFINITY and hard < 2048:
            pytest.skip(f"the open-files limit ({hard}) is too low to go past 1024")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_store_works_in_a_process_with_many_open_files(
    pg_url: str, high_descriptors: None, opened: Callable[[str], PostgresStore]
) -> None:
    """The check on checkout looks at the socket without select(), which refuses descriptors
    numbered 1024 and above."""
    store = opened(pg_url)
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    store.record_step(claim, _step(run.run_id, "s"))
    assert set(store.load_ledger(run.run_id).steps) == {"s"}


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown(), True),
        (psycopg.errors.ConnectionFailure(), True),
        (psycopg.errors.IdleSessionTimeout(), True),
        (psycopg.errors.QueryCanceled(), False),  # a statement timeout: the session lives on
        (psycopg.errors.LockNotAvailable(), False),
        (psycopg.errors.UniqueViolation(), False),
        (PoolTimeout(), False),  # already waited as long as the caller allows
        (None, False),
    ],
)
def test_which_failures_ended_the_session(error: BaseException | None, lost: bool) -> None:
    assert connection_lost(error) is lost


def _established(ports: set[int]) -> bool:
    """Whether a TCP socket of ours on one of these local ports is still established, i.e. has
    not yet received the server's FIN (Linux's /proc/net/tcp; elsewhere: unknown, False)."""
    try:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
    except OSError:
        return False
    return any(int(row[1].rsplit(":", 1)[1], 16) in ports and row[3] == "01" for row in rows)


def _terminate(admin: psycopg.Connection[Any], application_name: str, *, waiting: bool = False) -> int:
    """End the backends of ``application_name`` (those waiting on a lock, with ``waiting``)
    and return once the client end of each has received the FATAL and the FIN that follows
    it: a loaded machine can deliver them after the backend is gone."""
    sessions = admin.execute(
        "SELECT pid, client_port FROM pg_stat_activity WHERE application_name = %s"
        " AND (NOT %s OR wait_event_type = 'Lock')",
        (application_name, waiting),
    ).fetchall()
    for pid, _ in sessions:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while _established({port for _, port in sessions}):
        assert time.monotonic() < deadline, "the terminated sessions never ended"
        time.sleep(0.01)
    return len(sessions)


def test_sessions_the_server_ended_while_idle_cost_the_next_read_and_write_nothing(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """A restart between two steps: the check on checkout finds the dead sessions before
    anything is sent on them, so the next read and the next fenced write just work."""
    app = f"sp-idle-{_uid()}"
    store = opened(_param(pg_url, application_name=app))
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    store.record_step(claim, _step(run.run_id, "before"))
    assert _terminate(admin, app) >= 1
    assert store.get_run(run.run_id).owner == "worker-a"
    assert _terminate(admin, app) >= 1
    store.record_step(claim, _step(run.run_id, "after"))
    assert set(store.load_ledger(run.run_id).steps) == {"before", "after"}


def test_a_read_whose_session_ends_under_it_is_read_again(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    app = f"sp-reader-{_uid()}"
    store = opened(_param(pg_url, application_name=app))
    run, _ = store.create_run(_new_run(f"r-{_uid()}", None))
    with psycopg.connect(pg_url) as blocker:  # the read waits on the table lock, in flight
        blocker.execute("LOCK TABLE safepoint_runs IN ACCESS EXCLUSIVE MODE")
        read = Background(lambda: store.get_run(run.run_id))
        _wait_until_blocked(admin, app)
        assert _terminate(admin, app, waiting=True) == 1
        blocker.rollback()
    assert read.join().error is None
    assert read.result == run


def test_a_write_whose_session_ends_in_flight_is_not_sent_again(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """A fenced write whose connection breaks after it was sent may or may not have committed:
    it fails with StoreUnavailable — never re-sent — and the ledger is exactly what committed,
    so the worker (or the next one) carries on from there."""
    app = f"sp-writer-{_uid()}"
    store = opened(_param(pg_url, application_name=app))
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    blocker = _lock_run(pg_url, run.run_id)
    write = Background(lambda: store.record_step(claim, _step(run.run_id, "lost")))
    _wait_until_blocked(admin, app)
    assert _terminate(admin, app, waiting=True) == 1
    blocker.commit()  # a re-sent write would now go through
    blocker.close()
    assert isinstance(write.join().error, sp.StoreUnavailable)
    assert "lost" not in store.load_ledger(run.run_id).steps
    store.record_step(claim, _step(run.run_id, "lost"))  # the fence still holds: carry on
    assert "lost" in store.load_ledger(run.run_id).steps


def test_load_ledger_reads_one_snapshot(
    pg_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """What commits while the ledger is being read is not in it, though the table it went to
    is read last."""
    app = f"sp-loader-{_uid()}"
    store = opened(_param(pg_url, application_name=app))
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    with psycopg.connect(pg_url) as blocker:
        blocker.execute("LOCK TABLE safepoint_attempts IN ACCESS EXCLUSIVE MODE")
        load = Background(lambda: store.load_ledger(run.run_id))
        _wait_until_blocked(admin, app)  # the run, steps and operations read; attempts next
        blocker.execute(
            "INSERT INTO safepoint_attempts (run_id, step_id, attempt, kind, name, input_hash,"
            " error, retry_at, fence, recorded_at) VALUES (%s, 's', 1, 'read', 'fn', 'h', '{}',"
            " 0, %s, 0)",
            (run.run_id, claim.fence),
        )
    assert load.join().error is None
    assert load.result.attempts == {}
    assert "s" in store.load_ledger(run.run_id).attempts


def test_recording_a_step_reads_no_other_step_of_the_run(
    schema_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    """A durable step costs the same at the 2000th step as at the first (counting the run's
    new steps used to read every step already recorded: quadratic runs)."""
    store = opened(schema_url)
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    for batch in range(4):
        store.record_steps(
            claim,
            [
                StepRecord(run.run_id, f"s.{batch}.{i}", StepKind.PURE, "fn", "h", None, seq=batch * 500 + i)
                for i in range(500)
            ],
        )
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema_url.rsplit("schema=", 1)[1])))
    step = {
        "step_id": "new",
        "seq": 2000,
        "kind": "read",
        "name": "fn",
        "input_hash": "h",
        "step_status": "completed",
        "attempt": 1,
    }
    with admin.transaction():
        rows = admin.execute(
            load_queries("postgres")["record_steps"],
            {
                "run_id": run.run_id,
                "fence": claim.fence,
                "lease_ms": 60_000,
                "steps": json.dumps([step]),
                "artifact_refs": [],
                "artifact_contents": [],
            },
        ).fetchall()
        assert len(rows) == 1
        read = admin.execute(
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_xact_user_tables"
            " WHERE relname = 'safepoint_steps'"
        ).fetchone()
    assert read is not None
    assert read[0] <= 2


class _RoundTrips:
    """A TCP relay to the server that counts round trips: each time the client sends after the
    server has spoken."""

    def __init__(self, pg_url: str) -> None:
        target = urlsplit(pg_url)
        self._server = (target.hostname or "127.0.0.1", target.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = urlunsplit(
            target._replace(netloc=f"{target.username}@127.0.0.1:{self._listener.getsockname()[1]}")
        )
        self.count = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._server)
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        answered = True
        with client, server:
            while True:
                for side in select.select([client, server], [], [])[0]:
                    data = side.recv(65536)
                    if not data:
                        return
                    if side is client:
                        self.count += answered
                        answered = False
                        server.sendall(data)
                    else:
                        answered = True
                        client.sendall(data)

    def close(self) -> None:
        self._listener.close()


@sp.workflow("pg-durable-reads")
def _durable_reads(run: sp.Run, n: int) -> int:
    return sum(run.read(f"read.{i}", lambda i=i: i) for i in range(n))


def test_a_durable_step_costs_one_round_trip(pg_url: str) -> None:
    """The step's fenced write is the only thing sent: no check of the connection first, no
    BEGIN or COMMIT, the clock read at most once a second."""
    relay = _RoundTrips(pg_url)
    store = PostgresStore(relay.url)
    try:
        sp.start(store, _durable_reads, 20, run_id=f"warm-{_uid()}")  # statements prepared
        counts = []
        for n in (40, 140):
            before = relay.count
            sp.start(store, _durable_reads, n, run_id=f"reads-{_uid()}")
            counts.append(relay.count - before)
    finally:
        store.close()
        relay.close()
    assert 99 <= counts[1] - counts[0] <= 102  # 100 more steps, give or take a clock reading


# An effect whose "prepared" and "dispatching" are one commit (it reconciles, within the owner's
# retention), and one whose "prepared" commits on its own (without reconcile, a crash after a
# "dispatching" commit would block the run for a person).
_FOLDED = sp.Effect(
    "pg.folded",
    execute=lambda payload, key: {"id": payload["i"]},
    reconcile=lambda key: sp.NotApplied(),
    dedup_retention=timedelta(hours=1),
)
_APART = sp.Effect("pg.apart", execute=lambda payload, key: {"id": payload["i"]})


@sp.workflow("pg-effects")
def _effects(run: sp.Run, n: int, folded: bool) -> int:
    for i in range(n):
        run.effect(f"fx.{i}", _FOLDED if folded else _APART, payload={"i": i})
    return n


@pytest.mark.parametrize(("folded", "writes"), [(True, 2), (False, 3)])
def test_each_write_of_an_effect_costs_one_round_trip(pg_url: str, folded: bool, writes: int) -> None:
    """prepared-and-dispatching (or prepared, then dispatching) and the outcome with its step:
    one statement each, in autocommit."""
    relay = _RoundTrips(pg_url)
    store = PostgresStore(relay.url)
    try:
        sp.start(store, _effects, 10, folded, run_id=f"warm-{_uid()}")  # statements prepared
        counts = []
        for n in (20, 70):
            before = relay.count
            sp.start(store, _effects, n, folded, run_id=f"effects-{_uid()}")
            counts.append(relay.count - before)
    finally:
        store.close()
        relay.close()
    assert 50 * writes - 1 <= counts[1] - counts[0] <= 50 * writes + 2  # give or take a clock


# -- values, artifacts, driver errors --------------------------------------------------------


def test_json_comes_back_exactly_as_written(pg_url: str, opened: Callable[[str], PostgresStore]) -> None:
    """TEXT, not JSONB: JSONB would turn 1e300 into an int, reorder keys, refuse \\u0000."""
    store = opened(pg_url)
    inputs = {"z": 1e300, "a": "nul \x00 here", "m": [0.1, -0.0, 2**53 - 1]}
    run, claim = store.create_run(NewRun(f"r-{_uid()}", "wf", "v1", "h", inputs, "me", 60_000))
    assert claim is not None
    loaded = store.get_run(run.run_id).inputs
    assert loaded == inputs
    assert list(loaded) == ["z", "a", "m"]
    assert isinstance(loaded["z"], float)
    record = {"phase": "unreadable_record", "reason": "bad \x00 byte", "state_revision": 0}
    store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)
    blocked = store.get_run(run.run_id)
    assert blocked.recovery_record == {**record, "state_revision": blocked.state_revision}


def test_a_tampered_artifact_is_corrupt(
    schema_url: str, admin: psycopg.Connection[Any], opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(schema_url)  # its own schema: a corrupt row would trouble other tests
    admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema_url.rsplit("schema=", 1)[1])))
    big = {"text": "x" * 100_000, "id": _uid()}
    run, _ = store.create_run(NewRun(f"r-{_uid()}", "wf", "v1", "h", big, None, 0))
    row = admin.execute(
        "SELECT inputs, inputs_ref FROM safepoint_runs WHERE run_id = %s", (run.run_id,)
    ).fetchone()
    assert row is not None
    assert row[0] is None
    assert row[1].startswith("sha256:")
    admin.execute("UPDATE safepoint_artifacts SET content = %s WHERE digest = %s", (b'{"text":"y"}', row[1]))
    with pytest.raises(ArtifactCorrupt) as corrupt:
        store.get_run(run.run_id)
    assert corrupt.value.digest == row[1]  # type: ignore[attr-defined]


def test_driver_errors_become_store_errors_with_the_cause_kept(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(pg_url)
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    payload = b"{}"
    op = _operation(run.run_id, payload)
    store.prepare_effect(claim, op, payload)
    before = store.get_run(run.run_id)
    with pytest.raises(sp.StoreError) as error:
        store.prepare_effect(claim, op, payload)  # the operation exists already
    assert isinstance(error.value.__cause__, psycopg.errors.UniqueViolation)
    assert store.get_run(run.run_id) == before  # the fence's update was rolled back with it


# -- the client's side of a statement ---------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1 AS a, 'x' AS b, NULL::bigint AS c",
        "SELECT 1 AS a, 2 AS a",  # equal names: the last one wins, as in a dict
        'SELECT 1 AS "é", 2 AS "ü"',  # not ASCII: decoded each time
        "SELECT",  # rows of no columns
        "SELECT 1 AS a WHERE false",  # columns, no rows
        "SELECT * FROM (VALUES (1, 'one'), (2, 'two')) AS v(n, word)",
    ],
)
def test_rows_come_as_psycopgs_dict_row_makes_them(admin: psycopg.Connection[Any], query: str) -> None:
    expected = admin.cursor(row_factory=psycopg.rows.dict_row).execute(query).fetchall()
    for _ in range(2):  # the row maker made, then the one found
        assert admin.cursor(row_factory=dict_rows).execute(query).fetchall() == expected


def test_a_statement_without_rows_has_no_row_maker(admin: psycopg.Connection[Any]) -> None:
    cur = admin.cursor(row_factory=dict_rows)
    cur.execute("CREATE TEMPORARY TABLE t_rows (n int)")
    with pytest.raises(psycopg.ProgrammingError):
        cur.fetchall()


def test_a_pooled_connection_runs_every_plan_on_its_own_cursor(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(pg_url)
    with store._pool.connection() as conn:
        first = conn.plans()
        assert conn.plans() is first
    run, claim = store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
    assert claim is not None
    store.record_step(claim, _step(run.run_id, "s1"))
    payload = b"{}"
    op = _operation(run.run_id, payload)
    store.prepare_effect(claim, op, payload)
    with pytest.raises(sp.StoreError) as error:  # a statement failed on the kept cursor …
        store.prepare_effect(claim, op, payload)
    assert isinstance(error.value.__cause__, psycopg.errors.UniqueViolation)
    store.record_step(claim, _step(run.run_id, "s2"))  # … which runs the next one as ever
    assert set(store.load_ledger(run.run_id).steps) == {"s1", "s2"}


# -- whole runs --------------------------------------------------------------------------------


@sp.workflow("pg-steps")
def _steps_flow(run: sp.Run, n: int) -> int:
    return sum(run.pure(f"step.{i}", lambda i=i: i * i) for i in range(n))


def test_a_worker_runs_submitted_workflows_on_postgres(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    store = opened(pg_url)
    ids = [sp.submit(store, _steps_flow, 4, run_id=f"pg-{_uid()}") for _ in range(5)]
    stats = sp.Worker(store, concurrency=3, workflows=["pg-steps"]).run(until_idle=True, handle_signals=False)
    assert stats.completed >= 5
    for run_id in ids:
        assert sp.resume(store, run_id) == 14
        assert store.get_run(run_id).status is RunStatus.COMPLETED


def _worker_process(url: str, owner: OwnerService, *extra: str) -> subprocess.Popen[str]:
    tests = os.path.dirname(os.path.dirname(__file__))
    env = {
        **os.environ,
        "SAFEPOINT_OWNER_URL": owner.url,
        "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safepoint",
            "--store",
            url,
            "worker",
            "--import",
            "flows",
            "--lease",
            "1",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.kill
def test_worker_processes_share_the_queue_and_survive_sigkill(
    schema_url: str, owner_env: OwnerService, opened: Callable[[str], PostgresStore]
) -> None:
    """Three worker processes on one database; one is SIGKILLed mid-way; the others finish
    every run, and every effect reached its owner exactly once."""
    import flows

    store = opened(schema_url)
    owner_env.client.set_faults(delay=0.1)
    for index in range(12):
        sp.submit(store, flows.every_kind, f"case-{index}", run_id=f"job-{index}")
    doomed = _worker_process(schema_url, owner_env)
    deadline = time.monotonic() + 30
    while not any(run.status is RunStatus.COMPLETED for run in store.list_runs(limit=100)):
        assert time.monotonic() < deadline, "the first worker never completed a run"
        time.sleep(0.05)
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()
    interrupted = [run.run_id for run in store.list_runs(limit=100) if run.status is RunStatus.RUNNING]
    # killed mid-run holding one — or, rarely, between finishing a run and claiming the next
    assert len(interrupted) <= 1
    # Not --until-idle: the killed worker's run only becomes claimable when its lease expires,
    # which no notification announces; the survivors find it on their periodic rescan.
    survivors = [_worker_process(schema_url, owner_env, "--concurrency", "2") for _ in range(2)]
    deadline = time.monotonic() + 60
    while not all(run.status.terminal for run in store.list_runs(limit=100)):
        assert time.monotonic() < deadline, "the survivors did not finish every run"
        time.sleep(0.1)
    for survivor in survivors:
        survivor.send_signal(signal.SIGTERM)  # drain: nothing is left to finish
        _, err = survivor.communicate(timeout=30)
        assert survivor.returncode == 0, err
    owner_env.client.set_faults(delay=0)
    runs = store.list_runs(limit=100)
    assert len(runs) == 12
    assert [(r.run_id, r.status, r.error) for r in runs if r.status is not RunStatus.COMPLETED] == []
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (24, 0)
    for run_id in interrupted:
        assert store.get_run(run_id).resume_count == 1  # taken over after the lease


# -- the shared conformance suite --------------------------------------------------------------


class TestPostgresConformance(StoreConformance):
    """Every test gets new store objects on the session's database (the suite's ids are unique,
    so one shared database is fine)."""

    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.pg_url = pg_url

    def make_store(self) -> Store:
        return PostgresStore(self.pg_url)


class TestPostgresPerRunClaimConformance(StoreConformance):
    """The same suite with the per-run claim (``?claim=per_run``): candidates read without a
    lock, then taken one by one by run id, as a database sharded by run_id runs it. It must
    behave as the one-statement claim does. The claim statement is all it changes (the rest is
    ``TestPostgresConformance``'s): it runs the tests that claim through ``claim_next``."""

    changes = frozenset({CLAIMS})

    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.url = _with_claim(pg_url, "per_run")

    def make_store(self) -> Store:
        return PostgresStore(self.url)


class TestAsyncPostgresConformance(StoreConformance):
    """The same suite against AsyncPostgresStore, its coroutines run on a private loop."""

    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.pg_url = pg_url

    def make_store(self) -> Store:
        return SyncOverAsync(lambda: AsyncPostgresStore.open(self.pg_url))


# -- the async store, natively ------------------------------------------------------------------


def test_concurrent_async_claim_next_coroutines_never_get_the_same_run(claiming_url: str) -> None:
    async def body() -> None:
        async with AsyncPostgresStore(claiming_url) as store, AsyncPostgresStore(claiming_url) as other:
            workflow = f"wf-{_uid()}"
            mine = {
                (await store.create_run(_new_run(f"r-{_uid()}", None, workflow)))[0].run_id for _ in range(40)
            }

            async def drain(s: AsyncPostgresStore, owner: str) -> list[str]:
                got = []
                while (claim := await s.claim_next(owner, 60_000, [workflow])) is not None:
                    got.append(claim.run_id)
                return got

            # four tasks on one pool, two on another, all on this one loop
            taken = await asyncio.gather(
                *(drain(s, f"w{i}") for i, s in enumerate([store] * 4 + [other] * 2))
            )
            flat = [run_id for got in taken for run_id in got]
            assert sorted(flat) == sorted(mine)
            assert sum(1 for got in taken if got) >= 2  # they did run side by side

    asyncio.run(body())


def test_async_wait_for_work_wakes_every_waiter_on_a_submit_from_another_store(
    pg_url: str, opened: Callable[[str], PostgresStore]
) -> None:
    submitter = opened(pg_url)  # a sync store in another "process", as it were

    async def body() -> None:
        async with AsyncPostgresStore(pg_url) as waiter:
            await waiter.wait_for_work(0.01)  # LISTEN; drop old news
            loop = asyncio.get_running_loop()
            started = loop.time()
            waits = [asyncio.create_task(waiter.wait_for_work(10)) for _ in range(3)]
            await asyncio.sleep(0.1)
            assert not any(w.done() for w in waits)
            submitted = loop.time()
            await asyncio.to_thread(submitter.create_run, _new_run(f"r-{_uid()}", None))
            await asyncio.wait_for(asyncio.gather(*waits), 5)
            assert loop.time() - submitted < 1.0
            # the loop stayed free while they waited: this task ran its sleep on time
            assert submitted - started < 0.5
            # ... and a wait with no news waits out its timeout
            quiet = loop.time()
            await waiter.wait_for_work(0.3)
            assert loop.time() - quiet >= 0.25

    asyncio.run(body())


def test_async_wait_for_work_wakes_on_a_release_by_an_async_store(pg_url: str) -> None:
    async def body() -> None:
        async with AsyncPostgresStore(pg_url) as waiter, AsyncPostgresStore(pg_url) as holder:
            _, claim = await holder.create_run(_new_run(f"r-{_uid()}", "worker-a"))
            assert claim is not None
            await waiter.wait_for_work(0.01)
            wait = asyncio.create_task(waiter.wait_for_work(10))
            await asyncio.sleep(0.05)
            await holder.release_run(claim)
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(wait, 5)
            assert asyncio.get_running_loop().time() - started < 1.0

    asyncio.run(body())


def test_an_async_worker_loses_ownership_after_a_takeover(pg_url: str) -> None:
    async def body() -> None:
        async with AsyncPostgresStore(pg_url) as old_store, AsyncPostgresStore(pg_url) as new_store:
            run, old = await old_store.create_run(_new_run(f"r-{_uid()}", "worker-a", lease_ms=50))
            assert old is not None
            await old_store.record_step(old, _step(run.run_id, "s1"))
            await asyncio.sleep(0.1)  # the lease is over
            moved = await new_store.get_run(run.run_id)
            new = await new_store.claim_run(run.run_id, moved.state_revision, "worker-b", 60_000)
            assert new is not None
            assert new.fence == old.fence + 1
            for write in (
                old_store.record_step(old, _step(run.run_id, "late")),
                old_store.renew_lease(old),
                old_store.finish_run(old, RunStatus.COMPLETED, result=1),
            ):
                with pytest.raises(sp.LostOwnership) as lost:
                    await write
                assert (lost.value.run_id, lost.value.fence) == (run.run_id, old.fence)
            ledger = await new_store.load_ledger(run.run_id)
            assert "late" not in ledger.steps
            assert (ledger.run.owner, ledger.run.status) == ("worker-b", RunStatus.RUNNING)
            await new_store.record_step(new, _step(run.run_id, "s2"))  # the new owner goes on

    asyncio.run(body())


def test_async_driver_errors_become_store_errors_with_the_cause_kept(pg_url: str) -> None:
    async def body() -> None:
        async with AsyncPostgresStore(pg_url) as store:
            run, claim = await store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
            assert claim is not None
            payload = b"{}"
            op = _operation(run.run_id, payload)
            await store.prepare_effect(claim, op, payload)
            before = await store.get_run(run.run_id)
            with pytest.raises(sp.StoreError) as error:
                await store.prepare_effect(claim, op, payload)
            assert isinstance(error.value.__cause__, psycopg.errors.UniqueViolation)
            assert await store.get_run(run.run_id) == before

    asyncio.run(body())


def test_async_store_migrates_a_new_schema_and_refuses_a_newer_one(
    schema_url: str, admin: psycopg.Connection[Any]
) -> None:
    async def body() -> None:
        store = await AsyncPostgresStore.open(schema_url)
        assert await store.schema_version() == len(load_migrations("postgres"))
        await store.close()
        table = sql.SQL("{}.safepoint_schema_version").format(
            sql.Identifier(schema_url.rsplit("schema=", 1)[1])
        )
        admin.execute(sql.SQL("INSERT INTO {} VALUES (99, '0099_x.sql', 'c', 0)").format(table))
        with pytest.raises(SchemaTooNew):
            await AsyncPostgresStore.open(schema_url)

    asyncio.run(body())


def test_async_store_opening_errors(pg_url: str) -> None:
    async def body() -> None:
        with pytest.raises(sp.StoreUnavailable) as error:
            await AsyncPostgresStore.open("postgresql://postgres:hunter2@127.0.0.1:1/x")
        assert "hunter2" not in str(error.value)
        assert isinstance(error.value.__cause__, psycopg.OperationalError)
        with pytest.raises(InvalidStoreURL):
            AsyncPostgresStore(f"{pg_url}?durability=never")
        with pytest.raises(sp.UsageError):
            await AsyncPostgresStore(pg_url).get_run("never-opened")
        with pytest.raises(InvalidStoreURL) as invalid:
            await open_async_store("sqlite:///ledger.db")
        assert "open_store" in str(invalid.value)
        store = await open_async_store(_param(pg_url, durability="power_loss"))
        try:
            assert isinstance(store, AsyncPostgresStore)
            assert store.durability is Durability.POWER_LOSS
        finally:
            await store.close()

    asyncio.run(body())


def test_async_connections_killed_by_the_server_are_replaced(
    pg_url: str,
    admin: psycopg.Connection[Any],
    opened: Callable[[str], PostgresStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = f"sp-async-victim-{_uid()}"
    submitter = opened(pg_url)

    async def body() -> None:
        async with AsyncPostgresStore(_param(pg_url, application_name=app)) as store:
            run, _ = await store.create_run(_new_run(f"r-{_uid()}", None))
            await store.wait_for_work(0.01)  # open the listener too
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (app,),
            ).fetchone()
            assert killed is not None
            assert killed[0] >= 2
            assert await store.get_run(run.run_id) == run  # the pool's check caught it
            await asyncio.sleep(0.1)  # the reader notices its connection is gone
            assert "stopped listening for work" in caplog.text
            await store.wait_for_work(0.2)  # reconnects; any news of the kill settles here
            wait = asyncio.create_task(store.wait_for_work(10))
            await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            await asyncio.to_thread(submitter.create_run, _new_run(f"r-{_uid()}", None))
            await asyncio.wait_for(wait, 5)
            assert asyncio.get_running_loop().time() - started < 1.0

    asyncio.run(body())


def test_async_sessions_the_server_ended_cost_the_next_read_and_write_nothing(
    pg_url: str, admin: psycopg.Connection[Any]
) -> None:
    app = f"sp-async-idle-{_uid()}"

    async def body() -> None:
        async with AsyncPostgresStore(_param(pg_url, application_name=app)) as store:
            run, claim = await store.create_run(_new_run(f"r-{_uid()}", "worker-a"))
            assert claim is not None
            await store.record_step(claim, _step(run.run_id, "before"))
            assert _terminate(admin, app) >= 1
            assert (await store.get_run(run.run_id)).owner == "worker-a"
            assert _terminate(admin, app) >= 1
            await store.record_step(claim, _step(run.run_id, "after"))
            assert set((await store.load_ledger(run.run_id)).steps) == {"before", "after"}
            blocker = _lock_run(pg_url, run.run_id)  # a write in flight: never sent again
            write = asyncio.create_task(store.record_step(claim, _step(run.run_id, "lost")))
            await asyncio.to_thread(_wait_until_blocked, admin, app)
            assert _terminate(admin, app, waiting=True) == 1
            blocker.commit()
            blocker.close()
            with pytest.raises(sp.StoreUnavailable):
                await write
            assert "lost" not in (await store.load_ledger(run.run_id)).steps
            with psycopg.connect(pg_url) as locker:  # a read in flight: read again
                locker.execute("LOCK TABLE safepoint_runs IN ACCESS EXCLUSIVE MODE")
                read = asyncio.create_task(store.get_run(run.run_id))
                await asyncio.to_thread(_wait_until_blocked, admin, app)
                assert _terminate(admin, app, waiting=True) == 1
                locker.rollback()
            assert (await read).owner == "worker-a"

    asyncio.run(body())
