"""Every store implements every operation of its protocol with the protocol's signature: one
operation is written in several classes (the protocols, SQLite, PostgreSQL sync and async, the
async-as-sync adapter), and nothing else checks that they agree."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from safepoint.storage.base import AsyncStore, Store
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.storage.sqlite import SqliteStore
from safepoint.testing.sync_over_async import SyncOverAsync

# The one operation only an async store has, and it is plain on purpose: the heartbeat renews
# the lease from a thread, so that an event loop stuck in a blocking call cannot let it lapse.
_ASYNC_ONLY = {"renew_lease_blocking"}


def _operations(protocol: type) -> dict[str, Callable[..., Any]]:
    return {
        name: value for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")
    }


def _shape(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults (annotations are strings under postponed
    evaluation, and may name the same type differently)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_sync_and_async_protocols_name_the_same_operations_alike() -> None:
    sync, asynchronous = _operations(Store), _operations(AsyncStore)
    assert sorted(sync) == sorted(set(asynchronous) - _ASYNC_ONLY)
    for name, operation in sync.items():
        assert _shape(operation) == _shape(asynchronous[name]), name
    assert isinstance(vars(Store)["identity"], property)
    assert isinstance(vars(AsyncStore)["identity"], property)


@pytest.mark.parametrize(
    ("protocol", "store"),
    [(Store, SqliteStore), (Store, PostgresStore), (Store, SyncOverAsync), (AsyncStore, AsyncPostgresStore)],
    ids=lambda c: c.__name__,
)
def test_every_store_implements_every_operation_with_its_signature(protocol: type, store: type) -> None:
    for name, operation in _operations(protocol).items():
        implemented = getattr(store, name, None)
        assert implemented is not None, f"{store.__name__} lacks {name}"
        assert _shape(implemented) == _shape(operation), f"{store.__name__}.{name}"
        awaited = protocol is AsyncStore and name not in _ASYNC_ONLY
        assert inspect.iscoroutinefunction(implemented) == awaited, f"{store.__name__}.{name}"


def test_a_method_a_store_subclass_writes_out_stays_its_own() -> None:
    """An operation becomes a method of each store class below its declaration; a method a
    subclass writes out — a test's spy, wrapping the store's own — stays as written."""
    import functools

    class Spy(SqliteStore):
        @functools.wraps(SqliteStore.get_run)
        def get_run(self, run_id: str) -> Any:
            return ("spied", run_id)

    class Below(Spy):
        pass

    store = Below(":memory:")
    try:
        assert store.get_run("r-1") == ("spied", "r-1")
        assert store.find_run  # the others are still the store's
    finally:
        store.close()
