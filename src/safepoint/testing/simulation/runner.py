"""One schedule, from its tape: set the world up, run it through chaos and then calm, check it.

A schedule starts a few runs of the catalog's workflows (submitted for the workers, or started
by a client process of their own), two worker processes, a supervisor that restarts the ones
that die, and a person at the console. For ``chaos_ms`` of virtual time processes die, requests
fail or lose their answers, workers pause past their leases, the clock jumps and the person
acts. Then the faults stop and time runs on until every run rests — or ``settle_ms`` passes,
which is itself a violation (a run nobody carries on). Then every invariant is checked.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..._engine.host import hosted_by
from ..._engine.worker import Worker
from ..._engine.workflow import registered
from ...errors import StoreError
from ...storage.sqlite import SqliteStore
from . import people
from .invariants import check
from .scheduler import Event, Faults, Process, Scheduler, SimHost, Tape
from .workflows import BOOKINGS_TABLE, CATALOG
from .world import Database, OwnerModel, SimOwner, SimStore, Violation, World, _current, ledger_dump


@dataclass
class Config:
    """What a schedule holds, and for how long it is shaken."""

    runs: int = 3  # instances of the catalog's workflows
    workflows: Sequence[str] = CATALOG
    arguments: Callable[[str, int, Tape], tuple[Any, ...]] | None = None  # (workflow, n, tape) → args
    workers: int = 2
    lease_ms: int = 1000
    chaos_ms: int = 6000
    settle_ms: int = 120_000
    person_every_ms: int = 600  # 0: nobody at the console
    faults: Faults = field(default_factory=Faults)
    owner: OwnerModel = field(default_factory=lambda: OwnerModel(reject=15))
    setup_sql: Sequence[str] = (BOOKINGS_TABLE,)  # the tables the workflows' transaction steps write
    # The errors a run may fail with (type names); any other is the engine's. None: not checked.
    expected_failures: Collection[str] | None = (
        "EffectRejected",
        "StepFailed",
        "WaitTimedOut",
        "RunCancelled",
    )
    max_steps: int = 20_000
    # Each schedule draws its own weather (swarm testing): every fault's rate, the owner's
    # rejections and late answers, and how busy the person is, scaled by a factor drawn from the
    # tape (0, 1, 3 or 8) — some schedules without a kind of fault, some drowning in one, which
    # finds what an even mix only reaches after hours.
    swarm: bool = True
    directory: str | os.PathLike[str] | None = None  # a SQLite file per schedule there (None: in memory)
    postgres: str | None = None  # a PostgreSQL server's URL: a database per schedule on it


@dataclass
class Schedule:
    """What one schedule did and found."""

    seed: int | None
    tape: list[int]
    violations: list[Violation]
    events: list[Event]
    steps: int
    requests: int
    ledger: str = ""

    def story(self, last: int = 60) -> str:
        """The schedule's events, as a person reads them (the last ``last``)."""
        shown = self.events[-last:]
        skipped = len(self.events) - len(shown)
        return "\n".join(([f"   … {skipped} events before"] if skipped else []) + [f"  {e}" for e in shown])


_TEMPLATES: dict[tuple[str, ...], SqliteStore] = {}


def _template(setup_sql: Sequence[str]) -> SqliteStore:
    """A ledger migrated once per process, with a fixed identity (so that effect keys, and so
    ledgers, are the same for the same tape) and the workflows' own tables."""
    key = tuple(setup_sql)
    if key not in _TEMPLATES:
        store = SqliteStore(":memory:", clock=lambda: 0)
        conn = store._conn()
        conn.execute("UPDATE safepoint_ledger SET ledger_id = 'simulated', keyed_since = 0")
        for statement in setup_sql:
            conn.execute(statement)
        template = store.memory_copy()
        template.identity = template._reading(template._ledger.read_identity())
        store.close()
        _TEMPLATES[key] = template
    return _TEMPLATES[key]


@dataclass
class Ledger:
    """One schedule's ledger: the store, the simulation's own view of its database, what each
    request needs first, and how it goes when the schedule ends."""

    store: Any
    database: Database
    before: Callable[[], None] | None
    dump: Callable[[], str]
    close: Callable[[], None]


_POSTGRES: dict[tuple[str, tuple[str, ...]], Any] = {}


