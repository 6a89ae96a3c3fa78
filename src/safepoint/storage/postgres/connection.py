"""What every plan of the PostgreSQL store stands on: the URL's meaning, how driver errors
read, opening (the per-connection settings, migrating), and the fenced statement every worker
write is (``_fenced``; see ``safepoint._rules.fencing``) with the soft limit's warning after it.

The plans are methods of ``PostgresLedger`` (``ledger``), one module per part of the ledger;
the reading plans are every store's (``safepoint.storage.ledger``). Executors carry them out on
a psycopg connection: ``run_plan_on`` (sync) and ``run_plan_on_async``, or on a pooled
connection's own cursor: ``run_plan_with`` and ``run_plan_with_async``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ExecStatus
from psycopg.rows import DictRow, RowMaker, no_result
from psycopg_pool import PoolTimeout

from ..._rules.canonical import dumps
from ..._rules.fencing import fence_holds, refused_write
from ..._rules.history import history_warning, warning_due
from ..._rules.kinds import KINDS
from ...errors import (
    ClaimedInFamily,
    HistoryWarning,
    InvalidStoreURL,
    LostOwnership,
    SafepointError,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from ...types import JSON, Claim, Durability, LedgerIdentity, OperationRecord, StepRecord
from ..base import INLINE_LIMIT
from ..codec import Codec, seal_artifact, seal_text
from ..families import family_holding
from ..ledger import LedgerReads, sealed_event, stored
from ..migrations import Migration, to_apply
from ..plans import Plan, Queries, Row, Stmt, run_plan, run_plan_async
from .routed import Routed, ledger_functions, routed_statements

QUERIES = Queries("postgres")
_q = QUERIES
_OUR_PARAMETERS = ("schema", "durability", "prepare_threshold", "claim", "distributed")
# psycopg's own default, kept because measured: a statement a connection has run this many
# times is prepared on the server (parsed and planned once, then only bound and executed),
# which halves the server's CPU per durable step. ``None``: never, for a connection pooler
# that cannot keep prepared statements between transactions (PgBouncer in transaction pooling
# mode before 1.21, or without max_prepared_statements).
PREPARE_THRESHOLD = 5
# How a worker claims its next run (?claim=): one statement with FOR UPDATE SKIP LOCKED across
# every run, or candidates read without a lock and then taken one by one, each by its run id —
# the form a database sharded by run_id runs (docs/scaling.md)
CLAIMS = ("skip_locked", "per_run")
CLAIM_CANDIDATES = 8  # candidates read at once by the per-run claim
# A ledger whose tables a distributed PostgreSQL shards by run (?distributed=): Citus, each
# table distributed by run_id and co-located with the runs (the family claims by family_id,
# which is a run's id too), the two one-row-per-ledger tables copied to every node.
DISTRIBUTIONS = ("citus",)
CITUS_TABLES = (
    ("safepoint_runs", "run_id"),
    ("safepoint_steps", "run_id"),
    ("safepoint_operations", "run_id"),
    ("safepoint_events", "run_id"),
    ("safepoint_artifacts", "run_id"),
    ("safepoint_attempts", "run_id"),
    ("safepoint_approvals", "run_id"),
    ("safepoint_messages", "run_id"),
    ("safepoint_family_claims", "family_id"),
    ("safepoint_ledger", None),  # a reference table: on every node
    ("safepoint_schema_version", None),
)


# The channel idle workers LISTEN on: the database's, or a ledger's own in a schema of its own —
# NOTIFY reaches the whole database, and ledgers side by side must not wake each other's workers
# (a wake-up for nothing costs a worker a claim, and wake-ups that keep bringing nothing make
# it ask less often). A hash keeps any schema name within a channel name's 63 bytes.
def work_channel(schema: str | None) -> str:
    if schema is None:
        return "safepoint_work"
    return f"safepoint_work_{hashlib.sha256(schema.encode()).hexdigest()[:24]}"


def listen(channel: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


# What an executor translates into StoreError / StoreUnavailable; anything else a plan raises
# (LostOwnership, RunNotFound, ValueError …) rolls the transaction back and passes unchanged.
DRIVER_ERRORS = (PoolTimeout, psycopg.Error, UnicodeError)
# load_ledger's reads: one snapshot of the run, its rows and their artifacts
_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

log = logging.getLogger("safepoint.store")

T = TypeVar("T")
# What a write that marks an operation dispatching returns: the operation as it now stands,
# and the soft limit's warning when the write recorded it.
Dispatched: TypeAlias = tuple[OperationRecord, HistoryWarning | None]


# What says a statement's result holds rows: tuples, or columns (``SELECT;`` has none). The
# test psycopg's ``cursor.description`` makes, without the ``Column`` objects it builds for
# every column on every statement — a fifth of the client's CPU per statement.
_ROWS = frozenset({ExecStatus.TUPLES_OK, ExecStatus.SINGLE_TUPLE, getattr(ExecStatus, "TUPLES_CHUNK", None)})


def returns_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement ``cur`` ran returned rows to fetch (``cursor.description``'s test)."""
    res = cur.pgresult
    return res is not None and (res.nfields > 0 or res.status in _ROWS)


