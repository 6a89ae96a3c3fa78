"""Workers: processes that claim runnable runs from a store and execute them.

A worker runs ``concurrency`` slots (threads), each looping: claim the oldest runnable run
(pending, or left behind by a worker whose lease expired), execute it, repeat; with nothing to
claim, wait on the store's wake-up signal (LISTEN/NOTIFY on PostgreSQL, a cheap change counter
on SQLite). Expired leases send no signal, so an idle slot also looks again every
``rescan`` seconds.

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

from ._ownership import DEFAULT_LEASE_MS, worker_id
from ._workflow import registered, registered_versions, run_claimed
from .errors import (
    AwaitingApproval,
    LostOwnership,
    RunBlocked,
    RunCancelled,
    SafepointError,
    StoreError,
)
from .types import Claim

if TYPE_CHECKING:
    from .storage.base import Store

log = logging.getLogger("safepoint.worker")


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    blocked: int = 0
    lost: int = 0
    interrupted: int = 0  # the store failed mid-run; the run was given back
    cancelled: int = 0
    waiting: int = 0  # paused for a person's approval of an effect; released, not failed
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


class Worker:
    """Claim and execute runs of the registered workflows until stopped.

    >>> Worker(store, concurrency=4).run()          # doctest: +SKIP
    """

    def __init__(self, store: Store, *, concurrency: int = 1, lease_ms: int = DEFAULT_LEASE_MS,
                 workflows: list[str] | None = None, rescan: float = 1.0) -> None:
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

    def stop(self) -> None:
        """Drain: claim nothing more; runs in progress finish."""
        self._draining.set()

    def run(self, *, until_idle: bool = False, handle_signals: bool = True) -> WorkerStats:
        """Work until ``stop()`` (or SIGTERM); with ``until_idle``, also stop once nothing is
        runnable. Returns what this worker did."""
        # name@version: in a rolling deploy, old workers leave new versions' runs alone
        names = self.workflows or registered_versions()
        if not names:
            raise SafepointError("no workflows registered: import the modules that define them"
                                 " (CLI: --import your.module)")
        if handle_signals and threading.current_thread() is threading.main_thread():
            self._install_signal_handlers()
        slots = [threading.Thread(target=self._slot, args=(names, until_idle),
                                  name=f"safepoint-slot-{index}", daemon=True)
                 for index in range(self.concurrency)]
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
        while not self._draining.is_set():
            try:
                claim = self.store.claim_next(self.owner, self.lease_ms, names)
            except StoreError as exc:  # the database restarting, say: wait and try again
                log.warning("cannot claim: %s", exc)
                self._draining.wait(min(self.rescan, 1.0))
                continue
            if claim is None:
                if until_idle:
                    return
                try:
                    self.store.wait_for_work(self.rescan)
                except Exception as exc:  # a slot must never die quietly: look again later
                    log.warning("waiting for work failed: %s", exc)
                    self._draining.wait(self.rescan)
                continue
            self.stats.count("claimed")
            self._execute(claim)

    def _execute(self, claim: Claim) -> None:
        run_id = claim.run_id
        try:
            run = self.store.get_run(run_id)
            wf = registered(run.workflow)
            if wf is None:  # claim_next only offers registered workflows; a race with unload
                log.error("run %s: workflow %s is not registered here", run_id, run.workflow)
                self.store.release_run(claim)
                return
            run_claimed(self.store, wf, claim, run)
            self.stats.count("completed")
        except LostOwnership:
            self.stats.count("lost")
            log.warning("run %s: taken over by another worker; stopped without writing", run_id)
        except RunBlocked as exc:
            self.stats.count("blocked")
            log.warning("run %s blocked: %s", run_id, exc.message)
        except StoreError as exc:
            # The run itself did not fail: give it back (best effort) so that another worker
            # need not wait out the lease once the store answers again.
            self.stats.count("interrupted")
            log.warning("run %s: the store failed (%s); released for another attempt",
                        run_id, exc.message)
            with contextlib.suppress(StoreError, LostOwnership):
                self.store.release_run(claim)
        except RunCancelled:
            self.stats.count("cancelled")
        except AwaitingApproval as exc:
            self.stats.count("waiting")
            log.info("run %s waits for approval: %s", run_id, exc.reason)
        except SafepointError as exc:
            self.stats.count("failed")
            log.warning("run %s: %s", run_id, exc.message)
        except Exception:
            self.stats.count("failed")
            log.exception("run %s: unexpected error", run_id)
