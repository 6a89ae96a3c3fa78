"""The scheduler of a simulation: tasks on one thread, a virtual clock, and one tape of choices.

Every simulated process — a worker, a person at the console, a client calling ``start``, a
fan-out branch — is a task: a greenlet that runs the real engine code until it reaches a
*boundary* (a store request, a call to the effect owner) or sleeps, and then hands control back
to the hub. The hub picks which ready task goes on next, and what happens to it there (nothing,
its process dies, the request fails, the answer is lost, it is paused past its lease), with
choices drawn from the ``Tape``.

The tape is the whole schedule: drawn from a seeded generator the first time, it replays
exactly, and a shorter or smaller tape is a simpler schedule — which is how a failure shrinks.
Every choice is made so that 0 is the plain one (the first ready task, no fault), so a tape
that shrinks towards zeros shrinks towards the schedule a reader expects.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

try:
    import greenlet
except ImportError as missing:  # pragma: no cover - the extra names what to install
    raise ImportError("the simulator needs greenlet: pip install 'safepoint[simulate]'") from missing

from ..._engine.host import Host, Outcome


class ProcessDied(BaseException):
    """Raised in every task of a simulated process that was killed: nothing of it runs on.
    A ``BaseException``, like a signal, so that no ``except Exception`` in user code keeps it
    alive; its store requests and owner calls are refused from then on, so nothing it still
    does on its way out reaches the world."""


class Tape:
    """The schedule's choices, in order. Past its end, a seeded generator draws new ones (and
    records them), or, when replaying a shrunk tape, every choice is the plain one (0)."""

    def __init__(self, seed: int | None, choices: Sequence[int] = ()) -> None:
        self.choices = list(choices)
        self._random = random.Random(seed) if seed is not None else None
        self.used = 0

    def draw(self, n: int) -> int:
        """A choice in ``range(n)``."""
        if n <= 1:
            return 0
        if self.used < len(self.choices):
            value = self.choices[self.used] % n
        elif self._random is not None:
            value = self._random.randrange(n)
            self.choices.append(value)
        else:
            value = 0
        self.used += 1
        return value

    def chance(self, per_mille: int) -> bool:
        """True with about this chance in a thousand (0, the plain choice, is False)."""
        return per_mille > 0 and self.draw(1000) >= 1000 - per_mille

    def recorded(self) -> list[int]:
        return self.choices[: self.used]


@dataclass(eq=False)
class Process:
    """A simulated operating-system process: its tasks die together."""

    name: str
    mortal: bool = True  # a worker or a client: may be killed, paused, see requests fail
    dead: bool = False
    paused_until: int = 0  # virtual ms: stopped whole (SIGSTOP, a long GC) — its heartbeat too


@dataclass(eq=False)
class Task:
    name: str
    process: Process
    glet: greenlet.greenlet
    wake_at: int | None = None  # virtual ms; None: ready
    parked: bool = False  # waiting for its fan-out branches
    done: bool = False
    boundary: str = ""  # what it is about to do, when it handed control back


@dataclass
class Event:
    at_ms: int
    who: str
    what: str

    def __str__(self) -> str:
        return f"{self.at_ms:>8} ms  {self.who:<10} {self.what}"


# What may happen at a boundary, chosen by the hub as the task goes on there.
GO_ON, DIE, FAIL, LOSE_ANSWER, PAUSE = "go on", "die", "fail", "lose answer", "pause"


@dataclass
class Faults:
    """How often each fault happens, per thousand boundaries of the kind."""

    die: int = 8  # the process is killed before the request
    fail: int = 6  # the request fails before it reaches the store (or the owner is down)
    lose_answer: int = 6  # the request is carried out, then its answer is lost
    pause: int = 4  # the process stops for a while (a long GC, SIGSTOP): past its lease, maybe
    clock_jump: int = 2  # the clock jumps forward

    @classmethod
    def none(cls) -> Faults:
        return cls(0, 0, 0, 0, 0)


@dataclass
class Scheduler:
    """The hub: runs tasks one at a time on virtual time, choosing from the tape."""

    tape: Tape
    faults: Faults
    start_ms: int = 1_767_225_600_000  # 2026-01-01: a fixed epoch, so a ledger is reproducible
    now_ms: int = 0
    tasks: list[Task] = field(default_factory=list)
    processes: dict[str, Process] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    steps: int = 0
    requests: int = 0
    current: Task | None = None
    chaos: bool = True  # faults and people act; off once the schedule settles

    def __post_init__(self) -> None:
        self.now_ms = self.start_ms
        self.hub = greenlet.getcurrent()

    # -- tasks ----------------------------------------------------------------------------------

    def spawn(self, name: str, fn: Callable[[], Any], *, process: Process | None = None) -> Task:
        task = Task(name, process or Process(name), greenlet.greenlet(fn, parent=self.hub))
        self.tasks.append(task)
        self.processes.setdefault(task.process.name, task.process)
        return task

    def note(self, what: str, who: str | None = None) -> None:
        self.events.append(Event(self.now_ms - self.start_ms, who or self._who(), what))

    def _who(self) -> str:
        return self.current.name if self.current is not None else "-"

    def me(self) -> Task:
        assert self.current is not None, "a simulated boundary outside any task"
        return self.current

    # -- what a task calls ------------------------------------------------------------------------

    def boundary(self, label: str) -> str:
        """Hand control to the hub before ``label`` (a store request, an owner call); return
        what happens there (``GO_ON``, ``FAIL``, ``LOSE_ANSWER``). Raises ``ProcessDied`` in a
        process that was killed, before or while it waited."""
        task = self.me()
        if task.process.dead:
            raise ProcessDied(task.process.name)
        task.boundary = label
        self.requests += 1
        outcome: str = self.hub.switch()
        if task.process.dead:
            raise ProcessDied(task.process.name)
        return outcome

    def sleep(self, seconds: float) -> None:
        task = self.me()
        if task.process.dead:
            raise ProcessDied(task.process.name)
        task.wake_at = self.now_ms + max(1, round(seconds * 1000))
        task.boundary = f"sleep {seconds:g}s"
        self.hub.switch()
        if task.process.dead:
            raise ProcessDied(task.process.name)

    def fan_out(self, calls: Sequence[Callable[[], Any]], name: str) -> list[Outcome]:
        """Run each call as a task of the caller's process, in the order the hub picks; return
        every outcome once all have ended."""
        parent = self.me()
        if parent.process.dead:
            raise ProcessDied(parent.process.name)
        outcomes: list[Outcome] = [(None, ProcessDied(parent.process.name))] * len(calls)
        left = [len(calls)]

        def branch(index: int, call: Callable[[], Any]) -> Callable[[], None]:
            def body() -> None:
                try:
                    outcomes[index] = (call(), None)
                except BaseException as exc:  # ProcessDied included: the parent sees it
                    outcomes[index] = (None, exc)
                finally:
                    left[0] -= 1
                    if not left[0]:
                        parent.parked = False

            return body

        for index, call in enumerate(calls):
            self.spawn(f"{parent.name}/{name}.{index}", branch(index, call), process=parent.process)
        if left[0]:
            parent.parked = True
            parent.boundary = f"fan-out {name}"
            while left[0]:
                self.hub.switch()
                if parent.process.dead:
                    raise ProcessDied(parent.process.name)
        return outcomes

    # -- the hub ----------------------------------------------------------------------------------

    def kill(self, process: Process, why: str) -> None:
        """The process dies: every task of it unwinds now, refused at each request on its way."""
        if process.dead:
            return
        process.dead = True
        self.note(f"process dies ({why})", process.name)
        for task in list(self.tasks):
            if task.process is process and not task.done and task is not self.current:
                self._resume(task, throw=True)

    def _resume(self, task: Task, value: Any = None, throw: bool = False) -> None:
        if task.done or task.glet.dead:
            task.done = True
            return
        previous, self.current = self.current, task
        try:
            if throw:
                task.glet.throw(ProcessDied(task.process.name))
            elif not task.glet:  # not started yet: it takes no value
                task.glet.switch()
            else:
                task.glet.switch(value)
        except ProcessDied:
            pass
        finally:
            self.current = previous
            if task.glet.dead:
                task.done = True

    def ready(self) -> list[Task]:
        return [
            t
            for t in self.tasks
            if not t.done and t.wake_at is None and not t.parked and t.process.paused_until <= self.now_ms
        ]

    def run(self, *, until_ms: int, max_steps: int) -> bool:
        """Run tasks until none is left or time reaches ``until_ms``; False if ``max_steps``
        ran out first."""
        while True:
            self.tasks = [t for t in self.tasks if not t.done]
            ready = self.ready()
            if not ready:
                sleeping = [
                    max(t.wake_at or 0, t.process.paused_until)
                    for t in self.tasks
                    if not t.done
                    and not t.parked
                    and (t.wake_at is not None or t.process.paused_until > self.now_ms)
                ]
                wake = min(sleeping, default=until_ms + 1)
                if wake > until_ms:  # nothing to do until then: the time passes
                    self.now_ms = max(self.now_ms, until_ms)
                    return True
                self.now_ms = max(self.now_ms, wake)
                for t in self.tasks:
                    if t.wake_at is not None and t.wake_at <= self.now_ms:
                        t.wake_at = None
                continue
            if self.steps >= max_steps:
                return False
            self.steps += 1
            task = ready[self.tape.draw(len(ready))]
            self.now_ms += self.tape.draw(3)  # a request takes a moment
            fate = self._fate(task)
            if fate in (GO_ON, FAIL, LOSE_ANSWER):
                self._resume(task, fate)

    def _fate(self, task: Task) -> str:
        """What happens to ``task`` at the boundary it waits at."""
        if not self.chaos or not task.boundary or task.boundary.startswith(("sleep", "fan-out")):
            return GO_ON
        f = self.faults
        if self.tape.chance(f.clock_jump):
            jump = 1000 * (1 + self.tape.draw(120))
            self.now_ms += jump
            self.note(f"the clock jumps {jump // 1000}s", "clock")
        if not task.process.mortal:
            return GO_ON  # a person at the console: their actions are not cut half-way
        if self.tape.chance(f.die):
            self.kill(task.process, f"before {task.boundary}")
            return DIE
        if self.tape.chance(f.pause):
            pause_ms = 100 * (1 + self.tape.draw(60))
            self.note(f"paused {pause_ms} ms before {task.boundary} (the whole process)", task.name)
            task.process.paused_until = self.now_ms + pause_ms
            return PAUSE
        if self.tape.chance(f.fail):
            self.note(f"{task.boundary}: fails before it is carried out", task.name)
            return FAIL
        if self.tape.chance(f.lose_answer):
            self.note(f"{task.boundary}: carried out, its answer lost", task.name)
            return LOSE_ANSWER
        return GO_ON

    def close(self) -> None:
        """Unwind every task left (a schedule that ended with tasks asleep or parked)."""
        for process in {id(t.process): t.process for t in self.tasks}.values():
            process.dead = True
        for task in list(self.tasks):
            if not task.done:
                self._resume(task, throw=True)


class SimHost(Host):
    """The host a simulation installs: virtual time and one thread of tasks."""

    threads = False

    def __init__(self, scheduler: Scheduler, owner: Any) -> None:
        self.scheduler = scheduler
        self.owner = owner  # every effect is carried out against the simulated owner
        self._ids = 0

    def owner_gone(self, owner: str) -> bool:
        """A simulated worker that died is provably gone (its host saw it die), as a killed
        process of this machine is: its runs are taken over at once, without waiting out the
        lease. Any other name is alive, or unknown: wait for the lease."""
        found = self.scheduler.processes.get(owner)
        return found is not None and found.dead

    def owner_call(self, effect: Any, what: str) -> Callable[..., Any]:
        found: Callable[..., Any] = self.owner.call(effect, what)
        return found

    def sleep(self, seconds: float) -> None:
        self.scheduler.sleep(seconds)

    def monotonic(self) -> float:
        return self.scheduler.now_ms / 1000

    def wall_now(self) -> datetime:
        return datetime.fromtimestamp(self.scheduler.now_ms / 1000, UTC)

    def random(self) -> float:
        return self.scheduler.tape.draw(1 << 20) / (1 << 20)

    def token(self) -> str:
        """Ids that differ from their first digits on (a fork's id keeps eight), and repeat
        with the schedule."""
        self._ids += 1
        return hashlib.sha256(b"%d" % self._ids).hexdigest()[:32]

    def worker_id(self, machine_id: str) -> str:
        return self.scheduler.me().process.name

    def fan_out(self, calls: Sequence[Callable[[], Any]], width: int, name: str) -> list[Outcome]:
        return self.scheduler.fan_out(calls, name)

    def beat(self, interval: float, beat: Callable[[], bool], name: str) -> Callable[[], None]:
        """A heartbeat: a task of the caller's process (paused and killed with it)."""
        me, stopped = self.scheduler.me(), [False]

        def loop() -> None:
            while True:
                self.scheduler.sleep(interval)
                if stopped[0] or not beat():
                    return

        self.scheduler.spawn(f"{me.name}/{name}", loop, process=me.process)
        return lambda: stopped.__setitem__(0, True)
