"""The store conformance suite on encrypted stores: SQLite on a file, PostgreSQL sync and async,
each with ``codec=Encrypted(keyring)`` — a run behaves the same with its values encrypted. A
codec changes what is stored, not how claims race: each runs the tests that write what a run
records and read it back (``changes = {VALUES}``); the plain set-ups run the whole suite.

The PostgreSQL classes use a schema of their own: a ledger that holds encrypted values refuses a
store opened without its keyring, and the session's database is shared with the plain suite."""

from __future__ import annotations

import uuid

import pytest

from safepoint.storage import Encrypted, Keyring, Store, open_store
from safepoint.testing.conformance import VALUES, StoreConformance, SyncOverAsync

KEYRING = Keyring({"conformance-2": Keyring.new_key(), "conformance-1": Keyring.new_key()}, "conformance-2")


def codec() -> Encrypted:
    return Encrypted(KEYRING)


class TestEncryptedSqliteFile(StoreConformance):
    """Every call opens a new store object on the test's file, as separate processes would."""

    changes = frozenset({VALUES})

    def make_store(self) -> Store:
        return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}", codec=codec())


@pytest.fixture(scope="module")
def encrypted_schema(pg_url: str) -> str:
    return f"{pg_url}?schema=enc_{uuid.uuid4().hex[:12]}"


class TestEncryptedPostgres(StoreConformance):
    """Every test gets new store objects on one encrypted schema (the suite's ids are unique)."""

    changes = frozenset({VALUES})

    @pytest.fixture(autouse=True)
    def _database(self, encrypted_schema: str) -> None:
        self.url = encrypted_schema

    def make_store(self) -> Store:
        from safepoint.storage.postgres import PostgresStore

        return PostgresStore(self.url, codec=codec())


class TestEncryptedAsyncPostgres(StoreConformance):
    """The same suite against AsyncPostgresStore with the codec, its coroutines run on a loop."""

    changes = frozenset({VALUES})

    @pytest.fixture(autouse=True)
    def _database(self, encrypted_schema: str) -> None:
        self.url = encrypted_schema

    def make_store(self) -> Store:
        from safepoint.storage.postgres_async import AsyncPostgresStore

        return SyncOverAsync(lambda: AsyncPostgresStore.open(self.url, codec=codec()))
