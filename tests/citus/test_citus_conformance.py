"""The store's conformance suite on a Citus cluster: the PostgreSQL store, sync and async, on a
ledger whose tables Citus distributes by run (``?distributed=citus``: every statement about a
run sent to the run's shard, the claim taken run by run)."""

from __future__ import annotations

import pytest

from safepoint.storage import Store
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.testing.conformance import StoreConformance, SyncOverAsync


class TestCitusConformance(StoreConformance):
    @pytest.fixture(autouse=True)
    def _ledger(self, citus_url: str) -> None:
        self.url = citus_url

    def make_store(self) -> Store:
        return PostgresStore(self.url)


class TestAsyncCitusConformance(StoreConformance):
    @pytest.fixture(autouse=True)
    def _ledger(self, citus_url: str) -> None:
        self.url = citus_url

    def make_store(self) -> Store:
        return SyncOverAsync(lambda: AsyncPostgresStore.open(self.url))
