"""The Citus tests' ledger: a schema of this session's own in the database that
``$SAFEPOINT_TEST_CITUS`` names on a Citus coordinator (docs/development.md, "A Citus cluster"),
created distributed (``?distributed=citus``) and dropped at the end. The directory is collected
only when that variable is set (``tests/conftest.py``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

CITUS = os.environ.get("SAFEPOINT_TEST_CITUS", "")


def _ledger() -> Iterator[str]:
    import psycopg
    from psycopg import sql

    schema = f"citus_{uuid.uuid4().hex[:12]}"
    yield f"{CITUS}{'&' if '?' in CITUS else '?'}schema={schema}&distributed=citus"
    with psycopg.connect(CITUS, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="session")
def citus_url() -> Iterator[str]:
    """A distributed ledger of this session's own on the cluster: its URL."""
    yield from _ledger()


@pytest.fixture
def fresh_citus_url() -> Iterator[str]:
    """A distributed ledger of this test's own (a soak counts every run in its ledger)."""
    yield from _ledger()
