"""Each dialect's ``schema.sql`` is exactly what applying every migration leaves (compared as a
normalised dump of the catalog: tables, columns, constraints, indexes, functions), so that a
migration that drifts from it — or a change made there and in no migration — fails here; no
CHECK lists the values of an enum; migration 1 stays the text every ledger recorded; a later
migration upgrades a ledger in place, and a build without it refuses that ledger; and a ledger
made by the builds from before the migrations were squashed is refused, saying what to do, with
nothing changed."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
import safepoint.storage.migrations
from safepoint.errors import MigrationMismatch, SchemaTooNew
from safepoint.storage.migrations import INITIAL, Migration, load_migrations
from safepoint.storage.sqlite.connection import _split_statements


def _schema_sql(dialect: str) -> str:
    return (resources.files("safepoint.storage") / "sql" / dialect / "schema.sql").read_text()


# -- SQLite: sqlite_master and the pragmas --------------------------------------------------------


def _folded(sql: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


def _checks(sql: str) -> list[str]:
    """The CHECK constraints of a CREATE TABLE (no pragma lists them), white space folded."""
    text, found, at = _folded(sql), [], 0
    while match := re.compile(r"\bCHECK\s*\(", re.IGNORECASE).search(text, at):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        found.append(re.sub(r"\(\s+|\s+\)", lambda m: m.group().strip(), text[match.end() : end]))
        at = end
    return sorted(found)


def sqlite_dump(conn: sqlite3.Connection) -> dict[str, Any]:
    dump: dict[str, Any] = {}
    for kind, name, table, sql in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        " AND name <> 'safepoint_schema_version' ORDER BY name"
    ).fetchall():
        entry: dict[str, Any] = {"type": kind, "table": table}
        if kind == "table":
            upper = _folded(sql).upper()
            entry.update(
                columns=[tuple(r)[1:] for r in conn.execute(f"PRAGMA table_xinfo({name})")],
                foreign_keys=sorted(tuple(r)[2:] for r in conn.execute(f"PRAGMA foreign_key_list({name})")),
                checks=_checks(sql),
                without_rowid="WITHOUT ROWID" in upper,
                autoincrement="AUTOINCREMENT" in upper,
            )
        elif kind == "index":
            entry.update(
                columns=[tuple(r)[1:] for r in conn.execute(f"PRAGMA index_xinfo({name})")],
                sql=_folded(sql) if sql else None,
            )
        else:
            entry["sql"] = _folded(sql)
        dump[name] = entry
    return dump


def _sqlite_from_schema(path: Path, text: str) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        for statement in _split_statements(text):
            conn.execute(statement)
        return sqlite_dump(conn)
    finally:
        conn.close()


def test_the_sqlite_migrations_leave_exactly_schema_sql(tmp_path: Path) -> None:
    sp.open_store(f"sqlite:///{tmp_path / 'migrated.db'}").close()
    conn = sqlite3.connect(tmp_path / "migrated.db")
    try:
        migrated = sqlite_dump(conn)
    finally:
        conn.close()
    assert migrated == _sqlite_from_schema(tmp_path / "schema.db", _schema_sql("sqlite"))
    assert {
        "safepoint_runs",
        "safepoint_steps",
        "safepoint_operations",
        "safepoint_events",
        "safepoint_artifacts",
        "safepoint_attempts",
        "safepoint_approvals",
        "safepoint_ledger",
    } <= set(migrated)
    # no CHECK lists an enum's values (the reads refuse a value they do not know): one CHECK
    checks = {name: entry["checks"] for name, entry in migrated.items() if entry.get("checks")}
    assert checks == {"safepoint_ledger": ["singleton = 1"]}


def test_the_sqlite_comparison_sees_a_drift(tmp_path: Path) -> None:
    """The dump is fine enough to fail a drift: a column, a default, a CHECK, an index."""
    text = _schema_sql("sqlite")
    base = _sqlite_from_schema(tmp_path / "base.db", text)
    drifts = [
        text.replace("    successor_run_id     TEXT,\n", "    successor_run_id     INTEGER,\n"),
        text.replace("attempt       INTEGER NOT NULL DEFAULT 1", "attempt INTEGER NOT NULL"),
        text.replace("CHECK (singleton = 1)", "CHECK (singleton >= 1)"),
        text.replace("ON safepoint_runs (status, updated_at)", "ON safepoint_runs (status)"),
        text.replace(" OR status = 'cancelled')", ")"),
    ]
    for number, drifted in enumerate(drifts):
        assert drifted != text
        assert _sqlite_from_schema(tmp_path / f"drift{number}.db", drifted) != base, number


# -- PostgreSQL: the catalog, through information_schema, pg_constraint, pg_indexes, pg_proc ----

_PG_DUMP = {
    "columns": "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
    " column_default, is_identity, identity_generation"
    " FROM information_schema.columns"
    " WHERE table_schema = %(s)s AND table_name <> 'safepoint_schema_version'"
    " ORDER BY table_name, ordinal_position",
    "constraints": "SELECT c.relname, k.conname, k.contype,"
    " replace(pg_get_constraintdef(k.oid), %(s)s || '.', '')"
    " FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %(s)s AND c.relname <> 'safepoint_schema_version'"
    " ORDER BY 1, 2",
    "indexes": "SELECT tablename, indexname, replace(indexdef, %(s)s || '.', '')"
    " FROM pg_indexes WHERE schemaname = %(s)s"
    " AND tablename <> 'safepoint_schema_version' ORDER BY 1, 2",
    "functions": "SELECT p.proname, replace(pg_get_functiondef(p.oid), %(s)s || '.', '')"
    " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = %(s)s ORDER BY 1",
}


def postgres_dump(conn: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        part: [tuple(row) for row in conn.execute(query, {"s": schema}).fetchall()]
        for part, query in _PG_DUMP.items()
    }


@pytest.fixture
def pg_admin(pg_url: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _pg_schema(conn: Any, text: str | None = None) -> str:
    """A new schema of this test's own — with ``text`` executed in it."""
    from psycopg import sql

    name = f"schema_{uuid.uuid4().hex[:12]}"
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    if text is not None:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
        conn.execute(text)
        conn.execute("RESET search_path")
    return name


