"""The host: what the engine asks of the machine it runs on, asked in one place.

Time to sleep and to measure, threads for fan-out, timed calls and heartbeats, randomness for
new ids and recorded values, and this process's name as an owner. The engine's decisions never
read the machine directly; they ask ``host.current``. In production that is ``Host``: the
machine itself. The simulator (``safepoint.testing.simulate``) installs one of its own for the
length of a schedule — virtual time, one thread, seeded randomness, a name per simulated
worker — so that every interleaving it explores runs the very code a worker runs.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

Outcome = tuple[Any, BaseException | None]  # a call's value, or what it raised


class Host:
    """The real machine: wall and monotonic clocks, threads, the operating system's randomness."""

    threads = True  # user code with a timeout runs on a thread of its own

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_now(self) -> datetime:
        return datetime.now(UTC)

    def random(self) -> float:
        """A float in [0, 1)."""
        return int.from_bytes(os.urandom(7)) / 2**56

    def token(self) -> str:
        """A fresh random hex id (32 digits)."""
        return uuid.uuid4().hex

    def worker_id(self, machine_id: str) -> str:
        """The name this caller claims runs under: the process's own (``machine_id``)."""
        return machine_id

    def owner_gone(self, owner: str) -> bool | None:
        """Whether the process named ``owner`` is provably gone, when this host knows (a
        simulation does); None: ask the operating system (``ownership.owner_is_gone``)."""
        return None

    def owner_call(self, effect: Any, what: str) -> Callable[..., Any]:
        """The callable that carries out ``effect``'s ``execute``, ``reconcile`` or ``verify``:
        the effect's own (a simulation answers from its model of the owner instead)."""
        found: Callable[..., Any] = getattr(effect, what)
        return found

    def beat(self, interval: float, beat: Callable[[], bool], name: str) -> Callable[[], None]:
        """Call ``beat`` every ``interval`` seconds beside the caller (a heartbeat), until it
        returns False; returns what stops it (waiting for a beat in progress)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                if not beat():
                    return

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join()

        return halt

    def fan_out(self, calls: Sequence[Callable[[], Any]], width: int, name: str) -> list[Outcome]:
        """Call each at once, at most ``width`` at a time; every outcome, in order, once all
        have returned (BaseExceptions included)."""
        outcomes: list[Outcome] = []
        with ThreadPoolExecutor(max_workers=max(1, min(width, len(calls))), thread_name_prefix=name) as pool:
            futures = [pool.submit(call) for call in calls]
            for future in futures:
                error = future.exception()  # waits
                outcomes.append((None if error is not None else future.result(), error))
        return outcomes


current: Host = Host()


@contextmanager
def hosted_by(host: Host) -> Iterator[Host]:
    """Let ``host`` answer the engine's questions until the block ends (the simulator's)."""
    global current
    before, current = current, host
    try:
        yield host
    finally:
        current = before
