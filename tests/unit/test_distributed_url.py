"""A ledger a distributed PostgreSQL shards by run is asked for in its URL (``?distributed=``),
read before anything connects: the claim run by run goes with it, and what a distributed ledger
cannot do is refused with what to write instead."""

from __future__ import annotations

import pytest

from safepoint.errors import InvalidStoreURL
from safepoint.storage.postgres.ledger import PostgresLedger

BASE = "postgresql://app@db.internal/ledger"


def test_a_citus_ledger_claims_run_by_run() -> None:
    ledger = PostgresLedger(f"{BASE}?distributed=citus")
    assert ledger.distributed == "citus"
    assert ledger.claim == "per_run"
    assert "distributed" not in ledger.conninfo  # ours, not libpq's


def test_plain_postgresql_keeps_its_one_statement_claim() -> None:
    ledger = PostgresLedger(BASE)
    assert ledger.distributed is None
    assert ledger.claim == "skip_locked"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("distributed=cockroach", "unknown distributed 'cockroach'; use citus"),
        ("distributed=citus&claim=skip_locked", "leave claim= out"),
    ],
)
def test_what_a_distributed_ledger_cannot_be_is_refused(query: str, said: str) -> None:
    with pytest.raises(InvalidStoreURL) as refused:
        PostgresLedger(f"{BASE}?{query}")
    assert said in str(refused.value)
