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

A second set-up of a store that already runs the whole suite runs the tests of what it changes,
and only those, when it names that in ``changes``::

    class TestMyEncryptedStore(StoreConformance):
        changes = frozenset({VALUES})  # a codec changes what is stored, not how claims race

        def make_store(self) -> Store:
            return open_store(URL, codec=Encrypted(keyring))

The rule: every test declares what it exercises (``exercises``; ``VALUES`` when it declares
nothing), and a set-up with ``changes`` runs the tests that exercise at least one of them. The
concerns (``CONCERNS``):

- ``VALUES`` — writes what a run records and reads it back, or moves it (re-plan, retry, fork,
  prune): what a codec changes;
- ``CONTROL`` — decides on plain columns only (status, owner, fence, revision, lease, limits,
  the clock): no second set-up changes it;
- ``CLAIMS`` — claims through ``claim_next``: what another claim statement changes;
- ``ACROSS_RUNS`` — reads across runs (lists, prune, shared artifacts, a wait for any run's
  work): what a database shared with other runs changes;
- ``CONCURRENCY`` — two things at once on one database (threads racing, a waiter woken by
  another store's commit): what a store's own locking changes.

``changes`` left at None (the default) runs every test: a store of its own, or a set-up that
changes how the store reaches its database (another driver, another dialect), runs everything.
safepoint's own set-ups: SQLite on a file, PostgreSQL and async PostgreSQL run everything; each
of them with ``codec=Encrypted(...)`` changes ``VALUES``; PostgreSQL with ``?claim=per_run``
changes ``CLAIMS``; SQLite on one file shared by every test changes ``CLAIMS`` and
``ACROSS_RUNS``; SQLite in memory changes ``CONCURRENCY``. A new test that declares nothing runs
where everything runs and under every codec. safepoint's ``tests/conformance`` checks each
test's declaration against what it calls (``claim_next`` is ``CLAIMS``; a thread or
``wait_for_work`` is ``CONCURRENCY``; a list, a prune or an artifact is ``ACROSS_RUNS``), so a
new test lands in the set-ups that change what it tests.

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
deleted whole), ``waits`` (messages, and the gates of wait and sleep steps), ``answers`` (an
answer to one wait, kept once) and ``transactions``
(transaction steps: the function's writes committed with the step). ``_support`` holds what they
share: the base class with ``make_store`` and the helpers, the constants and the record
factories; ``_concerns`` the concerns and the rule above.
"""

from __future__ import annotations

from ..sync_over_async import SyncOverAsync
from ._concerns import ACROSS_RUNS, CLAIMS, CONCERNS, CONCURRENCY, CONTROL, VALUES, exercises
from ._support import ConformanceBase
from .answers import AnswerTests
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

__all__ = [
    "ACROSS_RUNS",
    "CLAIMS",
    "CONCERNS",
    "CONCURRENCY",
    "CONTROL",
    "VALUES",
    "StoreConformance",
    "SyncOverAsync",
    "exercises",
]


# pytest collects the tests of the last base first: the topics are listed backwards so
# that they run in reading order, creating runs first.
class StoreConformance(
    TransactionTests,
    PruneTests,
    AnswerTests,
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