def _drop(conn: Any, *schemas: str) -> None:
    from psycopg import sql

    for name in schemas:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_the_postgres_migrations_leave_exactly_schema_sql(pg_url: str, pg_admin: Any) -> None:
    migrated = f"migrated_{uuid.uuid4().hex[:12]}"
    sp.open_store(f"{pg_url}?schema={migrated}").close()
    described = _pg_schema(pg_admin, _schema_sql("postgres"))
    try:
        dump = postgres_dump(pg_admin, migrated)
        assert dump == postgres_dump(pg_admin, described)
        assert {row[0] for row in dump["columns"]} >= {"safepoint_runs", "safepoint_ledger"}
        # no CHECK lists an enum's values (the reads refuse a value they do not know): one CHECK
        assert [row for row in dump["constraints"] if row[2] == "c"] == [
            ("safepoint_ledger", "safepoint_ledger_singleton_check", "c", "CHECK ((singleton = 1))")
        ]
    finally:
        _drop(pg_admin, migrated, described)


def test_the_postgres_comparison_sees_a_drift(pg_admin: Any) -> None:
    text = _schema_sql("postgres")
    base = _pg_schema(pg_admin, text)
    drifts = [
        text.replace("    successor_run_id     TEXT,\n", "    successor_run_id     BIGINT,\n"),
        text.replace("CHECK (singleton = 1)", "CHECK (singleton >= 1)"),
        text.replace("    WHERE status IN ('pending', 'running');", ";"),
        text.replace("extract(epoch FROM clock_timestamp())", "extract(epoch FROM now())"),
    ]
    made = []
    try:
        for drifted in drifts:
            assert drifted != text
            made.append(_pg_schema(pg_admin, drifted))
            assert postgres_dump(pg_admin, made[-1]) != postgres_dump(pg_admin, base)
    finally:
        _drop(pg_admin, base, *made)


