"""``SyncOverAsync``: an asyncio store presented as a sync ``Store``, so that the one
conformance suite (``safepoint.testing.conformance``, which re-exports this class) runs
unchanged against async stores too."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import update_wrapper
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast, overload

from ..storage.async_store import AsyncStore
from ..storage.base import STOP_POLL_S
from ..types import (
    LedgerIdentity,
)

__all__ = ["SyncOverAsync"]

T = TypeVar("T")
P = ParamSpec("P")
T_co = TypeVar("T_co", covariant=True)


class _Forwarded(Protocol[P, T_co]):
    """An operation of ``SyncOverAsync``, as mypy sees it: ``adapter.op(*P) -> T``."""

    @overload
    def __get__(self, adapter: None, owner: type, /) -> Callable[Concatenate[Any, P], T_co]: ...
    @overload
    def __get__(self, adapter: object, owner: type | None = None, /) -> Callable[P, T_co]: ...


def _forwarded(op: Callable[Concatenate[AsyncStore, P], Coroutine[Any, Any, T]]) -> _Forwarded[P, T]:
    """``adapter.op(...)``: ``adapter.store.op(...)`` run on the private loop, its value returned;
    typed (and signed, ``__wrapped__``) as the ``AsyncStore`` operation it forwards to, so mypy
    checks the calls, and the adapter's conformance to ``Store``, as it did the methods written
    out."""
    name = op.__name__

    def forward(adapter: SyncOverAsync, /, *args: Any, **kwargs: Any) -> Any:
        return adapter._call(getattr(adapter.store, name)(*args, **kwargs))

    update_wrapper(forward, op, assigned=("__name__", "__doc__"))
    return cast(_Forwarded[P, T], forward)


class SyncOverAsync:
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

    now = _forwarded(AsyncStore.now)
    schema_version = _forwarded(AsyncStore.schema_version)
    create_run = _forwarded(AsyncStore.create_run)
    get_run = _forwarded(AsyncStore.get_run)
    find_run = _forwarded(AsyncStore.find_run)
    list_runs = _forwarded(AsyncStore.list_runs)
    query_runs = _forwarded(AsyncStore.query_runs)
    claim_run = _forwarded(AsyncStore.claim_run)
    claim_next = _forwarded(AsyncStore.claim_next)
    load_ledger = _forwarded(AsyncStore.load_ledger)
    events = _forwarded(AsyncStore.events)
    renew_lease = _forwarded(AsyncStore.renew_lease)
    record_step = _forwarded(AsyncStore.record_step)
    record_steps = _forwarded(AsyncStore.record_steps)
    record_attempt = _forwarded(AsyncStore.record_attempt)
    record_transaction = _forwarded(
        AsyncStore.record_transaction
    )  # ``body`` runs on the store's loop: a coroutine function there
    prepare_effect = _forwarded(AsyncStore.prepare_effect)
    mark_dispatching = _forwarded(AsyncStore.mark_dispatching)
    prepare_and_mark_dispatching = _forwarded(AsyncStore.prepare_and_mark_dispatching)
    record_outcome = _forwarded(AsyncStore.record_outcome)
    finish_run = _forwarded(AsyncStore.finish_run)
    resolve = _forwarded(AsyncStore.resolve)
    request_cancel = _forwarded(AsyncStore.request_cancel)
    replan = _forwarded(AsyncStore.replan)
    release_run = _forwarded(AsyncStore.release_run)
    end_slice = _forwarded(AsyncStore.end_slice)
    reprepare_effect = _forwarded(AsyncStore.reprepare_effect)
    await_approval = _forwarded(AsyncStore.await_approval)
    approve = _forwarded(AsyncStore.approve)
    revoke_approval = _forwarded(AsyncStore.revoke_approval)
    approvals = _forwarded(AsyncStore.approvals)
    continue_as_new = _forwarded(AsyncStore.continue_as_new)
    chain_operation = _forwarded(AsyncStore.chain_operation)
    fork_run = _forwarded(AsyncStore.fork_run)
    family_operation = _forwarded(AsyncStore.family_operation)
    get_artifact = _forwarded(AsyncStore.get_artifact)
    stop_run = _forwarded(AsyncStore.stop_run)
    extend_limits = _forwarded(AsyncStore.extend_limits)
    send_message = _forwarded(AsyncStore.send_message)
    answer_wait = _forwarded(AsyncStore.answer_wait)
    messages = _forwarded(AsyncStore.messages)
    await_message = _forwarded(AsyncStore.await_message)
    await_timer = _forwarded(AsyncStore.await_timer)
    retry_run = _forwarded(AsyncStore.retry_run)
    prune_runs = _forwarded(AsyncStore.prune_runs)

    def wait_for_work(self, timeout: float, stop: threading.Event | None = None) -> None:
        # the async store's wait knows no threading.Event: wait in slices, looking between them;
        # a slice that ended before its time was woken by news
        deadline = time.monotonic() + timeout
        while not (stop is not None and stop.is_set()):
            began, left = time.monotonic(), deadline - time.monotonic()
            if left <= 0:
                return
            piece = left if stop is None else min(left, STOP_POLL_S)
            self._call(self.store.wait_for_work(piece))
            if time.monotonic() - began < piece * 0.9:
                return
