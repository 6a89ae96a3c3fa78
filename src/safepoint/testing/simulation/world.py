"""The world a simulation runs in: the real store behind a boundary, and a model of an effect owner.

``SimStore`` is the store every simulated process is given: each request first hands control to
the hub (so another task may go first, or this process may die there), then either fails before
it reaches the database, is carried out, or is carried out with its answer lost — the three
things a network between a worker and its database can do. It also watches for the one thing a
store must never do: accept a write under a fence that is no longer the run's.

``SimOwner`` is a system that owns effects, kept to what the at-most-once promise is about: it
applies each idempotency key once (within ``retention``), counts what it applied per *business
operation* (what a person would call one charge, one email), and can be down, reject, commit and
lose the answer, or apply a request late, after its sender gave up waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from ..._rules.canonical import canonical
from ..._rules.effects import Applied, Effect, EffectKey, NotApplied, NotSent, Rejected
from ...errors import StoreError
from ...types import Claim
from .scheduler import FAIL, LOSE_ANSWER, Scheduler


class Violation(AssertionError):
    """An invariant did not hold: ``rule`` names it, the message says what was seen."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str]]:  # to and from a simulating process
        return (Violation, (self.rule, self.message))


class Database(Protocol):
    """How the simulation reads a schedule's database itself: ``?`` placeholders, tuple rows
    (a ``sqlite3.Connection``, or ``postgres.Connection``)."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...


class SimStore:
    """A real store, each request a boundary of the schedule (see the module docstring)."""

    def __init__(
        self,
        inner: Any,
        scheduler: Scheduler,
        database: Database,
        before: Callable[[], None] | None = None,
    ) -> None:
        self._inner = inner
        self._scheduler = scheduler
        self._database = database  # to watch fences, beside the store
        self._before = before  # what each request needs first (PostgreSQL: the virtual clock set)
        self._methods: dict[str, Callable[..., Any]] = {}
        self.stale_writes: list[str] = []
        self.commits: list[tuple[str, str, str]] = []  # transaction steps committed: run, family key, step

    def __getattr__(self, name: str) -> Any:
        found = self._methods.get(name)
        if found is not None:
            return found
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target
        scheduler = self._scheduler

        def request(*args: Any, **kwargs: Any) -> Any:
            if scheduler.current is None:  # the simulation itself, setting up or looking
                if self._before is not None:
                    self._before()
                return target(*args, **kwargs)
            fate = scheduler.boundary(f"store.{name}")
            if fate == FAIL:
                raise StoreError(f"simulated: the connection failed before {name}")
            if self._before is not None:
                self._before()
            claim = next((a for a in (*args, *kwargs.values()) if isinstance(a, Claim)), None)
            stale = self._stale(claim)
            watched = claim is not None and (stale is not None or name == "record_transaction")
            before = self._marker(claim.run_id) if watched and claim is not None else None
            result = target(*args, **kwargs)
            wrote = before is not None and claim is not None and self._marker(claim.run_id) != before
            if name == "record_transaction" and claim is not None and wrote:  # committed, with its writes
                key = kwargs.get("family_key", args[3] if len(args) > 3 else None)
                self.commits.append((claim.run_id, str(key or ""), args[1].step_id))
            if claim is not None and stale is not None and wrote:
                self.stale_writes.append(f"{name} by {claim.owner} under fence {claim.fence}: {stale}")
            if fate == LOSE_ANSWER:
                raise StoreError(f"simulated: the connection dropped after {name} was carried out")
            return result

        request.__name__ = name
        self._methods[name] = request
        return request

    def _stale(self, claim: Claim | None) -> str | None:
        """Why ``claim`` no longer holds its run, read from the database itself (None: it holds)."""
        if claim is None:
            return None
        row = self._database.execute(
            "SELECT fence, owner FROM safepoint_runs WHERE run_id = ?", (claim.run_id,)
        ).fetchone()
        if row is None or (row[0] == claim.fence and row[1] == claim.owner):
            return None
        return f"the run's fence is {row[0]}, held by {row[1]}"

    def _marker(self, run_id: str) -> tuple[Any, ...]:
        """What every write of a run moves (its revision, its history): a write happened when
        it changed."""
        row = self._database.execute(
            "SELECT state_revision, event_count, step_count, updated_at FROM safepoint_runs WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        return tuple(row) if row is not None else ()


@dataclass
class Applied_:
    """What the owner applied under one key."""

    key: str
    business: str
    run_id: str
    family: str  # the sending run's family, as it stood when the request was sent
    receipt: dict[str, Any]
    at_ms: int


def business_operation(effect: str, payload: Any) -> str:
    """What the owner counts as one operation, by default: the payload's ``"business"`` field,
    or else the effect's name and its whole payload (the same in a run and its forks)."""
    named = payload.get("business") if isinstance(payload, dict) else None
    if isinstance(named, str):
        return named
    return f"{effect}:{canonical(payload).decode()}"


