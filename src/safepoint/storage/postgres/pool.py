"""Pooled PostgreSQL connections: proving one alive without a round trip, and which failures
an operation may simply run again. Shared by the sync and the async store.

A durable step is one statement, so a round trip spent on checking the connection before it
doubles the step's cost. Instead, the check on checkout (``Resting.checkout``) looks, without
a round trip, at the connection's socket and at how long it rested:

- the server said something on it while it sat idle: it is going away. An idle session hears
  nothing from the server unless it is being terminated (a restart, ``pg_terminate_backend``,
  an idle timeout), which sends FATAL and closes the socket — discarded, nothing was sent on it;
- it rested longer than ``PROBE_AFTER_S``: a round trip proves it first, as psycopg_pool's
  ``check_connection`` does, because a peer that vanished without closing (a host lost, an
  address moved, a firewall that forgot the flow) is only discovered by sending;
- otherwise it answered moments ago and nothing arrived since: used as it is.

What the look cannot catch is a server that goes away in the instant between checkout and the
statement, or while the statement runs. A read then runs once more on a fresh connection
(``connection_lost``); a write never does — see ``PostgresStore._run``.

So a read is checked on failure, not before: it takes even a long-rested connection without the
probe (``UNPROBED``, set by the stores' ``_read``), and only when that connection turns out to be
gone is it read again, on a connection checked as a write's is. A write keeps the probe: once
sent, a statement whose connection breaks may or may not have committed, and is never re-sent.

Each pooled connection keeps the cursor the store's plans run on (``Pooled.plans``).
"""

from __future__ import annotations

import select
import time
import weakref
from contextvars import ContextVar
from enum import Enum
from typing import Any

import psycopg
from psycopg.rows import DictRow
from psycopg_pool import PoolTimeout

# How long a pooled connection may rest before its next use is preceded by a round trip: above
# the gap between the steps of a busy run (a step after a long model call pays one round trip,
# nothing beside the call), far below the minutes after which NAT tables and firewalls drop
# idle flows.
PROBE_AFTER_S = 5.0

# SQLSTATEs that end the session: connection exceptions (08…), and the server shutting down,
# crashing, starting up or timing the idle session out (57P01, 57P02, 57P03, 57P05).
# query_canceled (57014, a statement timeout) and lock_not_available (55P03) leave the session
# alive: retrying those would only wait twice.
_SESSION_ENDED = ("57P01", "57P02", "57P03", "57P05")


# True while a read takes its connection: the read is run again if the connection is gone, so
# a rested one is used without the round trip that would prove it first. A context variable:
# the check runs in the thread (or task) that asked for the connection.
UNPROBED: ContextVar[bool] = ContextVar("safepoint_unprobed", default=False)


class Pooled(psycopg.Connection[DictRow]):
    """A pooled connection, with the cursor the store's plans run their statements on: made
    by the connection's first plan and kept, not made for each statement. A new cursor costs
    its own making and, each time, the adapters that convert the statement's parameters and
    columns, which psycopg keeps on a cursor that runs the same statement again — as a run's
    steps do, one ``record_step`` after another. The cursor holds its last statement's
    parameters and rows until its next statement, or until the pool closes the connection:
    one statement's worth, at most, per pooled connection."""

    _plans: psycopg.Cursor[DictRow] | None = None

    def plans(self) -> psycopg.Cursor[DictRow]:
        cur = self._plans
        if cur is None:
            cur = self._plans = self.cursor()
        return cur


class AsyncPooled(psycopg.AsyncConnection[DictRow]):
    """``Pooled`` for the async store."""

    _plans: psycopg.AsyncCursor[DictRow] | None = None

    def plans(self) -> psycopg.AsyncCursor[DictRow]:
        cur = self._plans
        if cur is None:
            cur = self._plans = self.cursor()
        return cur


class Checkout(Enum):
    """What the check on checkout does with a pooled connection."""

    USE = "use"  # it answered moments ago and nothing arrived since
    PROBE = "probe"  # it rested long: one round trip proves it first
    DISCARD = "discard"  # the server spoke on it unasked (FATAL, then EOF): it is gone


def checkout(rested_s: float | None, unsolicited: bool, *, probe: bool = True) -> Checkout:
    """The verdict on a connection that rested ``rested_s`` seconds (``None``: unknown) and on
    which the server did (``unsolicited``) or did not send anything while it rested; without
    ``probe`` (a read, which is run again should the connection be gone) it is never probed."""
    if unsolicited:
        return Checkout.DISCARD
    if probe and (rested_s is None or rested_s >= PROBE_AFTER_S):
        return Checkout.PROBE
    return Checkout.USE


def unsolicited_input(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection has anything to read — a zero-timeout poll of its socket, no
    round trip. Between operations every reply has been read up to ReadyForQuery, and pooled
    connections LISTEN to nothing, so anything there is the server ending the session."""
    if conn.closed:
        return True
    fd = conn.fileno()
    if hasattr(select, "poll"):
        # poll, not select: select() refuses descriptors numbered FD_SETSIZE (1024) and up,
        # which a process with many open files hands its sockets. A hang-up or an error is
        # reported whatever the mask: the session is gone, just the same.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows: no poll, and no such limit
    return bool(readable)


class Resting:
    """When each pooled connection was last handed back (the stores call ``rested`` as an
    operation lets go of its connection, and from the pool's ``configure``), for the check on
    checkout."""

    def __init__(self) -> None:
        # Weak keys: the pool closes and forgets connections without telling anyone.
        self._since: weakref.WeakKeyDictionary[object, float] = weakref.WeakKeyDictionary()

    def rested(self, conn: object) -> None:
        self._since[conn] = time.monotonic()

    def checkout(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Checkout:
        since = self._since.get(conn)
        rested_s = None if since is None else time.monotonic() - since
        return checkout(rested_s, unsolicited_input(conn), probe=not UNPROBED.get())


class Discarded(psycopg.OperationalError):
    """Raised by the check on checkout: the pool drops the connection and hands out another."""


def connection_lost(exc: BaseException | None) -> bool:
    """Whether a driver error means the session itself ended (as opposed to the statement
    failing on a live one): only then can running the same read on another connection help."""
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, PoolTimeout):
        return False  # a pool timeout has already waited as long as the caller allows
    state = exc.sqlstate
    # No SQLSTATE: libpq's own "server closed the connection unexpectedly", "consuming input
    # failed", "the connection is lost" — the socket broke.
    return state is None or state.startswith("08") or state in _SESSION_ENDED
