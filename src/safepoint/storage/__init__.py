"""Ledger stores. ``open_store`` picks one from a URL (``DEFAULT_URL``, the SQLite file
``./safepoint.db``, when none is given and ``$SAFEPOINT_URL`` is unset); the conformance suite
defines correctness. ``Encrypted`` (with a ``Keyring``) is the codec that encrypts what a store
records (``codec.Codec``: the protocol)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ..errors import InvalidStoreURL, MissingExtra, UsageError
from ..types import Durability
from .codec import Codec
from .encrypted import Encrypted, Keyring

if TYPE_CHECKING:
    from .base import Store as Store
    from .sqlite import SqliteStore as SqliteStore

DEFAULT_URL = "sqlite:///safepoint.db"

__all__ = ["DEFAULT_URL", "Codec", "Encrypted", "Keyring", "SqliteStore", "Store", "env_codec", "open_store"]

# Loaded when first asked for: the engine imports ``storage.base`` (and so this package) in every
# process, and a store's module (its queries, its connection) is needed only by a program that
# opens that store, which ``open_store`` imports for the URL's scheme.
_LOADED_LATER = {"SqliteStore": "sqlite", "Store": "base"}


def __getattr__(name: str) -> Any:
    if name not in _LOADED_LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LOADED_LATER[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def env_codec() -> Codec | None:
    """The codec the environment asks for: ``Encrypted`` with the keyring ``$SAFEPOINT_KEYRING``
    holds (or the file ``$SAFEPOINT_KEYRING_FILE`` names); None when neither is set."""
    keyring = Keyring.from_env()
    return None if keyring is None else Encrypted(keyring)


def open_store(
    url: str | None = None,
    *,
    durability: Durability | str | None = None,
    create: bool = True,
    codec: Codec | None = None,
) -> Store:
    """Open (and migrate) the ledger at ``url``.

    ``url`` defaults to ``$SAFEPOINT_URL``, else ``safepoint.db`` in the working directory.
    Accepted forms: ``sqlite:///relative.db``, ``sqlite:////absolute.db``, a plain file path,
    ``postgresql://user@host/db`` (optionally ``?schema=name``; needs the ``postgres`` extra),
    and ``memory:`` (an in-memory database for fast unit tests; it survives nothing).
    ``durability`` (or ``?durability=`` in the URL): ``process_crash`` (default) or
    ``power_loss``. ``create=False`` refuses (``UsageError``) an SQLite file that does not
    exist, or a PostgreSQL schema that holds no ledger, instead of creating one — for tools
    that only look at a ledger. ``codec`` (default: ``env_codec()``, from
    ``$SAFEPOINT_KEYRING``): what the store encrypts values with.

    >>> store = open_store("memory:")
    """
    codec = codec or env_codec()
    url = url or os.environ.get("SAFEPOINT_URL") or DEFAULT_URL
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    chosen = durability or (query.get("durability") or [Durability.PROCESS_CRASH])[0]
    try:
        level = Durability(chosen)
    except ValueError:
        raise InvalidStoreURL(
            url, f"unknown durability {chosen!r}; use " + " or ".join(d.value for d in Durability)
        ) from None
    if url == "memory:":
        from .sqlite import SqliteStore

        return SqliteStore(":memory:", durability=level, codec=codec)
    if parts.scheme in ("postgres", "postgresql"):
        try:  # lazily: `import safepoint` never needs psycopg
            from .postgres import PostgresStore
        except ImportError as exc:
            raise MissingExtra("postgres", exc.name or "psycopg") from exc
        return PostgresStore(url, durability=level, create=create, codec=codec)
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise InvalidStoreURL(url, "an SQLite URL has no host: write sqlite:///file.db")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise InvalidStoreURL(url, "no file name")
        return _sqlite(path, level, create, codec)
    if parts.scheme and len(parts.scheme) > 1:  # one letter would be a Windows drive
        raise InvalidStoreURL(url, f"unknown scheme {parts.scheme!r}")
    return _sqlite(url.split("?", 1)[0], level, create, codec)


def _sqlite(path: str, durability: Durability, create: bool, codec: Codec | None) -> SqliteStore:
    from .sqlite import SqliteStore

    if not create:
        # Checked before the store connects: connecting creates the file (and its -wal and
        # -shm), and opening migrates, which would turn any SQLite file into a ledger.
        where = Path(path).absolute()
        missing = (
            "the file does not exist"
            if not where.is_file()
            else "the file holds no safepoint ledger"
            if _holds_no_ledger(where)
            else None
        )
        if missing:
            raise UsageError(
                f"no ledger at {str(where)!r}: {missing}; check --store (or"
                " SAFEPOINT_URL), or create a ledger there with `safepoint"
                " migrate`"
            )
    return SqliteStore(path, durability=durability, codec=codec)


def _holds_no_ledger(path: Path) -> bool:
    """Whether the SQLite file at ``path`` has no safepoint schema, read without writing."""
    import sqlite3  # here: only open_store(create=False) asks, and most processes never do

    if path.stat().st_size == 0:
        return True
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            return (
                conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'safepoint_schema_version'").fetchone()
                is None
            )
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return False  # not SQLite, or unreadable: opening it says what is wrong with it