@dataclass(frozen=True)
class OwnerModel:
    """How the simulated owner behaves: what it counts as one business operation
    (``operation(effect_name, payload) -> str``), how long it remembers a key (``retention``,
    None: for ever), and how often, per thousand requests, it rejects one or answers it too
    late (applying it later, after the sender gave up)."""

    operation: Callable[[str, Any], str] = business_operation
    retention: timedelta | None = None
    reject: int = 5
    slow: int = 5


@dataclass
class SimOwner:
    """A model of an effect owner with idempotency keys (see the module docstring)."""

    scheduler: Scheduler
    model: OwnerModel = field(default_factory=OwnerModel)
    by_key: dict[str, Applied_] = field(default_factory=dict)  # what each key holds now
    applications: list[Applied_] = field(default_factory=list)  # every one, in order
    rejected: set[str] = field(default_factory=set)  # keys refused: refused again
    in_progress: set[str] = field(default_factory=set)  # keys of requests being applied late
    requests: int = 0

    def _known(self, key: str) -> Applied_ | None:
        found = self.by_key.get(key)
        if found is None:
            return None
        retention = self.model.retention
        if retention is not None and self.scheduler.now_ms - found.at_ms > retention.total_seconds() * 1000:
            return None
        return found

    def _apply(self, key: str, business: str, run_id: str, family: str) -> dict[str, Any]:
        known = self._known(key)
        if known is not None:
            return known.receipt
        receipt = {"id": f"r{len(self.applications) + 1}", "business": business}
        applied = Applied_(key, business, run_id, family, receipt, self.scheduler.now_ms)
        self.by_key[key] = applied
        self.applications.append(applied)
        self.scheduler.note(f"owner applies {business} (key …{key[-6:]}, run {run_id})")
        return receipt

    def request(self, key: EffectKey, business: str) -> dict[str, Any]:
        """``execute``'s call: apply ``business`` under ``key``, through the faults."""
        self.requests += 1
        family = key.run_id
        if _current:  # which business operation this operation of this family is
            here = _current[-1]
            family = here.family_of(key.run_id)
            here.business_of.setdefault((family, key.operation_id), set()).add(business)
        fate = self.scheduler.boundary(f"owner.apply {business}")
        tape = self.scheduler.tape
        if fate == FAIL:
            raise NotSent("simulated: the owner refused the connection")
        known, sent = self._known(str(key)), str(key)
        if known is None and sent in self.in_progress:
            # A request under this key is still being processed: the owner refuses to start it
            # twice, and says nothing of how the first ends (409 "in progress": not a refusal).
            self.scheduler.note(f"owner is still processing {business}: answers 409 in progress")
            raise ConnectionError(f"simulated: a request for {business} under this key is in progress")
        if known is None and (
            sent in self.rejected or (self.scheduler.chaos and tape.chance(self.model.reject))
        ):
            # An owner keeps a key's answer, a refusal too: the same key is refused again.
            self.rejected.add(sent)
            self.scheduler.note(f"owner rejects {business}")
            raise Rejected({"status": 409, "business": business})
        if known is None and self.scheduler.chaos and tape.chance(self.model.slow):
            due = self.scheduler.now_ms + 100 * (1 + tape.draw(100))
            self.scheduler.note(
                f"owner is slow with {business}: applies it at +{due - self.scheduler.start_ms} ms"
            )
            self.in_progress.add(sent)
            self.scheduler.spawn(f"late-{business}", self._late(due, sent, business, key.run_id, family))
            raise TimeoutError(f"simulated: the owner did not answer {business} in time")
        receipt = self._apply(sent, business, key.run_id, family)
        if fate == LOSE_ANSWER:
            raise ConnectionError(f"simulated: the owner applied {business}, and the answer was lost")
        return receipt

    def _late(self, due: int, key: str, business: str, run_id: str, family: str) -> Callable[[], None]:
        def deliver() -> None:
            self.scheduler.sleep((due - self.scheduler.now_ms) / 1000)
            self.in_progress.discard(key)
            self._apply(key, business, run_id, family)

        return deliver

    def find(self, key: EffectKey) -> Applied | NotApplied:
        """``reconcile``'s call: what the owner holds under ``key``."""
        if self.scheduler.current is not None:
            self.scheduler.boundary("owner.find")
        known = self._known(str(key))
        return Applied(known.receipt) if known is not None else NotApplied()

    def holds(self, receipt: Any) -> bool:
        """``verify``'s call: whether the owner gave this receipt."""
        self.scheduler.boundary("owner.get")
        wanted = receipt.get("id") if isinstance(receipt, dict) else None
        return any(a.receipt["id"] == wanted for a in self.applications)

    def call(self, effect: Effect[Any], what: str) -> Callable[..., Any]:
        """What carries out ``effect``'s ``execute``, ``reconcile`` or ``verify`` against this
        owner, in place of the effect's own code."""
        if what == "execute":
            return lambda payload, key: self.request(key, self.model.operation(effect.name, payload))
        if what == "reconcile":
            return self.find
        return self.holds