# The row makers of ``dict_rows``, by the names of their columns as the server sent them: a
# store's statements return rows of a few dozen layouts, never many.
_MAKERS: dict[tuple[bytes | None, ...], RowMaker[DictRow]] = {}
_MAX_MAKERS = 256


def dict_rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> RowMaker[DictRow]:
    """psycopg's ``dict_row``, with its row maker made once per layout of columns: rows as
    dicts by column name. ``dict_row`` decodes every column's name and builds a new maker on
    every statement; this takes the names as bytes (one call in C) and finds the maker they
    had last time. Names that are not all ASCII are decoded each time, in the connection's
    encoding, as ``dict_row`` does (an ASCII name reads the same in every client encoding)."""
    res = cursor.pgresult
    if res is None:
        return no_result
    nfields = res.nfields
    if not nfields and res.status not in _ROWS:
        return no_result
    names = tuple(map(res.fname, range(nfields)))
    maker = _MAKERS.get(names)
    if maker is None:
        encoding = cursor.connection.info.encoding
        maker = _row_maker(tuple((name or b"").decode(encoding) for name in names))
        if len(_MAKERS) < _MAX_MAKERS and all((name or b"").isascii() for name in names):
            _MAKERS[names] = maker
    return maker


def _row_maker(names: tuple[str, ...]) -> RowMaker[DictRow]:
    def make(values: Sequence[Any]) -> DictRow:
        return dict(zip(names, values, strict=True))

    return make


def run_plan_on(conn: psycopg.Connection[Any], plan: Plan[T]) -> T:
    """Carry out a plan's statements on ``conn`` (in whatever transaction the caller opened)."""
    return run_plan_with(conn.cursor(), plan)


def run_plan_with(cur: psycopg.Cursor[Any], plan: Plan[T], routed: Routed | None = None) -> T:
    """``run_plan_on`` with every statement on the cursor ``cur`` (a pooled connection's own:
    ``pool.Pooled.plans``); ``routed``: the statements a ledger sharded by run carries out in
    their routed form (``routed``)."""

    def execute(stmt: Stmt) -> list[Row]:
        if routed is not None and isinstance(stmt.text, str) and (form := routed.get(stmt.text)):
            stmt = Stmt(form.call, stmt.params)  # the ledger's function, on the run's node
        cur.execute(stmt.text, stmt.params)
        return cur.fetchall() if returns_rows(cur) else []

    return run_plan(execute, plan)


async def run_plan_on_async(conn: psycopg.AsyncConnection[Any], plan: Plan[T]) -> T:
    """``run_plan_on`` for an async connection."""
    return await run_plan_with_async(conn.cursor(), plan)


async def run_plan_with_async(
    cur: psycopg.AsyncCursor[Any], plan: Plan[T], routed: Routed | None = None
) -> T:
    """``run_plan_with`` for an async cursor."""

    async def execute(stmt: Stmt) -> list[Row]:
        if routed is not None and isinstance(stmt.text, str) and (form := routed.get(stmt.text)):
            stmt = Stmt(form.call, stmt.params)  # the ledger's function, on the run's node
        await cur.execute(stmt.text, stmt.params)
        rows: list[Row] = await cur.fetchall() if returns_rows(cur) else []
        return rows

    return await run_plan_async(execute, plan)


