"""``open_async_store``: the async counterpart of ``open_store``, importable without psycopg.

It lives apart from ``postgres_async`` so that ``safepoint`` can export it while
``import safepoint`` still never imports psycopg (the ``postgres`` extra stays optional).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import InvalidStoreURL, MissingExtra
from ..types import Durability
from . import env_codec
from .base import AsyncStore
from .codec import Codec

__all__ = ["open_async_store"]


async def open_async_store(
    url: str, *, durability: Durability | str | None = None, create: bool = True, codec: Codec | None = None
) -> AsyncStore:
    """Open (and migrate) the ledger at ``url`` for asyncio code; call it inside the event loop
    that will use the store, and ``await store.close()`` when done.

    Only ``postgresql://`` (or ``postgres://``) URLs, with the same parameters as ``open_store``
    (``?schema=``, ``?durability=``, ``create=False`` to refuse a schema that holds no ledger,
    and ``codec``, by default ``$SAFEPOINT_KEYRING``'s); needs the ``postgres`` extra. SQLite
    is used through the sync ``open_store``: its calls are fast local commits, which
    ``start_async`` and ``resume_async`` accept as they are.

    >>> store = await open_async_store("postgresql://worker@db.internal/app")  # doctest: +SKIP
    """
    if urlsplit(url).scheme not in ("postgres", "postgresql"):
        raise InvalidStoreURL(
            url,
            "the async store supports postgresql:// URLs only; SQLite"
            " is used through the sync open_store (its calls are fast local"
            " commits)",
        )
    try:  # lazily: `import safepoint` never needs psycopg
        from .postgres_async import AsyncPostgresStore
    except ImportError as exc:
        raise MissingExtra("postgres", exc.name or "psycopg") from exc
    return await AsyncPostgresStore.open(
        url, durability=durability, create=create, codec=codec or env_codec()
    )