# -- migration 1, and the ones after it ---------------------------------------------------------

# Migration 1's checksum, as every ledger records it: while no later migration ships, the
# checksum of schema.sql (safepoint/storage/migrations.py says why, and what to do instead).
_INITIAL = {
    "sqlite": "10073c2dcd8a78399d324b8761947d9726436e9c46c64f918bfd45c434b88a75",
    "postgres": "1a255c9bef3ccb8d774ea2cc38a84714c5fbe68b01a4e0473075fccb328d54e0",
}


def test_migration_1_is_the_text_every_ledger_recorded() -> None:
    for dialect, checksum in _INITIAL.items():
        first = load_migrations(dialect)[0]
        assert (first.version, first.name) == (1, INITIAL)
        assert first.checksum == checksum, (
            f"migration 1 of {dialect} changed, and every ledger recorded the one before: while it"
            " is schema.sql, leave schema.sql as it was, copy it to migrations/0001_initial.sql and"
            " make the change as migration 0002 (safepoint/storage/migrations.py); before a"
            " release, a squash pins the new checksum here and refuses the old one"
            " (_BEFORE_RELEASE_FIRST)"
        )


# A later migration, made up: a column of the runs filled from what they hold, and its index.
# On SQLite it first rebuilds a table others refer to (the operations, which approvals
# reference) the way SQLite changes a constraint: the store migrates with foreign keys off and
# checks them before it commits.
_NOTE = (
    "ALTER TABLE safepoint_runs ADD COLUMN note TEXT",
    "UPDATE safepoint_runs SET note = 'was ' || status",
    "CREATE INDEX safepoint_runs_note ON safepoint_runs (note)",
)


