"""``StoreError`` and its family: the ledger itself cannot be used as it is.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from ._base import SafepointError, error


class StoreError(SafepointError):
    """The ledger cannot be used as it is. Nothing recorded has been changed. ``url`` or
    ``path`` names the store, ``run_id`` and ``operation_id`` what it was asked about, where
    known."""

    url: str | None = None
    path: str | None = None
    run_id: str | None = None
    operation_id: str | None = None

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        path: str | None = None,
        run_id: str | None = None,
        operation_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.path = path
        self.run_id = run_id
        self.operation_id = operation_id


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke during the operation — a
    write then may or may not have landed, which the ledger tells once the database answers.
    Never sent again behind the caller's back. Workers wait and retry from the ledger."""


@error
class SchemaTooNew(StoreError):
    """The store was migrated by a newer safepoint than this one; nothing was changed."""

    found: int
    known: int

    def _message(self) -> str:
        return (
            f"the store's schema is at version {self.found} but this safepoint knows only up to"
            f" {self.known}; upgrade safepoint (the data is untouched)"
        )


@error
class MigrationMismatch(StoreError):
    """A migration recorded in the store differs from the one this safepoint ships; the message
    says what to do (``fix``). Nothing was changed."""

    version: int
    fix: str = ""  # none given: the store was migrated by another build

    def __post_init__(self) -> None:
        self.fix = self.fix or "the store was migrated by a different build — use that build"
        super().__post_init__()

    def _message(self) -> str:
        return (
            f"migration {self.version} recorded in the store differs from the one shipped with"
            f" this safepoint; {self.fix}"
        )


@error
class CorruptRecord(StoreError):
    """A ledger row cannot be read (``table``, ``key``, ``reason``); the row is kept as it is."""

    table: str
    key: str
    reason: str

    def _message(self) -> str:
        return (
            f"unreadable ledger row in {self.table} ({self.key}): {self.reason}; the row is kept as"
            " it is and its run blocks (phase unreadable_record) while every other run goes on —"
            " repair the row or restore it from a backup, then resume the run"
        )


@error
class ArtifactMissing(StoreError):
    """An artifact the ledger refers to is not in the store."""

    digest: str

    def _message(self) -> str:
        return f"artifact {self.digest} is missing from the store; restore it from a backup"


@error
class ArtifactCorrupt(StoreError):
    """An artifact's bytes no longer match their digest."""

    digest: str
    actual: str

    def _message(self) -> str:
        return (
            f"artifact {self.digest} does not match its digest (its bytes hash to {self.actual});"
            " it was altered after it was written — restore it from a backup"
        )


@error
class KeyUnavailable(StoreError):
    """A stored value is encrypted with a key (``key_id``) that the store's keyring does not
    hold — or the ledger holds encrypted values and the store was opened without a keyring.
    ``where`` names the value (table, column, row). Nothing was read or changed: open the store
    with a keyring that holds the key."""

    key_id: str
    where: str

    def _message(self) -> str:
        return (
            f"{self.where} is encrypted with key {self.key_id!r}, which this store's keyring does"
            " not hold; open the store with a keyring that holds it (SAFEPOINT_KEYRING, or"
            " codec=Encrypted(keyring)) — the value is kept as it is"
        )


@error
class DecryptionFailed(StoreError):
    """A stored value does not decrypt with the key its envelope names (``key_id``): the key
    under that id is not the one that encrypted it, or the value was altered or copied from
    another row. ``where`` names the value. Nothing was changed."""

    key_id: str
    where: str

    def _message(self) -> str:
        return (
            f"{self.where} does not decrypt with key {self.key_id!r}: the keyring's key under that"
            " id is not the one that encrypted it, or the stored value was altered or copied from"
            " another row; check the keyring, or restore the row from a backup"
        )