def ledger_dump(connection: Database) -> str:
    """Every row of every ledger table, in a stable order: two schedules' ledgers compare as text."""
    tables = [
        row[0]
        for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'safepoint%' ORDER BY name"
        )
    ]
    lines: list[str] = []
    for table in tables:
        rows = connection.execute(f'SELECT * FROM "{table}"').fetchall()
        lines.append(f"-- {table}")
        lines.extend(sorted(repr(tuple(row)) for row in rows))
    return "\n".join(lines)


@dataclass
class World:
    """One schedule's world: what its workflows, workers and people reach."""

    scheduler: Scheduler
    store: SimStore
    owner: SimOwner
    connection: Database
    lease_ms: int = 1000
    clients: int = 0  # client processes a person started (to resume a run)
    instances: list[str] = field(default_factory=list)  # the runs the schedule started
    books: bool = False  # the catalog's bookings table is there
    unanswered: list[str] = field(default_factory=list)  # model requests with a tool call unanswered
    resends: list[tuple[str, str]] = field(default_factory=list)  # (family, operation id) named to resend
    business_of: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (family, op) → business

    def family_of(self, run_id: str) -> str:
        """The instance ``run_id`` descends from — itself, a fork of it (``…-fork-…``), a
        successor (``…~n``), any mix — as the simulation made them: the family, told apart
        without asking the store, whose own idea of a family is under test."""
        for instance in sorted(self.instances, key=len, reverse=True):
            if run_id == instance or run_id.startswith((f"{instance}~", f"{instance}-fork-")):
                return instance
        return run_id


_current: list[World] = []


def world() -> World:
    """The world of the schedule being run (for the simulation's own workflows and effects)."""
    if not _current:
        raise RuntimeError(
            "no simulation is running: simulated workflows run only inside safepoint.testing.simulate"
        )
    return _current[-1]