def _ledger(config: Config, clock: Callable[[], int]) -> Ledger:
    """The schedule's ledger: a copy of the template — in memory, in a file of its own, or a
    PostgreSQL database of its own."""
    if config.postgres is not None:
        return _postgres_ledger(config.postgres, tuple(config.setup_sql), clock)
    template = _template(config.setup_sql)
    if config.directory is None:
        store = template.memory_copy(clock=clock)
        conn = store._conn()
        return Ledger(store, conn, None, lambda: ledger_dump(conn), store.close)
    path = Path(config.directory) / f"ledger-{os.getpid()}-{next(_FILES)}.db"
    with sqlite3.connect(path) as target:
        template._conn().backup(target)
    store = SqliteStore(path, clock=clock)
    conn = store._conn()

    def close() -> None:
        store.close()
        for leftover in path.parent.glob(f"{path.name}*"):  # the file, its WAL and index
            leftover.unlink()

    return Ledger(store, conn, None, lambda: ledger_dump(conn), close)


def close_ledgers() -> None:
    """Drop the PostgreSQL databases this process made for schedules (done at exit anyway)."""
    while _POSTGRES:
        _POSTGRES.popitem()[1].close()


def _postgres_ledger(server: str, setup_sql: tuple[str, ...], clock: Callable[[], int]) -> Ledger:
    from . import postgres

    key = (server, setup_sql)
    if key not in _POSTGRES:
        _POSTGRES[key] = postgres.Ledgers(server, setup_sql)
    made = _POSTGRES[key].schedule(clock)
    store, conn = next(made)
    moved = [-1]

    def before() -> None:  # the database's "now" is the virtual clock's
        now = clock()
        if now != moved[0]:
            conn.set_now(now)
            moved[0] = now

    return Ledger(store, conn, before, lambda: postgres.ledger_dump(conn), made.close)


_FILES = itertools.count()


def _default_arguments(workflow: str, n: int, tape: Tape) -> tuple[Any, ...]:
    if workflow == "sim.order":
        return (n, tape.chance(300), not tape.chance(300))
    return (n,)


@contextmanager
def _quiet() -> Iterator[None]:
    """The worker's log lines are the schedule's events here, not the console's."""
    logger = logging.getLogger("safepoint")
    kept, before = logging.NullHandler(), logger.propagate
    logger.addHandler(kept)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(kept)
        logger.propagate = before


def run_schedule(
    config: Config, *, seed: int | None = None, tape: Sequence[int] = (), keep_ledger: bool = False
) -> Schedule:
    """Run the schedule the tape (or the seed) describes, and check it."""
    drawn = Tape(seed, tape)
    config = _swarmed(config, drawn) if config.swarm else config
    scheduler = Scheduler(drawn, config.faults)
    ledger = _ledger(config, lambda: scheduler.now_ms)
    owner = SimOwner(scheduler, config.owner)
    store = SimStore(ledger.store, scheduler, ledger.database, ledger.before)
    w = World(
        scheduler,
        store,
        owner,
        ledger.database,
        lease_ms=config.lease_ms,
        books=BOOKINGS_TABLE in config.setup_sql,
    )
    _current.append(w)
    try:
        with hosted_by(SimHost(scheduler, owner)), _quiet():
            _set_up(w, config)
            finished = scheduler.run(until_ms=scheduler.now_ms + config.chaos_ms, max_steps=config.max_steps)
            scheduler.chaos = False
            settled = finished and _settle(w, config)
            violations = check(w, settled=settled, expected_failures=config.expected_failures)
            if finished and not settled:
                violations.append(Violation("actionable", "time did not settle: " + _restless(w)))
            if not finished:
                violations.append(
                    Violation("actionable", f"the schedule did not end within {config.max_steps} steps")
                )
            dumped = ledger.dump() if keep_ledger else ""
            scheduler.close()
    finally:
        _current.pop()
        ledger.close()
    return Schedule(
        seed,
        scheduler.tape.recorded(),
        violations,
        scheduler.events,
        scheduler.steps,
        scheduler.requests,
        dumped,
    )


_SCALES = (1, 0, 3, 8)  # the plain choice (0) keeps the configured rate


def _swarmed(config: Config, tape: Tape) -> Config:
    """``config`` with its rates scaled for one schedule, drawn from its tape."""

    def scaled(rate: int) -> int:
        return min(500, rate * _SCALES[tape.draw(len(_SCALES))])

    faults = Faults(*(scaled(getattr(config.faults, f.name)) for f in fields(Faults)))
    owner = replace(config.owner, reject=scaled(config.owner.reject), slow=scaled(config.owner.slow))
    person = (
        config.person_every_ms and config.person_every_ms * (1, 3, 1)[tape.draw(3)] // (1, 1, 3)[tape.draw(3)]
    )
    return replace(config, faults=faults, owner=owner, person_every_ms=person)


