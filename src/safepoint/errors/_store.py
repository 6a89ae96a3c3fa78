"""``StoreError`` and its family: the ledger itself cannot be used as it is.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from ._base import SafepointError


class StoreError(SafepointError):
    """The ledger cannot be used as it is. Nothing recorded has been changed."""

    url: str | None = None
    path: str | None = None


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke during the operation — a
    write then may or may not have landed, which the ledger tells once the database answers.
    Never sent again behind the caller's back. Workers wait and retry from the ledger."""


class SchemaTooNew(StoreError):
    """The store was migrated by a newer safepoint than this one; nothing was changed."""

    found: int
    known: int

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the store's schema is at version {found} but this safepoint knows only up to"
            f" {known}; upgrade safepoint (the data is untouched)",
            found=found,
            known=known,
        )


class MigrationMismatch(StoreError):
    """A migration recorded in the store differs from the one this safepoint ships; the message
    says what to do (``fix``). Nothing was changed."""

    version: int
    fix: str

    def __init__(self, version: int, fix: str | None = None) -> None:
        fix = fix or "the store was migrated by a different build — use that build"
        super().__init__(
            f"migration {version} recorded in the store differs from the one shipped with this"
            f" safepoint; {fix}",
            version=version,
            fix=fix,
        )


class CorruptRecord(StoreError):
    """A ledger row cannot be read (``table``, ``key``, ``reason``); the row is kept as it is."""

    table: str
    key: str
    reason: str

    def __init__(self, table: str, key: str, reason: str) -> None:
        super().__init__(
            f"unreadable ledger row in {table} ({key}): {reason}; the row is kept as it is and"
            " its run blocks (phase unreadable_record) while every other run goes on — repair"
            " the row or restore it from a backup, then resume the run",
            table=table,
            key=key,
            reason=reason,
        )


class ArtifactMissing(StoreError):
    """An artifact the ledger refers to is not in the store."""

    digest: str

    def __init__(self, digest: str) -> None:
        super().__init__(
            f"artifact {digest} is missing from the store; restore it from a backup",
            digest=digest,
        )


class ArtifactCorrupt(StoreError):
    """An artifact's bytes no longer match their digest."""

    digest: str
    actual: str

    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(
            f"artifact {digest} does not match its digest (its bytes hash to {actual}); it was"
            " altered after it was written — restore it from a backup",
            digest=digest,
            actual=actual,
        )


class KeyUnavailable(StoreError):
    """A stored value is encrypted with a key (``key_id``) that the store's keyring does not
    hold — or the ledger holds encrypted values and the store was opened without a keyring.
    ``where`` names the value (table, column, row). Nothing was read or changed: open the store
    with a keyring that holds the key."""

    key_id: str
    where: str

    def __init__(self, key_id: str, where: str) -> None:
        super().__init__(
            f"{where} is encrypted with key {key_id!r}, which this store's keyring does not"
            " hold; open the store with a keyring that holds it (SAFEPOINT_KEYRING, or"
            " codec=Encrypted(keyring)) — the value is kept as it is",
            key_id=key_id,
            where=where,
        )


class DecryptionFailed(StoreError):
    """A stored value does not decrypt with the key its envelope names (``key_id``): the key
    under that id is not the one that encrypted it, or the value was altered or copied from
    another row. ``where`` names the value. Nothing was changed."""

    key_id: str
    where: str

    def __init__(self, key_id: str, where: str) -> None:
        super().__init__(
            f"{where} does not decrypt with key {key_id!r}: the keyring's key under that id is"
            " not the one that encrypted it, or the stored value was altered or copied from"
            " another row; check the keyring, or restore the row from a backup",
            key_id=key_id,
            where=where,
        )
