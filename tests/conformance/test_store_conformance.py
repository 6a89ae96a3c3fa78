"""The store conformance suite on both SQLite variants: a fresh file per test, and memory:."""

from __future__ import annotations

import pytest

from safepoint.storage import Store, open_store
from safepoint.testing.conformance import StoreConformance


class TestSqliteFile(StoreConformance):
    """Every call opens a new store object on the test's file, as separate processes would."""

    def make_store(self) -> Store:
        return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}")


class TestSqliteMemory(StoreConformance):
    """An in-memory database lives in one store object, so the test shares it between threads
    (each thread gets its own connection to it)."""

    _store: Store | None = None

    def make_store(self) -> Store:
        if self._store is None:
            self._store = open_store("memory:")
        return self._store


@pytest.fixture(scope="module")
def shared_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('shared') / 'ledger.db'}"


class TestSqliteSharedFile(StoreConformance):
    """One file for every test of the class, as a shared PostgreSQL database would be: proves
    that the suite's tests keep to their own runs and never assume an empty store."""

    @pytest.fixture(autouse=True)
    def _shared(self, shared_ledger: str) -> None:
        self.url = shared_ledger

    def make_store(self) -> Store:
        return open_store(self.url)