def _set_up(w: World, config: Config) -> None:
    s = w.scheduler
    arguments = config.arguments or _default_arguments
    for n in range(1, config.runs + 1):
        name = config.workflows[s.tape.draw(len(config.workflows))]
        wf = registered(name)
        if wf is None:
            raise LookupError(f"workflow {name!r} is not registered: import the module that defines it")
        if wf.is_async:
            raise ValueError(
                f"workflow {name!r} is async: the simulator drives plain def workflows (the engine's"
                " flows are one body for both, so a def twin of it proves the same)"
            )
        args = arguments(name, n, s.tape)
        run_id = f"{name.rsplit('.', 1)[-1]}-{n}"
        w.instances.append(run_id)
        if s.tape.chance(250):  # started by a client of its own, not submitted
            s.spawn(f"client-{n}", people.client(w, run_id, (wf, args)), process=Process(f"client-{n}"))
        else:
            from ... import submit

            # now and then under a deadline, on the store's (virtual) clock: a run stopped past
            # it is resumable once a person moves it (extend_limits)
            deadline = timedelta(seconds=1 + s.tape.draw(8)) if s.tape.chance(150) else None
            submit(w.store, wf, *args, run_id=run_id, deadline=deadline)
    slots: list[Process] = []
    for k in range(config.workers):
        slots.append(_worker(w, f"w{k + 1}", config))
    s.spawn("supervisor", _supervisor(w, slots, config), process=Process("supervisor", mortal=False))
    if config.person_every_ms:
        s.spawn("person", people.person(w, config.person_every_ms), process=Process("person", mortal=False))


def _worker(w: World, name: str, config: Config) -> Process:
    process = Process(name)
    w.scheduler.spawn(name, _work(w, config), process=process)
    return process


def _work(w: World, config: Config) -> Callable[[], None]:
    names = sorted({f"{n}@{registered(n).version}" for n in config.workflows if registered(n) is not None})  # type: ignore[union-attr]

    def body() -> None:
        worker = Worker(w.store, lease_ms=config.lease_ms)  # named after this process
        idle = 50
        while True:
            try:
                claim = w.store.claim_next(worker.owner, config.lease_ms, names)
            except StoreError:
                claim = None
            if claim is None:
                w.scheduler.sleep(idle / 1000)
                idle = min(idle * 2, 2000)
                continue
            idle = 50
            w.scheduler.note(f"claims {claim.run_id} (fence {claim.fence})")
            worker._execute(claim)

    return body


def _supervisor(w: World, slots: list[Process], config: Config) -> Callable[[], None]:
    """Restarts a dead worker process after a while, under a new name."""
    restarts = [0]

    def body() -> None:
        while True:
            w.scheduler.sleep(0.5)
            for index, process in enumerate(slots):
                if process.dead:
                    restarts[0] += 1
                    slots[index] = _worker(w, f"w{index + 1}.{restarts[0]}", config)
                    w.scheduler.note(f"restarts worker {slots[index].name}")

    return body


def _resting(w: World) -> bool:
    busy = w.connection.execute(
        "SELECT count(*) FROM safepoint_runs WHERE status IN ('pending', 'running')"
        " OR (status = 'waiting' AND wake_at IS NOT NULL)"
    ).fetchone()[0]
    late = any(t.name.startswith("late-") for t in w.scheduler.tasks if not t.done)
    return not busy and not late


def _restless(w: World) -> str:
    rows = w.connection.execute(
        "SELECT run_id, status, owner, lease_expires_at, wake_at FROM safepoint_runs"
        " WHERE status IN ('pending', 'running') OR (status = 'waiting' AND wake_at IS NOT NULL)"
    ).fetchall()
    return (
        "; ".join(f"{r[0]} {r[1]} owner={r[2]} lease={r[3]} wake={r[4]}" for r in rows)
        or "late deliveries pending"
    )


def _settle(w: World, config: Config) -> bool:
    """Run on without faults until every run rests; False if it never does."""
    s = w.scheduler
    end = s.now_ms + config.settle_ms
    while s.now_ms < end:
        if not s.run(until_ms=min(end, s.now_ms + 1000), max_steps=config.max_steps):
            return False
        if _resting(w):
            return True
        if not s.ready() and all(t.wake_at is None or t.wake_at > end for t in s.tasks if not t.done):
            s.now_ms = min(end, s.now_ms + 1000)
    return _resting(w)
