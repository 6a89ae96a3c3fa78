"""The store conformance suite: the one definition of a correct ledger store.

``safepoint.storage.base.Store`` only names the operations; this suite says what they must do.
Every store — SQLite on a file, SQLite in memory, PostgreSQL, yours — runs the same tests, and a
store is correct when it passes them (the suite, not inheritance, defines a correct store).

Adopting it takes one subclass in a pytest test file::

    from safepoint.storage import Store, open_store
    from safepoint.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        def make_store(self) -> Store:
            return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}")

``make_store`` returns an open, migrated store. It is called several times in one test (the
concurrency tests give every thread its own store object) and may return the same database —
or even the same object — each time. ``self.tmp_path`` is pytest's per-test directory. Every
store it returns is passed to ``close_store`` when the test ends; override that when the
subclass shares one store object across tests.

The suite runs against a shared database too (one PostgreSQL database for all tests): every test
uses its own uuid-suffixed run ids and workflow names and never assumes the store is empty.
Time is real — a store's "now" may come from the database clock — so tests that need a lease to
expire use tiny leases and short sleeps; the whole suite takes a few seconds per store.

An asyncio store (``safepoint.storage.base.AsyncStore``) runs the same suite through
``SyncOverAsync``, which runs its coroutines on an event loop of its own::

    class TestMyAsyncStore(StoreConformance):
        def make_store(self) -> Store:
            return SyncOverAsync(lambda: MyAsyncStore.open(URL))

A second set-up of a store that already runs the whole suite — the same store with a codec,
with another claim statement — may run only the topics it changes::

    class TestMyEncryptedStore(conformance_suite(*STORING)):
        def make_store(self) -> Store:
            return open_store(URL, codec=Encrypted(keyring))

``TOPICS`` names every topic; ``STORING`` are those whose tests write what a run records and
read it back, ``CLAIMING`` those that claim, take over and hand back runs. A new topic is added
to ``StoreConformance`` and to ``TOPICS`` (a test checks they agree), and joins a group when it
tests what that group's set-ups change.

Requires pytest (a dev dependency of safepoint, not a runtime one). The asserts live in this
module, not in a test file, so for readable failures add to your ``conftest.py``::

    pytest.register_assert_rewrite("safepoint.testing.conformance")

The tests of one topic live in a module of their own, as a mixin that ``StoreConformance``
composes: ``runs`` (creating and reading runs), ``listing`` (a console's filtered, counted pages),
``claiming``, ``fencing``, ``steps``, ``effects``,
``ending`` (ending a run), ``artifacts_clock`` (artifacts, clock, wake-ups, history), ``limits``,
``approvals``, ``revocation`` (revoking approvals), ``history`` (bounded history and
continue-as-new), ``forks`` (a run forked from another's prefix), ``unreadable`` (rows that
cannot be read: damaged through ``ConformanceBase.damage``, which a store of your own
overrides), ``retry`` (a failed run retried by a person), ``slices`` (a run released at the
end of a slice), ``stopped`` (runs stopped at a limit, limits raised), ``prune`` (finished runs
deleted whole), ``waits`` (messages, and the gates of wait and sleep steps) and ``transactions``
(transaction steps: the function's writes committed with the step). ``_support`` holds what they
share: the base class with
``make_store`` and the helpers, the constants and the record factories.
"""

from __future__ import annotations

from typing import Any

from ..sync_over_async import SyncOverAsync
from ._support import ConformanceBase
from .approvals import ApprovalTests
from .artifacts_clock import ArtifactClockTests
from .claiming import ClaimTests
from .effects import EffectTests
from .ending import EndingTests
from .fencing import FenceTests
from .forks import ForkTests
from .history import HistoryTests
from .limits import LimitTests
from .listing import ListingTests
from .prune import PruneTests
from .retry import RetryTests
from .revocation import RevocationTests
from .runs import RunTests
from .slices import SliceTests
from .steps import StepTests
from .stopped import StoppedTests
from .transactions import TransactionTests
from .unreadable import UnreadableTests
from .waits import WaitTests

__all__ = ["CLAIMING", "STORING", "TOPICS", "StoreConformance", "SyncOverAsync", "conformance_suite"]

# Every topic of the suite, by name, in reading order (creating runs first).
TOPICS: dict[str, type[Any]] = {
    "runs": RunTests,
    "listing": ListingTests,
    "claiming": ClaimTests,
    "fencing": FenceTests,
    "steps": StepTests,
    "effects": EffectTests,
    "ending": EndingTests,
    "artifacts_clock": ArtifactClockTests,
    "limits": LimitTests,
    "approvals": ApprovalTests,
    "revocation": RevocationTests,
    "history": HistoryTests,
    "unreadable": UnreadableTests,
    "stopped": StoppedTests,
    "slices": SliceTests,
    "retry": RetryTests,
    "forks": ForkTests,
    "waits": WaitTests,
    "prune": PruneTests,
    "transactions": TransactionTests,
}

# The topics whose tests write what a run records and read it back: what a codec changes (the
# claims, fences, limits and slices they leave out are decided on plain columns a codec never
# touches).
STORING = tuple(name for name in TOPICS if name not in ("claiming", "fencing", "limits", "slices"))
# The topics whose tests claim runs, take them over or hand them back: what another claim
# statement changes.
CLAIMING = ("claiming", "fencing", "ending", "stopped", "slices", "retry", "waits")


# pytest collects the tests of the last base first: the topics are listed backwards so
# that they run in reading order, creating runs first.
class StoreConformance(
    TransactionTests,
    PruneTests,
    WaitTests,
    ForkTests,
    RetryTests,
    SliceTests,
    StoppedTests,
    UnreadableTests,
    HistoryTests,
    RevocationTests,
    ApprovalTests,
    LimitTests,
    ArtifactClockTests,
    EndingTests,
    EffectTests,
    StepTests,
    FenceTests,
    ClaimTests,
    ListingTests,
    RunTests,
    ConformanceBase,
):
    """Subclass in a test module and implement ``make_store``; pytest collects the tests."""


def conformance_suite(*topics: str) -> type[ConformanceBase]:
    """The suite of ``topics`` only (names of ``TOPICS``), to subclass as ``StoreConformance``
    is: for a second set-up of a store that already runs the whole suite, which changes only
    what those topics test — the same store with a codec (``STORING``), with another claim
    statement (``CLAIMING``). A store of its own runs ``StoreConformance``, every topic."""
    unknown = [name for name in topics if name not in TOPICS]
    if unknown or not topics:
        raise ValueError(f"conformance_suite: name topics of {sorted(TOPICS)}, not {unknown or 'none'}")
    chosen = [TOPICS[name] for name in TOPICS if name in topics]
    suite: type[ConformanceBase] = type(f"StoreConformance_{'_'.join(topics)}", tuple(reversed(chosen)), {})
    return suite
