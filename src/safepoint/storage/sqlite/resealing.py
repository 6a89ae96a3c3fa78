"""The SQLite store's rotation: one page of sealed values sealed again with the active key, in
one ``BEGIN IMMEDIATE`` transaction (the plans are every store's: ``storage.resealing``)."""

from __future__ import annotations

from .. import resealing
from .connection import SqliteConnection


class SqliteResealing(SqliteConnection):
    """Values sealed again with the keyring's active key, a page at a time."""

    def reseal_page(
        self, kind: str, after: resealing.Key | None, limit: int
    ) -> tuple[int, resealing.Key | None]:
        """``storage.resealing.reseal_page`` in one write transaction."""
        with self._write() as conn:
            return self._within(conn, resealing.reseal_page(self._reads, kind, after, limit))

    def reseal_artifacts_page(self, after: str | None, limit: int) -> tuple[int, str | None]:
        """``storage.resealing.reseal_artifacts_page`` in one write transaction."""
        with self._write() as conn:
            return self._within(conn, resealing.reseal_artifacts_page(self._reads, after, limit))