class PostgresBase(LedgerReads):
    """The URL, the executors' shared plumbing, opening, and the fenced statement. Holds no
    connection."""

    identity: LedgerIdentity  # read by ``prepare``, when the store opens

    def __init__(
        self,
        url: str,
        *,
        durability: Durability | str | None = None,
        inline_limit: int = INLINE_LIMIT,
        connect_timeout: float = 5.0,
        codec: Codec | None = None,
        prepare_threshold: int | None = PREPARE_THRESHOLD,
    ) -> None:
        super().__init__(QUERIES, snapshot=_SNAPSHOT, codec=codec)
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {name: query.pop(name) for name in _OUR_PARAMETERS if name in query}
        self.url = redacted(url)
        chosen = durability or ours.get("durability") or Durability.PROCESS_CRASH
        try:
            self.durability = Durability(chosen)
        except ValueError:
            raise InvalidStoreURL(
                self.url, f"unknown durability {chosen!r}; use " + " or ".join(d.value for d in Durability)
            ) from None
        self.distributed = ours.get("distributed") or None
        if self.distributed is not None and self.distributed not in DISTRIBUTIONS:
            raise InvalidStoreURL(
                self.url, f"unknown distributed {self.distributed!r}; use " + " or ".join(DISTRIBUTIONS)
            )
        # what the executors carry out as statements about one run (``routed``)
        self.routed = routed_statements(QUERIES) if self.distributed else None
        # Citus refuses FOR UPDATE across shards: a distributed ledger claims run by run
        self.claim = ours.get("claim") or (CLAIMS[1] if self.distributed else CLAIMS[0])
        if self.claim not in CLAIMS:
            raise InvalidStoreURL(self.url, f"unknown claim {self.claim!r}; use " + " or ".join(CLAIMS))
        if self.distributed and self.claim != "per_run":
            raise InvalidStoreURL(
                self.url,
                f"claim={self.claim} takes a lock across every shard, which {self.distributed} refuses:"
                " leave claim= out (a distributed ledger claims per_run)",
            )
        self.schema = ours.get("schema") or None
        if "schema" in ours and not self.schema:
            raise InvalidStoreURL(self.url, "schema= needs a schema name")
        self.work_channel = work_channel(self.schema)
        self.prepare_threshold = _threshold(self.url, ours.get("prepare_threshold", prepare_threshold))
        libpq_url = urlunsplit(parts._replace(query=urlencode(query)))
        try:
            given = conninfo_to_dict(libpq_url)
        except psycopg.ProgrammingError as exc:
            raise InvalidStoreURL(self.url, reason(exc)) from exc
        defaults: dict[str, str | int] = {
            "connect_timeout": max(1, round(connect_timeout)),
            "application_name": "safepoint",
        }
        self.conninfo = make_conninfo(
            libpq_url, **{key: value for key, value in defaults.items() if key not in given}
        )
        self.inline_limit = inline_limit
        self.pid = os.getpid()

    # -- the executors' shared plumbing --------------------------------------------------------

    def check_process(self) -> None:
        if os.getpid() != self.pid:
            raise StoreError(
                "this PostgreSQL store was opened in a parent process; open a new"
                " store in the child (connections cannot cross a fork)"
            )

    def failure(self, exc: BaseException, pool_timeout: float, pool_size: int) -> StoreError:
        """The StoreError for a driver error raised while running a plan (raise it ``from``
        the original, which is kept as ``__cause__``)."""
        if isinstance(exc, PoolTimeout):
            return StoreUnavailable(
                f"no usable connection to the store at {self.url} within {pool_timeout:g}s"
                f" ({reason(exc)}): the server is down or unreachable, or every one of the"
                f" {pool_size} pooled connections stayed busy; try again once it is back (or"
                " open the store with more connections)",
                url=self.url,
            )
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(
                f"the connection to the store at {self.url} broke during the operation"
                f" ({reason(exc)}); it may or may not have committed — try again once the"
                " server is reachable (the ledger tells which)",
                url=self.url,
            )
        return StoreError(f"the store refused the operation: {reason(exc)}", url=self.url)

    def connect_failure(self, exc: psycopg.Error) -> SafepointError:
        """The error for a connection outside the pool that could not be opened."""
        if isinstance(exc, psycopg.OperationalError):
            return unreachable(self.url, exc)
        return InvalidStoreURL(self.url, reason(exc))

    def setup_failure(self, exc: psycopg.Error) -> StoreError:
        return StoreError(f"cannot prepare a connection to {self.url}: {reason(exc)}", url=self.url)

    def migration_failure(self, exc: psycopg.Error) -> StoreError:
        return StoreError(
            f"cannot migrate the store at {self.url}: {reason(exc)}; check that the schema"
            " exists (or name it with ?schema=, which is created for you) and that this user"
            " may create tables in it, or run `safepoint migrate` as a user who can",
            url=self.url,
        )

    # -- connections and migrations ------------------------------------------------------------

    def configure(self) -> Plan[None]:
        """Per-connection settings: the schema, and the stated durability. (The executor
        commits them unless the connection is in autocommit.)"""
        if self.schema:
            yield Stmt(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if self.durability is Durability.POWER_LOSS:
            yield _q("power_loss_durability")

    def prepare(self, *, create: bool = True) -> Plan[None]:
        """On open, in one transaction on a connection of its own: migrate, and warn when the
        server cannot keep the stated durability. ``create=False``: a schema that holds no
        ledger is refused (``UsageError``) instead of being made one — for tools that look."""
        # The common case — up to date — takes no lock and runs no DDL. Otherwise queue on the
        # advisory lock and look again: in READ COMMITTED each statement sees what concurrent
        # openers committed while this one waited.
        pending = yield from self._to_apply()
        if pending and pending[0].version == 1 and not create:
            where = f"schema {self.schema!r}" if self.schema else "database"
            raise UsageError(
                f"no ledger at {self.url}: the {where} holds no safepoint ledger;"
                " check --store (or SAFEPOINT_URL), or create a ledger there with"
                " `safepoint migrate`"
            )
        if pending:
            yield _q("migration_lock")
            if self.schema:
                yield Stmt(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            yield _q("create_version_table")
            for migration in (yield from self._to_apply()):
                yield Stmt(migration.sql)
                yield _q(
                    "record_migration",
                    version=migration.version,
                    name=migration.name,
                    checksum=migration.checksum,
                )
        if self.distributed:
            yield from self.distribute()
        self.identity = yield from self.read_identity()
        yield from self.check_sealing()
        if self.durability is Durability.POWER_LOSS:
            fsync = yield Stmt("SHOW fsync")
            if fsync and fsync[0]["fsync"] != "on":
                log.warning(
                    "durability=power_loss asked, but the server runs with"
                    " fsync=off: commits will not survive a power loss"
                )

    def distribute(self) -> Plan[None]:
        """Citus: every table of the ledger not yet distributed is distributed (``CITUS_TABLES``),
        in the migrating transaction — so a ledger is created distributed, and one made on
        plain PostgreSQL is distributed by the first open that names ``distributed=citus``
        (``safepoint migrate --distribute``). Later migrations run on the distributed tables:
        Citus passes their DDL on to every shard."""
        done = {row["table_name"] for row in (yield _q("citus_distributed_tables"))}
        for table, column in CITUS_TABLES:
            if table in done:
                continue
            if column is None:
                yield _q("citus_reference_table", table=table)
            else:
                # the runs first, every other table in their colocation group
                yield _q("citus_distribute_table", table=table, column=column)
        # the routed forms and the functions they call, functions of the ledger: made, or
        # made again when this code's differ, and distributed — a routed form with the runs
        # (a call is carried out on the run's node), the others to every node
        for form in ledger_functions():
            found = yield _q("citus_function_body", function=form.function)
            if found and found[0]["body"] == form.source:
                continue
            yield _q("migration_lock")  # one opener at a time makes them
            yield Stmt(form.ddl)
            yield _q(
                "citus_distribute_function" if form.routed else "citus_function_on_every_node",
                signature=form.signature,
            )

    @staticmethod
    def _to_apply() -> Plan[list[Migration]]:
        found = yield _q("version_table_exists")
        applied = (yield _q("applied_migrations")) if found and found[0]["found"] else []
        return to_apply("postgres", [(r["version"], r["name"], r["checksum"]) for r in applied])

    def schema_version(self) -> Plan[int]:
        rows = yield _q("schema_version")
        return int(rows[0]["version"])

    def now(self) -> Plan[int]:
        rows = yield _q("now")
        return int(rows[0]["now"])

    def wake_workers(self, workflow: str) -> Plan[None]:
        yield _q("notify_work", channel=self.work_channel, workflow=workflow)  # idle workers LISTEN

    # -- what the writes share -----------------------------------------------------------------

    def _put_artifact(self, run_id: str, ref: str, data: bytes) -> Plan[None]:
        """Store ``data`` under ``ref``, its digest as the caller computed or checked it, with
        the run it belongs to (the key a database sharded by run_id places it by)."""
        content = self._content(ref, data)
        yield _q("insert_artifact", run_id=run_id, digest=ref, size=len(data), content=content)

    def _content(self, ref: str, data: bytes) -> bytes:
        """An artifact's bytes as they are stored: sealed for its digest when there is a codec."""
        return data if self.codec is None else seal_artifact(self.codec, data, ref)

    def _put_value(self, value: JSON, *place: Any) -> Plan[tuple[str | None, str | None]]:
        """Store a JSON value inline, or as an artifact of its run when it is large: (text, ref)
        — sealed for its ``place`` (table, column, the row's key, which starts with the run id)
        when the store has a codec."""
        text, ref, data = stored(value, self.inline_limit, self.codec, *place)
        if ref is not None and data is not None:  # sealed already
            yield _q("insert_artifact", run_id=place[2], digest=ref, size=len(data), content=data)
        return text, ref

    def _event_params(self, detail: JSON, run_id: str, kind: str) -> Plan[dict[str, Any]]:
        """An event's ``event_id`` and ``detail`` parameters (``ledger.sealed_event``): a detail
        sealed for its row has its id taken from the sequence first (one round trip, on a
        sealed ledger only); any other gets the next id as the statement inserts it."""
        event_id, text = yield from sealed_event(self, detail, run_id, kind)
        return {"event_id": event_id, "detail": text}

    def _sealed(self, value: JSON, *place: Any) -> str | None:
        """A JSON column's text (NULL for None), sealed for ``place`` when the store has a codec."""
        if value is None:
            return None
        return dumps(value) if self.codec is None else seal_text(self.codec, dumps(value), *place)

    def _stored_result(self, run_id: str, step: StepRecord) -> tuple[str | None, str | None, bytes | None]:
        """A step's result as it is stored (``ledger.stored``), sealed for its row."""
        return stored(
            step.result, self.inline_limit, self.codec, "safepoint_steps", "result", run_id, step.step_id
        )

    def _step_params(
        self, run_id: str, step: StepRecord | None, result: str | None, result_ref: str | None
    ) -> dict[str, Any]:
        """A step's columns as statement parameters, its result stored as ``result`` (inline)
        or ``result_ref`` (an artifact)."""
        if step is None:
            return dict.fromkeys(_STEP_PARAMS)
        return {
            "step_id": step.step_id,
            "seq": step.seq,
            "kind": step.kind.value,
            "model_call": KINDS[step.kind].model_call,
            "name": step.name,
            "input_hash": step.input_hash,
            "step_status": step.status.value,
            "result": result,
            "result_ref": result_ref,
            "step_error": None
            if step.error is None
            else self._sealed(step.error, "safepoint_steps", "error", run_id, step.step_id),
            "next_step_id": step.next_step_id,
            "attempt": step.attempt,
            "model_id": step.model_id,
            "prompt_hash": step.prompt_hash,
            "observed_at": step.observed_at,
            "step_operation_id": step.operation_id,
            "tokens": step.tokens,
            "cost": step.cost,
        }

    @staticmethod
    def _fenced(
        claim: Claim,
        query: str,
        /,
        *,
        new_work: bool = True,
        limited: bool = False,
        needs_operation: bool = False,
        claims: bool = False,
        **params: Any,
    ) -> Plan[Row]:
        """Run a fenced statement: its one row. When it matched nothing, why, from the run as
        it now stands (``refused_write``): while the fence holds, ``Cancelled`` or
        ``DeadlineExceeded`` for ``new_work``, ``HistoryLimitReached`` for a write held to the
        history limit (``limited``); else ``LostOwnership``. A statement that writes only with
        its operation (``needs_operation``: ``operation_id`` in ``params``) raises ``_Unfit``
        when nothing else explains it: the caller says what the operation lacked. A dispatch that
        takes its family's claim in the statement (``claims``) raises ``ClaimedInFamily`` when
        another run of the family holds it."""
        # the claim's parameters added to ``params`` (a dict of this call's own), not the two
        # merged into a new one: a step's statement has some twenty parameters
        params.update(run_id=claim.run_id, fence=claim.fence, lease_ms=claim.lease_ms, worker=claim.owner)
        rows = yield Stmt(_q.text[query], params)
        if rows:
            return rows[0]
        if claims:
            held = yield from _family_refusal(claim.run_id, params["operation_id"], params["family_key"])
            if held is not None:
                raise ClaimedInFamily(
                    claim.run_id, params["operation_id"], held["run_id"], held["operation_id"]
                )
        state = yield _q(
            "fence_state",
            run_id=claim.run_id,
            operation_id=params["operation_id"] if needs_operation else None,
        )
        row = state[0] if state else {}
        refused = refused_write(
            claim,
            row.get("fence"),
            row.get("status"),
            row.get("cancel_requested_at"),
            row.get("deadline_at"),
            row.get("now"),
            new_work=new_work,
            limited=limited,
            history=row.get("history"),
            hard_limit=row.get("history_hard_limit"),
        )
        if (
            needs_operation
            and isinstance(refused, LostOwnership)
            and fence_holds(claim, row.get("fence"), row.get("status"))
        ):
            raise _Unfit(bool(row["approval_required"]))
        raise refused

    @staticmethod
    def _history_warning(claim: Claim, row: Row) -> Plan[HistoryWarning | None]:
        """After a fenced write (in its transaction, or in autocommit just after it, fenced
        like it): record the soft limit's warning once it falls due, and return it, for the
        executor to issue once the write committed."""
        if not warning_due(row["history"], row["history_soft_limit"], row["history_warned_at"]):
            return None
        warned = yield _q(
            "record_history_warning", run_id=claim.run_id, fence=claim.fence, worker=claim.owner
        )
        if not warned:
            return None
        return history_warning(
            claim.run_id,
            warned[0]["history"],
            warned[0]["history_soft_limit"],
            warned[0]["history_hard_limit"],
        )


class _Unfit(Exception):
    """A fenced statement that writes only with its operation matched nothing because of the
    operation (the fence holds): the run has none by that id, or not as the statement needs
    it; ``gated``: the operation needs approval."""

    def __init__(self, gated: bool) -> None:
        super().__init__(gated)
        self.gated = gated


def not_dispatchable(claim: Claim, operation_id: str) -> StoreError:
    return StoreError(
        f"operation {operation_id!r} is not in a dispatchable state",
        run_id=claim.run_id,
        operation_id=operation_id,
    )


def _family_refusal(run_id: str, operation_id: str, family_key: str | None) -> Plan[Row | None]:
    """Why a dispatch that takes its family's claim in its own statement wrote nothing, when
    it is the claim: the claim another run of the family holds, sent (its family key, the
    operation's own when the dispatch named none)."""
    if family_key is None:
        rows = yield _q("family_operation", run_id=run_id, operation_id=operation_id)
        family_key = rows[0]["family_key"] if rows else None
    held = (yield from family_holding(_q, run_id, family_key)) if family_key is not None else None
    mine = held is not None and held["run_id"] == run_id and held["operation_id"] == operation_id
    return held if held is not None and held["sent"] and not mine else None


_STEP_PARAMS = (
    "step_id",
    "seq",
    "kind",
    "model_call",
    "name",
    "input_hash",
    "step_status",
    "result",
    "result_ref",
    "step_error",
    "next_step_id",
    "attempt",
    "model_id",
    "prompt_hash",
    "observed_at",
    "step_operation_id",
    "tokens",
    "cost",
)


def _threshold(url: str, given: int | str | None) -> int | None:
    """``prepare_threshold`` as psycopg takes it, from the keyword or the URL's text (``none``:
    never prepare)."""
    if isinstance(given, str):
        text = given.strip().lower()
        if text == "none":
            return None
        if not text.isdigit():
            raise InvalidStoreURL(
                url, f"prepare_threshold={given!r} is not a count: use 0 or more, or none (never prepare)"
            )
        return int(text)
    if given is not None and given < 0:
        raise InvalidStoreURL(
            url, f"prepare_threshold={given} is negative: use 0 or more, or None (never prepare)"
        )
    return given


def _claim(row: Row, owner: str, lease_ms: int) -> Claim:
    return Claim(row["run_id"], owner, row["fence"], row["state_revision"], row["lease_expires_at"], lease_ms)


def redacted(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def reason(exc: BaseException) -> str:
    """A driver message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def unreachable(url: str, exc: BaseException) -> StoreError:
    why = reason(exc)
    return StoreUnavailable(
        f"cannot reach the PostgreSQL store at {url}: {why}; check that the server is"
        " running and that the URL (SAFEPOINT_URL) names the right host, port, database and"
        " user",
        url=url,
    )
