"""Numbered SQL migrations, the same way on every store: which ship, which a ledger applied, and
what opening it must do about the difference.

A dialect's migrations are ``sql/<dialect>/migrations/NNNN_name.sql``, numbered 1..n; each one a
ledger applied is recorded in its ``safepoint_schema_version`` table with the checksum of its
text, in the transaction that applied it. Opening a store compares the record with what ships
(``to_apply``, I/O-free; the stores run the statements): an applied migration whose text
changed is ``MigrationMismatch``, a ledger migrated past what ships is ``SchemaTooNew`` — both
before anything is written — and what is left is applied in order. ``sql/<dialect>/schema.sql``
is the schema the whole list leaves (a test holds them together).

Migrations 1-9 of the builds before 0.1.0 were squashed into one ``0001_initial.sql`` before
any release; a ledger such a build created records them, and is refused with the way out
(``MigrationMismatch`` naming the fix) instead of being migrated half-way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import resources
from typing import NamedTuple

from .._rules.canonical import sha256_hex
from ..errors import MigrationMismatch, SchemaTooNew


class Migration(NamedTuple):
    """One shipped migration: its number, file name and SQL text."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return sha256_hex(self.sql.encode())


def load_migrations(dialect: str) -> list[Migration]:
    """Shipped migrations of ``dialect``, in order."""
    folder = resources.files(__package__).joinpath("sql", dialect, "migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_[a-z0-9_]+\.sql", entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort()
    versions = [migration.version for migration in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations of {dialect} are not numbered 1..n: {versions}")
    return found


# What the builds before 0.1.0 recorded: their migrations after the first, by name, and the
# checksums of their first (it was edited once). None of them ships any more.
_BEFORE_RELEASE = frozenset(
    {
        "0002_resume_budget.sql",
        "0003_cancellation.sql",
        "0004_workflow_fingerprint.sql",
        "0005_limits.sql",
        "0006_approvals.sql",
        "0007_history.sql",
        "0008_approval_revocation.sql",
        "0009_ledger_identity.sql",
    }
)
_BEFORE_RELEASE_FIRST = frozenset(
    {
        "3782896277be5dc6572eaaee13fa2e50b4092211c777319c168e5d5e4b331b95",  # SQLite
        "d9cc93770819330bf506e15a6275db856219b21edcea48d475e54246211a7d06",  # PostgreSQL
    }
)
_FRESH_LEDGER = {
    "sqlite": "move the file aside (or delete it) and open it again for a new, empty ledger",
    "postgres": "drop that schema (DROP SCHEMA … CASCADE), or name another with ?schema=, for a"
    " new, empty ledger",
}


def to_apply(dialect: str, applied: Iterable[tuple[int, str, str]]) -> list[Migration]:
    """The shipped migrations a ledger still lacks, in order, given what it recorded
    (``(version, name, checksum)`` rows, in order). ``MigrationMismatch`` when an applied one
    differs from what ships, ``SchemaTooNew`` when the ledger is past what ships."""
    shipped = load_migrations(dialect)
    recorded = list(applied)
    before_release = any(name in _BEFORE_RELEASE for _, name, _ in recorded) or any(
        version == 1 and checksum in _BEFORE_RELEASE_FIRST for version, _, checksum in recorded
    )
    if before_release:
        raise MigrationMismatch(
            1,
            fix=(
                "this ledger was created by a development build from before safepoint 0.1.0, whose"
                " migrations were squashed into one before the release, so it cannot be upgraded in"
                " place. Finish (or read out) its runs with the build that made it, then "
                + _FRESH_LEDGER[dialect]
            ),
        )
    for version, _, checksum in recorded:
        if version <= len(shipped) and checksum != shipped[version - 1].checksum:
            raise MigrationMismatch(version)
    if recorded and recorded[-1][0] > len(shipped):
        raise SchemaTooNew(recorded[-1][0], len(shipped))
    return shipped[len(recorded) :]