def _select(store_url: str, query: str) -> list[tuple[Any, ...]]:
    """The rows of ``query`` in the ledger at ``store_url``, read behind the store's back."""
    if store_url.startswith("sqlite"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            return [tuple(row) for row in conn.execute(query)]
        finally:
            conn.close()
    import psycopg
    from psycopg import sql

    base, _, schema = store_url.partition("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        return [tuple(row) for row in conn.execute(query)]  # type: ignore[arg-type]


def _second_migration(store_url: str) -> str:
    statements = list(_NOTE)
    if store_url.startswith("sqlite"):
        table, *indexes = (
            text
            for (text,) in _select(
                store_url,
                "SELECT sql FROM sqlite_master WHERE tbl_name = 'safepoint_operations'"
                " AND sql IS NOT NULL ORDER BY type = 'index', name",
            )
        )
        statements[:0] = [
            table.replace("safepoint_operations (", "safepoint_operations_next (", 1),
            "INSERT INTO safepoint_operations_next SELECT * FROM safepoint_operations",
            "DROP TABLE safepoint_operations",
            "ALTER TABLE safepoint_operations_next RENAME TO safepoint_operations",
            *indexes,
        ]
    return "".join(f"{statement};\n" for statement in statements)


_local = sp.Effect("schema.local", execute=lambda payload, key: {"sent": payload["n"]})


@sp.workflow("schema.upgraded")
def _gated(run: sp.Run) -> Any:
    n = run.pure("n", lambda: 1)
    return run.effect("send", _local, payload={"n": n}, approval=True)


def test_a_later_migration_upgrades_a_ledger_in_place_and_a_build_without_it_refuses_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger made by migration 1, holding a run that waits with an approval given, is opened
    by a build that ships a migration 2: it is applied once and recorded with its checksum, the
    rows and the ledger's identity are kept, and the run goes on. A build that ships migration 1
    alone then refuses the ledger (``SchemaTooNew``) and changes nothing."""
    dialect = "sqlite" if store_url.startswith("sqlite") else "postgres"
    made = sp.open_store(store_url)
    with pytest.raises(sp.AwaitingApproval):
        sp.start(made, _gated, run_id="r")
    approval = sp.approve(made, "r", "send", by="ana")
    identity = made.identity
    made.close()
    [first] = load_migrations(dialect)
    second = Migration(2, "0002_note.sql", _second_migration(store_url))
    versions = "SELECT version, name, checksum FROM safepoint_schema_version ORDER BY version"

    with monkeypatch.context() as later:
        later.setattr(safepoint.storage.migrations, "load_migrations", lambda _: [first, second])
        upgraded = sp.open_store(store_url)
        try:
            assert upgraded.schema_version() == 2
            assert upgraded.identity == identity
            assert upgraded.approvals("r") == [approval]
            assert sp.resume(upgraded, "r") == {"sent": 1}
        finally:
            upgraded.close()
        sp.open_store(store_url).close()  # applies nothing more
    recorded = _select(store_url, versions)
    assert recorded == [(1, INITIAL, first.checksum), (2, second.name, second.checksum)]
    assert _select(store_url, "SELECT run_id, status, note FROM safepoint_runs") == [
        ("r", "completed", "was pending")  # approved: released to a worker
    ]

    with pytest.raises(SchemaTooNew) as newer:
        sp.open_store(store_url)
    assert (newer.value.found, newer.value.known) == (2, 1)
    assert _select(store_url, versions) == recorded


# -- a ledger of the builds before 0.1.0 --------------------------------------------------------

# What those builds recorded. Before the first squash: nine migrations (their checksums do not
# matter: any of these names says where the ledger comes from). Between the two squashes: a
# migration 1 whose checksum says so, whatever followed it.
_SQUASHED = {
    "squash-1": [
        (1, "0001_initial.sql", "then"),
        (2, "0002_resume_budget.sql", "then"),
        (3, "0003_cancellation.sql", "then"),
        (4, "0004_workflow_fingerprint.sql", "then"),
        (5, "0005_limits.sql", "then"),
        (6, "0006_approvals.sql", "then"),
        (7, "0007_history.sql", "then"),
        (8, "0008_approval_revocation.sql", "then"),
        (9, "0009_ledger_identity.sql", "then"),
    ],
    "squash-2-sqlite": [
        (1, "0001_initial.sql", "248d3681efe596cd9214e4caec94fc6b765336d26e3503efd4989bc8c4fc41a3")
    ],
    "squash-2-postgres": [
        (1, "0001_initial.sql", "3b6da540e53835a0eaaf1fae19dd46c96888867aed4c26b6e4f551e513f1c417")
    ],
}


@pytest.mark.parametrize("build", ["squash-1", "squash-2-sqlite"])
def test_a_sqlite_ledger_of_a_build_before_the_release_is_refused_with_the_fix(
    tmp_path: Path, build: str
) -> None:
    path = tmp_path / "dev.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE safepoint_schema_version (version INTEGER PRIMARY KEY,"
            " name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)"
        )
        conn.executemany("INSERT INTO safepoint_schema_version VALUES (?, ?, ?, 0)", _SQUASHED[build])
    for _ in range(2):  # and again: nothing was changed by the first refusal
        with pytest.raises(MigrationMismatch) as error:
            sp.open_store(f"sqlite:///{path}")
        assert error.value.version == 1
        assert "before safepoint 0.1.0" in str(error.value)
        assert "move the file aside" in error.value.fix
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == [
            ("safepoint_schema_version",)
        ]
        assert conn.execute("SELECT count(*) FROM safepoint_schema_version").fetchone() == (
            len(_SQUASHED[build]),
        )


@pytest.mark.parametrize("build", ["squash-1", "squash-2-postgres"])
def test_a_postgres_ledger_of_a_build_before_the_release_is_refused_with_the_fix(
    pg_url: str, pg_admin: Any, build: str
) -> None:
    from psycopg import sql

    schema = _pg_schema(pg_admin)
    table = sql.SQL("{}.safepoint_schema_version").format(sql.Identifier(schema))
    pg_admin.execute(
        sql.SQL(
            "CREATE TABLE {} (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " checksum TEXT NOT NULL, applied_at BIGINT NOT NULL)"
        ).format(table)
    )
    for row in _SQUASHED[build]:
        pg_admin.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, 0)").format(table), row)
    try:
        with pytest.raises(MigrationMismatch) as error:
            sp.open_store(f"{pg_url}?schema={schema}")
        assert error.value.version == 1
        assert "before safepoint 0.1.0" in str(error.value)
        assert "DROP SCHEMA" in error.value.fix
        assert pg_admin.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (
            len(_SQUASHED[build]),
        )
        tables = pg_admin.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchone()
        assert tables == (1,)
    finally:
        _drop(pg_admin, schema)


# One constraint change in an ALTER TABLE, and named: Citus passes a migration's DDL on to every
# shard of a distributed ledger, and refuses "ADD CONSTRAINT command with other subcommands".
_CONSTRAINT_CHANGE = re.compile(r"\b(ADD|DROP|ALTER|VALIDATE|RENAME)\s+CONSTRAINT\b", re.IGNORECASE)
_UNNAMED = re.compile(r"\bADD\s+(PRIMARY\s+KEY|UNIQUE|CHECK|FOREIGN\s+KEY)\b", re.IGNORECASE)


def distributed_ddl_problems(migration_sql: str) -> list[str]:
    """What in a PostgreSQL migration a distributed ledger (Citus) would refuse."""
    problems = []
    for statement in (part.strip() for part in migration_sql.split(";")):
        if not re.match(r"ALTER\s+TABLE\b", statement, re.IGNORECASE):
            continue
        head = " ".join(statement.split())[:80]
        if len(_CONSTRAINT_CHANGE.findall(statement)) > 1:
            problems.append(f"more than one constraint change in one ALTER TABLE: {head}")
        if _UNNAMED.search(statement):
            problems.append(f"a constraint added without a name (ADD CONSTRAINT name ...): {head}")
    return problems


def test_every_postgres_migration_runs_on_a_distributed_ledger() -> None:
    """Every migration after the first changes one constraint per ALTER TABLE, each named."""
    later = [m for m in load_migrations("postgres") if m.version > 1]
    problems = [f"{m.name}: {problem}" for m in later for problem in distributed_ddl_problems(m.sql)]
    assert not problems, problems


def test_the_rule_for_distributed_migrations_catches_what_citus_refuses() -> None:
    assert distributed_ddl_problems(
        "ALTER TABLE t ADD CONSTRAINT a CHECK (x > 0), ADD CONSTRAINT b CHECK (y > 0);"
    )
    assert distributed_ddl_problems("ALTER TABLE t ADD UNIQUE (x);")
    assert not distributed_ddl_problems(
        "ALTER TABLE t ADD CONSTRAINT a CHECK (x > 0);\nALTER TABLE t ADD CONSTRAINT b CHECK (y > 0);"
        "\nALTER TABLE t ADD COLUMN z INTEGER, ADD COLUMN w TEXT;"
    )


def test_a_migration_that_ships_is_numbered_and_read_as_written() -> None:
    for dialect in ("sqlite", "postgres"):
        shipped = load_migrations(dialect)
        assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
        assert shipped[0].name == "0001_initial.sql"
        assert all(len(m.checksum) == 64 for m in shipped)


def test_migration_1_is_schema_sql_until_a_copy_of_it_ships_beside_a_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arrangement a migration 2 will meet (safepoint/storage/migrations.py): with no file
    in migrations/, migration 1 is schema.sql; a 0002 with no 0001 beside it is refused, saying
    what to do; with both, migration 1 is the copy and schema.sql is migration 1 no more."""
    home = tmp_path / "sql" / "sqlite"
    (home / "migrations").mkdir(parents=True)
    (home / "schema.sql").write_text("CREATE TABLE t (a TEXT, b TEXT);\n")
    monkeypatch.setattr(safepoint.storage.migrations.resources, "files", lambda _: tmp_path)
    assert load_migrations("sqlite") == [Migration(1, INITIAL, "CREATE TABLE t (a TEXT, b TEXT);\n")]
    (home / "migrations" / "0002_b.sql").write_text("ALTER TABLE t ADD COLUMN b TEXT;\n")
    with pytest.raises(RuntimeError, match=r"copy schema\.sql as ledgers recorded it to migrations/0001"):
        load_migrations("sqlite")
    (home / "migrations" / INITIAL).write_text("CREATE TABLE t (a TEXT);\n")
    assert [(m.version, m.name, m.sql) for m in load_migrations("sqlite")] == [
        (1, INITIAL, "CREATE TABLE t (a TEXT);\n"),
        (2, "0002_b.sql", "ALTER TABLE t ADD COLUMN b TEXT;\n"),
    ]


def test_every_named_query_is_run_and_every_query_run_is_named() -> None:
    """Queries are named after the store methods that run them: each dialect's queries.sql
    holds exactly the names its store (and the plans both share) asks for."""
    from safepoint.storage.plans import load_queries

    storage = Path(sp.__file__).parent / "storage"

    def asked(*paths: Path) -> set[str]:  # SQL["name"], _q("name", …), self.q("name", …), q(…)
        pattern = re.compile(r'(?:SQL\[|\b_?q\(|self\.q\()\s*"([a-z_]+)"')
        return {name for path in paths for name in pattern.findall(path.read_text())}

    def mentioned(*paths: Path) -> set[str]:  # any name in quotes (a fenced statement's, …)
        return {name for path in paths for name in re.findall(r'"([a-z_]+)"', path.read_text())}

    for dialect in ("sqlite", "postgres"):
        named = set(load_queries(dialect))
        # the plans both dialects share (storage/*.py: the reads, forks, retries …) and the dialect's
        code = [*sorted(storage.glob("*.py")), *sorted((storage / dialect).glob("*.py"))]
        assert asked(*code) - named == set(), f"{dialect}: asked for but not in queries.sql"
        assert named - mentioned(*code) == set(), f"{dialect}: in queries.sql but never run"


def test_every_routed_statement_stands_for_a_named_one_and_fences_first() -> None:
    """``sql/postgres/citus.sql``: each routed form stands for a statement of queries.sql, takes
    the run's id first (Citus carries the call out on that run's node), uses only the
    parameters it declares, writes only the tables it asked ``safepoint_local_tables`` for, and
    writes nothing before the fence (an UPDATE of the run's row)."""
    from safepoint.storage.postgres.connection import QUERIES
    from safepoint.storage.postgres.routed import ledger_functions, routed_statements

    routed = routed_statements(QUERIES)
    assert routed, "citus.sql gives no routed statement"
    assert {f.name for f in ledger_functions() if not f.routed} == {"local_tables"}
    for form in routed.values():
        assert form.params[0] == ("run_id", "text"), form.name
        declared = {f"p_{name}" for name, _ in form.params}
        used = set(re.findall(r"\bp_\w+", form.body))
        assert used <= declared, f"{form.name}: undeclared {sorted(used - declared)}"
        # SELECT t[1], t[2] INTO runs, steps FROM safepoint_local_tables(p_run_id, 'a', 'b')
        asked = re.search(
            r"SELECT (.*?) INTO (.*?)\s+FROM safepoint_local_tables\(p_run_id, (.*?)\)", form.body
        )
        assert asked, f"{form.name} does not ask safepoint_local_tables for its tables"
        names = [name.strip() for name in asked.group(2).split(",")]
        tables = re.findall(r"'(\w+)'", asked.group(3))
        assert len(names) == len(tables), form.name
        table_of = dict(zip(names, tables, strict=True))
        # each write: EXECUTE format($q$UPDATE %s …$q$, runs)
        writes = [
            (verb, table_of.get(variable, variable))
            for verb, variable in re.findall(
                r"\$q\$\s*(INSERT INTO|UPDATE|DELETE FROM) %s.*?\$q\$,\s*(\w+)\)", form.body, flags=re.DOTALL
            )
        ]
        assert writes, form.name
        assert set(table for _, table in writes) <= set(tables), f"{form.name} writes {writes}"
        assert writes[0] == ("UPDATE", "safepoint_runs"), f"{form.name}: the fence first, not {writes[0]}"
        # an event appended on the run's node would take an id of that node's range (citus.sql)
        assert "safepoint_events" not in tables, f"{form.name} appends an event"
