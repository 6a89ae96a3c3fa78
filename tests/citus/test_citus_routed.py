"""The routed form of a step's write on a Citus cluster: carried out on the run's node, it
writes the run's shards as PostgreSQL tables (``safepoint_local_tables``); anywhere else, and for
a role that does not own the ledger, it writes through the distributed tables, and the run's
steps are recorded all the same."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

import psycopg
import pytest
from psycopg import sql

import safepoint as sp

CITUS = os.environ.get("SAFEPOINT_TEST_CITUS", "")


@sp.workflow("citus.routed.reads")
def _reads(run: sp.Run, n: int) -> int:
    return sum(run.read(f"r{i}", lambda i=i: i) for i in range(n))


def _schema(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query))["schema"]


def _node_url(port: int) -> str:
    parts = urlsplit(CITUS)
    return parts._replace(netloc=f"{parts.username}@{parts.hostname}:{port}", query="").geturl()


def _local_tables(conn: psycopg.Connection, run_id: str) -> list[str]:
    row = conn.execute(
        "SELECT safepoint_local_tables(%s::text, 'safepoint_runs', 'safepoint_steps')", (run_id,)
    ).fetchone()
    assert row is not None
    return list(row[0])


def test_on_the_runs_node_the_shards_are_written_elsewhere_the_tables(citus_url: str) -> None:
    store = sp.open_store(citus_url)
    try:
        assert sp.start(store, _reads, 5, run_id="routed-1") == 10
    finally:
        store.close()
    schema = _schema(citus_url)
    with psycopg.connect(CITUS, autocommit=True) as coordinator:
        coordinator.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        assert _local_tables(coordinator, "routed-1") == ["safepoint_runs", "safepoint_steps"]
        holder = coordinator.execute(
            "SELECT nodeport FROM citus_shards WHERE table_name = 'safepoint_runs'::regclass"
            " AND shardid = get_shard_id_for_distribution_column('safepoint_runs', %s::text)",
            ("routed-1",),
        ).fetchone()
        ports = [
            row[0] for row in coordinator.execute("SELECT node_port FROM citus_get_active_worker_nodes()")
        ]
    assert holder is not None
    assert len(ports) >= 2
    for port in ports:
        with psycopg.connect(_node_url(port), autocommit=True) as node:
            node.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            tables = _local_tables(node, "routed-1")
            if port == holder[0]:  # its shards, by their names in the schema
                assert [t.split(".")[-1].rsplit("_", 1)[0] for t in tables] == [
                    "safepoint_runs",
                    "safepoint_steps",
                ]
                assert all(t.startswith(f"{schema}.") for t in tables)
                steps = node.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(tables[1]))  # the shard itself
                ).fetchone()
                assert steps is not None
                assert steps[0] >= 5
            else:
                assert tables == ["safepoint_runs", "safepoint_steps"]


@pytest.fixture
def app_role(citus_url: str) -> Iterator[str]:
    """A role that may read and write the ledger but does not own it."""
    role, schema = f"sp_app_{uuid.uuid4().hex[:8]}", _schema(citus_url)
    ident = sql.Identifier
    store = sp.open_store(citus_url)  # the ledger made (and distributed) by its owner
    store.close()
    with psycopg.connect(CITUS, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(role)))
        for grant in (
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
        ):
            admin.execute(sql.SQL(grant).format(schema=ident(schema), role=ident(role)))
    yield role
    with psycopg.connect(CITUS, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(ident(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(ident(role)))


def test_a_role_that_does_not_own_the_ledger_writes_through_the_distributed_tables(
    citus_url: str, app_role: str
) -> None:
    parts = urlsplit(citus_url)
    as_app = parts._replace(netloc=f"{app_role}@{parts.hostname}:{parts.port}").geturl()
    store = sp.open_store(as_app)
    try:
        assert sp.start(store, _reads, 5, run_id="routed-app") == 10
        assert len(store.load_ledger("routed-app").steps) == 5
    finally:
        store.close()


def test_a_shard_move_while_a_run_records_its_steps_loses_none(citus_url: str) -> None:
    """The run's shards move to the other node while it records step after step: a write on
    the old node holds the lock the move waits for, one after it is carried out on the new
    node — every step is there, on the node the shards moved to."""
    store = sp.open_store(citus_url)
    steps = 300
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(sp.start(store, _reads, steps, run_id="moved")))
    schema = _schema(citus_url)
    try:
        worker.start()
        with psycopg.connect(CITUS, autocommit=True) as admin:
            admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            begun = "SELECT step_count > 20 FROM safepoint_runs WHERE run_id = 'moved'"
            while admin.execute(begun).fetchone() != (True,):
                time.sleep(0.01)
            placed = admin.execute(
                "SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'safepoint_runs'::regclass"
                " AND shardid = get_shard_id_for_distribution_column('safepoint_runs', 'moved'::text)"
            ).fetchone()
            assert placed is not None
            shard, port = placed
            elsewhere = admin.execute(
                "SELECT node_port FROM citus_get_active_worker_nodes() WHERE node_port <> %s", (port,)
            ).fetchone()
            assert elsewhere is not None
            other = elsewhere[0]
            admin.execute(
                "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,"
                " shard_transfer_mode => 'block_writes')",
                (shard, port, other),
            )
            moved_mid_run = admin.execute(
                "SELECT step_count < %s FROM safepoint_runs WHERE run_id = 'moved'", (steps,)
            ).fetchone() == (True,)
        worker.join(timeout=120)
        assert result == [sum(range(steps))]
        assert len(store.load_ledger("moved").steps) == steps
        assert moved_mid_run, "the run ended before the move: make it longer"
        with psycopg.connect(CITUS, autocommit=True) as admin:
            admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            assert admin.execute(
                "SELECT nodeport FROM citus_shards WHERE shardid = %s", (shard,)
            ).fetchone() == (other,)
    finally:
        worker.join(timeout=120)
        store.close()
