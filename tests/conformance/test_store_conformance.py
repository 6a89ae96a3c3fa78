"""The store conformance suite on SQLite: the whole suite on a fresh file per test; on memory: and
on one file shared by every test, the topics those set-ups change."""

from __future__ import annotations

import pytest

from safepoint.storage import Store, open_store
from safepoint.testing.conformance import CLAIMING, TOPICS, StoreConformance, conformance_suite
from safepoint.testing.conformance._support import ConformanceBase


class TestSqliteFile(StoreConformance):
    """Every call opens a new store object on the test's file, as separate processes would."""

    def make_store(self) -> Store:
        return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}")


class TestSqliteMemory(conformance_suite(*CLAIMING, "runs", "steps", "effects", "transactions")):
    """An in-memory database lives in one store object, so the test shares it between threads
    (each thread gets its own connection to it): what it changes is who writes when, so it runs
    the topics that race claims and writes."""

    _store: Store | None = None

    def make_store(self) -> Store:
        if self._store is None:
            self._store = open_store("memory:")
        return self._store


@pytest.fixture(scope="module")
def shared_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('shared') / 'ledger.db'}"


class TestSqliteSharedFile(conformance_suite("listing", "claiming", "waits", "prune")):
    """One file for every test of the class: SQLite's statements that read across runs (lists,
    claims of any run, due runs, prune) never assume an empty store. (The PostgreSQL set-ups
    run the whole suite on one shared database: every test keeps to its own runs.)"""

    @pytest.fixture(autouse=True)
    def _shared(self, shared_ledger: str) -> None:
        self.url = shared_ledger

    def make_store(self) -> Store:
        return open_store(self.url)


def test_every_topic_of_the_suite_is_named() -> None:
    topics = set(StoreConformance.__bases__) - {ConformanceBase}
    assert set(TOPICS.values()) == topics
    with pytest.raises(ValueError, match="name topics"):
        conformance_suite("claims")
