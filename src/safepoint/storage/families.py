"""Run families, written once for every store: what another member of a run's family holds
(``family_operation``, ``family_names``), as plans over named queries both dialects define alike
(``family_*``). The claim itself is taken with the dispatch, and given back only by a dispatch
that provably never left (``Store.record_outcome(..., not_sent=True)``), by each dialect its own
way: in the dispatch's transaction (SQLite, ``family_claim`` / ``family_release``), in the
dispatch's statement (PostgreSQL, its ``claimed`` and ``released`` CTEs). What a family key is,
and what a member does with a refusal, are ``_rules.family``'s and the engine's.
"""

from __future__ import annotations

from ..types import OperationRecord
from ._rows import operation_record
from .ledger import LedgerReads
from .plans import Plan, Queries


def family_operation(reads: LedgerReads, run_id: str, family_key: str) -> Plan[OperationRecord | None]:
    """The operation another member of ``run_id``'s family holds the claim on (see
    ``Store.family_operation``)."""
    rows = yield reads.q("family_operation", run_id=run_id, claim_key=family_key)
    return operation_record(rows[0], reads.codec) if rows else None


def family_names(q: Queries, run_id: str, operation_id: str) -> Plan[bool]:
    """Whether a member of ``run_id``'s family holds a claim on an operation of this id."""
    return bool((yield q("family_names", run_id=run_id, operation_id=operation_id)))
