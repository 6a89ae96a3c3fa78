"""Workers: processes that claim runnable runs from a store and execute them.

A worker runs ``concurrency`` slots (threads), each looping: claim the oldest runnable run
(pending, left behind by a worker whose lease expired, or waiting and due: its sleep ended, its
wait timed out), execute it, repeat; with nothing to claim, wait on the store's wake-up signal
(LISTEN/NOTIFY on PostgreSQL, a cheap change counter on SQLite) — no longer than until the next
waiting run falls due. Expired leases send no signal, so an idle slot also looks again every
``rescan`` seconds.

A slot never spins. A claim that fails, or a run given back because the store failed under it,
is followed by a pause that doubles with each failure in a row (50 ms up to 5 s), and after a
wake-up that brought no work, news is heard no sooner than a pause that grows the same way up
to ``rescan`` (a run falling due is taken on time all the same); what goes wrong is logged
once for the streak, not once per try. A run whose record cannot be read is blocked by the slot
that claimed it (``unreadable_record``) and never claimed again: one bad row never stops the
others.

Given a ``slice`` (``run(slice=...)``), a worker carries runs on for that long, then returns: once
the slice is spent no slot claims again, a run in progress stops at its next step boundary and is
released at once (``slices``: counted ``unfinished``), and ``run`` returns what the worker did —
for a job runner that cuts processes at a ceiling.

SIGTERM drains: no new claims, running runs go on to their end, then the process exits. A
second SIGTERM (or SIGINT) stops at once; the runs it held are taken over by other workers when
their leases expire, exactly as after SIGKILL — which is always safe, since every write and
every dispatch is fenced.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    AwaitingApproval,
    AwaitingMessage,
    CorruptRecord,
    LimitReached,
    LostOwnership,
    RunBlocked,
    RunCancelled,
    RunWaiting,
    SafepointError,
    StoreError,
)
from ..types import Claim, Unfinished
from .ownership import DEFAULT_LEASE_MS, worker_id
from .slices import Slice, SliceClock
from .verbs import block_unreadable, claimed_run, run_claimed
from .workflow import registered, registered_versions

if TYPE_CHECKING:
    from ..storage.base import Store

log = logging.getLogger("safepoint.worker")

# The pause after the store failed (a claim, or under a run): 50 ms, doubling, at most 5 s.
FIRST_PAUSE_S, MAX_PAUSE_S = 0.05, 5.0


@dataclass
class Backoff:
    """How long a slot pauses after ``streak`` unproductive tries in a row: ``first`` seconds,
    doubling each time, at most ``cap``. I/O-free; the slot does the waiting."""

    first: float
    cap: float
    streak: int = 0

    def pause(self) -> float:
        """The pause after one more unproductive try."""
        self.streak += 1
        return min(self.cap, self.first * 2.0 ** (self.streak - 1))

    def reset(self) -> int:
        """A productive try: the next pause starts from ``first``. Returns the streak ended."""
        ended, self.streak = self.streak, 0
        return ended


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    blocked: int = 0
    lost: int = 0
    interrupted: int = 0  # the store failed mid-run; the run was given back
    cancelled: int = 0
    waiting: int = 0  # paused for an approval, a message or a timer; released, not failed
    stopped: int = 0  # reached a limit: resumable once a person raises it, not failed
    unfinished: int = 0  # stopped at a step boundary when the slice was spent; released, runnable
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


class Worker:
    """Claim and execute runs of the registered workflows until stopped.

    >>> Worker(store, concurrency=4).run()          # doctest: +SKIP
    """

    def __init__(
        self,
        store: Store,
        *,
        concurrency: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        workflows: list[str] | None = None,
        rescan: float = 1.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.store = store
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.workflows = workflows
        self.rescan = rescan
        self.owner = worker_id()
        self.stats = WorkerStats()
        self._draining = threading.Event()
        self._slice: SliceClock | None = None  # the slice of the current run(), if given

    def stop(self) -> None:
        """Drain: claim nothing more; runs in progress finish."""
        self._draining.set()

    def run(
        self, *, until_idle: bool = False, handle_signals: bool = True, slice: Slice | None = None
    ) -> WorkerStats:
        """Work until ``stop()`` (or SIGTERM); with ``until_idle``, also stop once nothing is
        runnable; with ``slice`` (a ``timedelta`` or seconds, from this call), also once that
        much time is spent: no slot claims after that, and a run in progress stops at its next
        step boundary, released at once for the next worker (or resume) to carry on. Returns
        what this worker did: ``WorkerStats``, whose ``unfinished`` counts the runs the slice
        cut (0: nothing was left half-way)."""
        self._slice = SliceClock.of(slice)
        # name@version: in a rolling deploy, old workers leave new versions' runs alone
        names = self.workflows or registered_versions()
        if not names:
            raise SafepointError(
                "no workflows registered: import the modules that define them (CLI: --import your.module)"
            )
        if handle_signals and threading.current_thread() is threading.main_thread():
            self._install_signal_handlers()
        slots = [
            threading.Thread(
                target=self._slot, args=(names, until_idle), name=f"safepoint-slot-{index}", daemon=True
            )
            for index in range(self.concurrency)
        ]
        for slot in slots:
            slot.start()
        for slot in slots:
            while slot.is_alive():
                slot.join(0.2)  # wake now and then so signal handlers run on the main thread
        return self.stats

    def _install_signal_handlers(self) -> None:
        def drain(signum: int, frame: FrameType | None) -> None:
            if self._draining.is_set():
                raise SystemExit(128 + signum)  # asked twice: stop now, leases will expire
            log.info("draining: finishing runs in progress, claiming no more")
            self.stop()

        signal.signal(signal.SIGTERM, drain)
        signal.signal(signal.SIGINT, drain)

    def _slot(self, names: list[str], until_idle: bool) -> None:
        unclaimable = Backoff(FIRST_PAUSE_S, MAX_PAUSE_S)  # claims the store failed
        interrupted = Backoff(FIRST_PAUSE_S, MAX_PAUSE_S)  # runs it failed under, given back
        idle = Backoff(FIRST_PAUSE_S, max(FIRST_PAUSE_S, self.rescan))  # wake-ups for nothing
        while not self._draining.is_set() and not self._slice_spent():
            try:
                claim = self.store.claim_next(self.owner, self.lease_ms, names)
            except StoreError as exc:  # the database restarting, say: wait and try again
                if not unclaimable.streak:
                    log.warning(
                        "cannot claim: %s; trying again, pausing up to %gs between tries", exc, MAX_PAUSE_S
                    )
                self._draining.wait(unclaimable.pause())
                continue
            if unclaimable.reset():
                log.info("claiming again")
            if claim is None:
                if until_idle:
                    return
                self._idle(idle)
                continue
            idle.reset()
            self.stats.count("claimed")
            if self._execute(claim, quiet=bool(interrupted.streak)):
                self._draining.wait(interrupted.pause())
            else:
                interrupted.reset()

    def _slice_spent(self) -> bool:
        return self._slice is not None and self._slice.spent()

    def _idle(self, idle: Backoff) -> None:
        """Wait for work: a wake-up, or ``rescan`` seconds. After wake-ups in a row that brought
        nothing (on SQLite every commit anywhere wakes a slot) news is heard no sooner than the
        idle pause — by the store, which still returns the moment a waiting run falls due: a
        pause taken here, after the wait, would hold a due run back by up to ``rescan``. Never
        past the end of the slice."""
        quiet = idle.pause()
        rescan = self.rescan
        if self._slice is not None:
            rescan = min(rescan, self._slice.remaining())
            quiet = min(quiet, rescan)
        try:
            self.store.wait_for_work(rescan, self._draining, quiet=quiet)
        except Exception as exc:  # a slot must never die quietly: look again later
            log.warning("waiting for work failed: %s", exc)
            self._draining.wait(rescan)

    def _execute(self, claim: Claim, *, quiet: bool = False) -> bool:
        """Carry the claimed run on to wherever it ends or stops. True when the store failed
        under it (the run was given back): the slot pauses before its next claim. ``quiet``:
        the store failed under the run before too, and that was said."""
        run_id = claim.run_id
        try:
            run = claimed_run(self.store, claim)
            wf = registered(run.workflow)
            if wf is None:  # claim_next only offers registered workflows; a race with unload
                log.error("run %s: workflow %s is not registered here", run_id, run.workflow)
                self.store.release_run(claim)
                return False
            ended = run_claimed(self.store, wf, claim, run, self._slice and self._slice.for_run())
            if isinstance(ended, Unfinished):
                self.stats.count("unfinished")
                log.info("run %s: %s", run_id, ended.reason)
            else:
                self.stats.count("completed")
        except LostOwnership:
            self.stats.count("lost")
            log.warning("run %s: taken over by another worker; stopped without writing", run_id)
        except RunBlocked as exc:
            self.stats.count("blocked")
            log.warning("run %s blocked: %s", run_id, exc.message)
        except (CorruptRecord, ArtifactMissing, ArtifactCorrupt) as exc:
            block_unreadable(self.store, claim, exc)  # unless the flow that found it did
            self.stats.count("blocked")
            log.warning("run %s blocked: its record cannot be read: %s", run_id, exc.message)
        except StoreError as exc:
            # The run itself did not fail: give it back (best effort) so that another worker
            # need not wait out the lease once the store answers again.
            self.stats.count("interrupted")
            (log.debug if quiet else log.warning)(
                "run %s: the store failed (%s); released for another attempt", run_id, exc.message
            )
            with contextlib.suppress(StoreError, LostOwnership):
                self.store.release_run(claim)
            return True
        except RunCancelled:
            self.stats.count("cancelled")
        except RunWaiting as exc:
            self.stats.count("waiting")
            if isinstance(exc, AwaitingApproval):
                log.info("run %s waits for approval: %s", run_id, exc.reason)
            elif isinstance(exc, AwaitingMessage):
                log.info("run %s waits for message %r", run_id, exc.name)
            else:
                log.info("run %s sleeps: %s", run_id, exc.message)
        except LimitReached as exc:
            self.stats.count("stopped")
            log.info("run %s stopped at a limit: %s", run_id, exc.message)
        except SafepointError as exc:
            self.stats.count("failed")
            log.warning("run %s: %s", run_id, exc.message)
        except Exception:
            self.stats.count("failed")
            log.exception("run %s: unexpected error", run_id)
        return False
