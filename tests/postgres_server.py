"""The PostgreSQL server the suite's store tests use, and databases on it by name.

A module of its own, not the suite's conftest: a test that imported ``conftest`` by name would
get whichever conftest.py its worker imported last (tests/browser has one of its own)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

SERVER = os.environ.get("SAFEPOINT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_database(url: str, dbname: str) -> str:
    """``url`` naming the database ``dbname`` instead of its own."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))
