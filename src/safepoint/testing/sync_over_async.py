"""``SyncOverAsync``: an asyncio store presented as a sync ``Store``, so that the one
conformance suite (``safepoint.testing.conformance``, which re-exports this class) runs
unchanged against async stores too."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from functools import update_wrapper
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..storage.base import STOP_POLL_S, AsyncStore, Store
from ..types import (
    LedgerIdentity,
)

__all__ = ["SyncOverAsync"]

T = TypeVar("T")


class _SyncOverAsync:
    """An ``AsyncStore`` presented as a sync ``Store``: each call runs the store's coroutine on a
    private event loop in a background thread and blocks until it is done.

    Calls from several threads at once run as concurrent tasks on that one loop — which is how
    an async store is used — so the suite's concurrency tests exercise the async store's own
    concurrency. ``store_factory`` returns the awaitable that opens the store (it is awaited on
    the private loop, where the store's pool must live)::

        store = SyncOverAsync(lambda: AsyncPostgresStore.open(url))
    """

    def __init__(self, store_factory: Callable[[], Awaitable[AsyncStore]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="safepoint-sync-over-async"
        )
        self._thread.start()

        async def open_() -> AsyncStore:
            return await store_factory()

        try:
            self.store = self._call(open_())
        except BaseException:
            self._stop()
            raise
        self.url = self.store.url
        self.identity: LedgerIdentity = self.store.identity

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def close(self) -> None:
        try:
            self._call(self.store.close())
        finally:
            self._stop()

    # -- the operations: each forwards to the async store's, on the private loop ----------
    # (every coroutine of ``AsyncStore``, made a method below, by ``_forwarding``)

    def wait_for_work(
        self, timeout: float, stop: threading.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        if stop is None:
            return bool(self._call(self.store.wait_for_work(timeout, quiet=quiet)))
        told = stop  # the async store's wait knows no threading.Event: a task on the loop relays it

        async def waiting() -> bool:
            relayed = asyncio.Event()

            async def relay() -> None:
                while not told.is_set():
                    await asyncio.sleep(STOP_POLL_S)
                relayed.set()

            watcher = asyncio.ensure_future(relay())
            try:
                return await self.store.wait_for_work(timeout, relayed, quiet=quiet)
            finally:
                watcher.cancel()

        return bool(self._call(waiting()))


def _forwarding(name: str) -> Callable[..., Any]:
    """``adapter.<name>(...)``: ``adapter.store.<name>(...)`` run on the private loop, its value
    returned; named, documented and signed (``__wrapped__``) as the ``Store`` operation."""

    def forward(adapter: _SyncOverAsync, /, *args: Any, **kwargs: Any) -> Any:
        return adapter._call(getattr(adapter.store, name)(*args, **kwargs))

    update_wrapper(forward, getattr(Store, name), assigned=("__name__", "__doc__"))
    return forward


# Every operation of the contract that the async store answers with a coroutine, and that the
# adapter does not write out itself (``wait_for_work``, ``close``): a new operation of the
# contract is forwarded with no line of its own here.
for _name, _operation in vars(AsyncStore).items():
    if inspect.iscoroutinefunction(_operation) and _name not in vars(_SyncOverAsync):
        setattr(_SyncOverAsync, _name, _forwarding(_name))

if TYPE_CHECKING:
    # What mypy sees: a ``Store`` made from an async store's factory, whose ``store`` is that
    # async store — so every call through the adapter is checked against the contract.
    class _Adapter(Store, Protocol):
        store: AsyncStore

    def SyncOverAsync(store_factory: Callable[[], Awaitable[AsyncStore]]) -> _Adapter: ...
else:
    SyncOverAsync = _SyncOverAsync
    SyncOverAsync.__name__ = SyncOverAsync.__qualname__ = "SyncOverAsync"
