"""Effect keys belong to their ledger and are trusted only as minted.

Every ledger has an identity minted once with its schema; every new key includes it, so two
ledgers that use the same run ids never send one key to one owner (the second would be handed
the first one's receipt, and its own effect would never happen). A stored key that is not the
key minted for its operation (a hand edit, a corrupted row) blocks the run as an unreadable
record: nothing is reconciled or sent under it. Real SQLite files, a real PostgreSQL server, the
owner over real HTTP on loopback.
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import CorruptRecord, ResolutionRefused
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import RunStatus

charges = owner_effect("charges")


@sp.workflow("keys-charge")
def charge(run: sp.Run, amount: int) -> Any:
    return run.effect("charge", charges, payload={"amount": amount}, operation_id=f"charge:{amount}")


def _other_ledger(store_url: str, tmp_path: Any) -> str:
    """A second, empty ledger of the same kind."""
    if store_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / f'other-{uuid.uuid4().hex[:6]}.db'}"
    return store_url.split("?", maxsplit=1)[0] + f"?schema=t_{uuid.uuid4().hex[:12]}"


def test_two_ledgers_with_the_same_run_id_each_get_their_effect(
    store: sp.Store, store_url: str, tmp_path: Any, owner_env: OwnerService
) -> None:
    other = sp.open_store(_other_ledger(store_url, tmp_path))
    try:
        assert other.identity.ledger_id != store.identity.ledger_id
        first = sp.start(store, charge, 5, run_id="same-id")
        second = sp.start(other, charge, 5, run_id="same-id")
    finally:
        other.close()
    assert first["id"] != second["id"]  # not the first ledger's receipt
    assert owner_env.client.stats()["applied"] == 2
    assert first["idempotency_key"] != second["idempotency_key"]


def test_a_ledger_keeps_its_identity_and_a_new_one_gets_another(tmp_path: Any) -> None:
    path = tmp_path / "ledger.db"
    first = sp.open_store(f"sqlite:///{path}")
    identity = first.identity
    first.close()
    again = sp.open_store(f"sqlite:///{path}")
    assert again.identity == identity  # kept across opens (and migrations)
    again.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"ledger.db{suffix}").unlink(missing_ok=True)
    wiped = sp.open_store(f"sqlite:///{path}")  # the dev database, wiped and created again
    assert wiped.identity.ledger_id != identity.ledger_id
    wiped.close()


def _alter_key(store_url: str, run_id: str, operation_id: str, key: str) -> None:
    if store_url.startswith("sqlite"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "UPDATE safepoint_operations SET effect_key = ? WHERE run_id = ? AND operation_id = ?",
                (key, run_id, operation_id),
            )
        return
    import psycopg

    base, _, query = store_url.partition("?")
    schema = query.removeprefix("schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".safepoint_operations SET effect_key = %s'
            " WHERE run_id = %s AND operation_id = %s",
            (key, run_id, operation_id),
        )


@pytest.mark.parametrize("crash", ["effect.after_dispatching", "effect.after_prepared"])
def test_an_altered_key_blocks_the_run_and_nothing_is_sent(
    store: sp.Store, store_url: str, owner_env: OwnerService, crash_at: Any, crash: str
) -> None:
    effect = (
        owner_effect("charges")
        if crash == "effect.after_dispatching"
        else owner_effect("charges", dedup_retention=None)
    )  # commits "prepared" on its own

    @sp.workflow("keys-altered")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={"amount": 1}, operation_id="charge:1")

    crash_at(crash)
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)  # the worker dies: its lease is over
    crash_at(None)
    minted = store.load_ledger("r").operations["charge:1"].effect_key
    _alter_key(store_url, "r", "charge:1", "sp_" + "0" * 40)

    with pytest.raises(CorruptRecord, match="not the key minted"):
        sp.resume(store, "r")
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record is not None
    assert run.recovery_record["phase"] == "unreadable_record"
    assert owner_env.client.stats()["applied"] == 0  # neither the old key nor the new one

    _alter_key(store_url, "r", "charge:1", minted)  # the minted key put back: it goes on
    assert sp.resume(store, "r")["amount"] == 1
    assert owner_env.client.stats()["applied"] == 1


def test_not_applied_is_not_asked_of_the_owner_under_an_altered_key(
    store: sp.Store, store_url: str, owner_env: OwnerService, crash_at: Any
) -> None:
    """A person's "not applied" asks the owner by the operation's key first: under a key that
    is not the one minted, the owner knows nothing, and "not found" would be recorded as its
    word. Refused instead, naming the key; nothing recorded, nothing sent."""
    crash_at("effect.after_receiver_commit")
    with pytest.raises(SimulatedCrash):
        sp.start(store, charge, 3, run_id="r", lease_ms=0)  # the owner has it
    crash_at(None)
    _alter_key(store_url, "r", "charge:3", "sp_" + "1" * 40)
    with pytest.raises(CorruptRecord):
        sp.resume(store, "r")
    blocked = store.get_run("r")
    with pytest.raises(ResolutionRefused, match="not the key minted"):
        sp.resolve(
            store, "r", "not_applied", revision=blocked.state_revision, by="ana", operation_id="charge:3"
        )
    assert store.get_run("r") == blocked
    assert owner_env.client.stats()["applied"] == 1
