"""Effects that act on the local effect-owner service: the shape a real integration takes.

Each maps the owner's answers onto the dispatch protocol: refused connection → ``NotSent``
(provably never left), a 4xx → ``Rejected`` — except a key-reuse conflict, which proves the key
was used — and anything else (a dropped connection, a timeout) propagates and makes the outcome
unknown. ``reconcile`` looks the operation up by its
idempotency key — through the search index, which may lag, so a "not found" is only trusted
inside the owner's key retention.

The owner's URL is read from ``$SAFEPOINT_OWNER_URL`` at call time, so workflows that use these
effects can run in any process the kill harness starts.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

from .._rules.effects import Applied, Effect, EffectKey, NotApplied, NotSent, Rejected, Unknown
from .owner import OwnerClient, OwnerError, OwnerRejected, OwnerUnavailable

OWNER_URL_ENV = "SAFEPOINT_OWNER_URL"


_kept_clients: dict[str, OwnerClient] = {}
_kept_lock = threading.Lock()  # fan-out branches ask for the client at the same time


def owner_client(*, keep_alive: bool = False) -> OwnerClient:
    """A client of the owner at ``$SAFEPOINT_OWNER_URL``: a new one, or with ``keep_alive`` the
    process's client for that URL, which keeps one connection per thread."""
    url = os.environ.get(OWNER_URL_ENV)
    if not url:
        raise RuntimeError(f"set {OWNER_URL_ENV} to the effect owner's URL (OwnerService().url)")
    if not keep_alive:
        return OwnerClient(url)
    with _kept_lock:
        if url not in _kept_clients:
            _kept_clients[url] = OwnerClient(url, keep_alive=True)
        return _kept_clients[url]


def owner_effect(
    resource: str,
    *,
    name: str | None = None,
    dedup_retention: timedelta | None = timedelta(hours=23),
    verify: bool = False,
    reconcile: bool = True,
    fenced: bool = False,
    keep_alive: bool = False,
) -> Effect:
    """An effect that creates one object of ``resource`` at the local owner (``keep_alive``:
    through a connection kept per thread, as an application's pooled HTTP client sends)."""

    def execute(payload: Any, key: EffectKey) -> Any:
        try:
            # Fence tokens grow per run, so the owner compares them per run and resource.
            return owner_client(keep_alive=keep_alive).create(
                resource,
                payload,
                idempotency_key=str(key),
                fence=key.fence if fenced else None,
                fence_resource=f"{resource}:{key.run_id}" if fenced else None,
            )
        except OwnerUnavailable as exc:
            raise NotSent(str(exc)) from exc
        except OwnerRejected as exc:
            if exc.error_type == "idempotency_error":
                # The key is already known with other parameters: proof that *something* was
                # applied under it, not a refusal. Leave the outcome unknown: reconcile decides.
                raise
            raise Rejected({"status": exc.status, "body": exc.body}) from exc

    def find(key: EffectKey) -> Applied | NotApplied | Unknown:
        try:
            found = owner_client().find_by_key(resource, str(key))
        except OwnerError as exc:
            return Unknown(f"lookup failed: {exc}")
        return Applied(found) if found is not None else NotApplied()

    def exists(receipt: Any) -> bool:
        return owner_client().get(resource, receipt["id"]) is not None

    return Effect(
        name or f"owner.{resource}",
        execute=execute,
        reconcile=find if reconcile else None,
        verify=exists if verify else None,
        dedup_retention=dedup_retention,
    )
