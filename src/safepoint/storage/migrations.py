"""Numbered SQL migrations, the same way on every store: which ship, which a ledger applied, and
what opening it must do about the difference.

A dialect's migrations are numbered 1..n; each one a ledger applied is recorded in its
``safepoint_schema_version`` table with the checksum of its text, in the transaction that
applied it. Opening a store compares the record with what ships (``to_apply``, I/O-free; the
stores run the statements): an applied migration whose text changed is ``MigrationMismatch``, a
ledger migrated past what ships is ``SchemaTooNew`` — both before anything is written — and what
is left is applied in order.

Where each text lives. ``sql/<dialect>/schema.sql`` is the whole schema, commented: the one
file to read and review to know the ledger. Migration 1 creates a ledger whole, so while it is
the only migration it would be the same text: it is not a file of its own but ``schema.sql``
itself, recorded as ``0001_initial.sql`` (``load_migrations``). Why this way round: a copy in
``migrations/`` would be a second text of the whole schema with nothing to check it against
but the first, and leaving out ``schema.sql`` would make the schema something to assemble from
a history. A later migration changes that:

1. copy ``schema.sql`` as it is, byte for byte, to ``sql/<dialect>/migrations/0001_initial.sql``
   — migration 1 keeps the text, and so the checksum, that every ledger recorded;
2. add ``migrations/0002_<what>.sql``, the change (on PostgreSQL one constraint change per
   ``ALTER TABLE``, each constraint named, as a distributed PostgreSQL, Citus, asks);
3. make the same change to ``schema.sql``, which stays the whole schema.

A new ledger is then made as an older one is upgraded, by 0001 and 0002, and
``tests/conformance/test_schema.py`` holds that applying every migration to an empty database
leaves exactly ``schema.sql``: a migration without its change to ``schema.sql``, or a change
there in no migration, fails it. The same file pins migration 1's checksum, so ``schema.sql``
edited in place while it is migration 1 fails there, before any ledger meets it; and
``load_migrations`` refuses a 0002 with no 0001 beside it. From step 1 on, 0001 and
``schema.sql`` share most of their lines: the record of what ledgers were made with, and the
schema today — a pair the duplicates tool shows and that is not one to fold.

Before the release the schema may instead be squashed again (nothing released holds it): edit
``schema.sql`` (with no migration files, or after removing them), pin its new checksum in the
test, and add the checksum it replaces to ``_BEFORE_RELEASE_FIRST``. That was done twice: the
builds' migrations 1-9 became one ``0001_initial.sql``, and those 1-10 (PostgreSQL; 1-9 on
SQLite) became ``schema.sql``, with no CHECK listing an enum's values. A ledger such a build
created is refused with the way out (``MigrationMismatch`` naming the fix) instead of being
migrated half-way.
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


# The name migration 1 is recorded under, whether its text is schema.sql or, once a later
# migration ships, its copy in migrations/.
INITIAL = "0001_initial.sql"


def load_migrations(dialect: str) -> list[Migration]:
    """Shipped migrations of ``dialect``, in order: ``migrations/NNNN_name.sql``, numbered 1..n,
    or ``schema.sql`` as migration 1 while that folder holds none (see the module docstring)."""
    home = resources.files(__package__).joinpath("sql", dialect)
    folder = home.joinpath("migrations")
    found = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        match = re.fullmatch(r"(\d{4})_[a-z0-9_]+\.sql", entry.name)
        if match:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    if not found:
        return [Migration(1, INITIAL, home.joinpath("schema.sql").read_text("utf-8"))]
    found.sort()
    versions = [migration.version for migration in found]
    if versions != list(range(1, len(found) + 1)):
        first = (
            f"; migration 1 is schema.sql only while no other ships: copy schema.sql as ledgers"
            f" recorded it to migrations/{INITIAL} first (safepoint/storage/migrations.py)"
            if 1 not in versions
            else ""
        )
        raise RuntimeError(f"migrations of {dialect} are not numbered 1..n: {versions}{first}")
    return found


# What the builds before 0.1.0 recorded: the first squash's migrations after the first, by
# name, and the checksums of their first — the text each squash replaced (the first squash's
# was edited once). None of them ships any more.
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
        "3782896277be5dc6572eaaee13fa2e50b4092211c777319c168e5d5e4b331b95",  # SQLite, squash 1
        "d9cc93770819330bf506e15a6275db856219b21edcea48d475e54246211a7d06",  # PostgreSQL, squash 1
        "248d3681efe596cd9214e4caec94fc6b765336d26e3503efd4989bc8c4fc41a3",  # SQLite, squash 2
        "3b6da540e53835a0eaaf1fae19dd46c96888867aed4c26b6e4f551e513f1c417",  # PostgreSQL, squash 2
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
