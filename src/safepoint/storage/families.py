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
from .plans import Plan, Queries, Row


def family_of(q: Queries, run_id: str) -> Plan[str | None]:
    """The family ``run_id`` belongs to: its first member's id (None: no such run). Every family
    look-up reads it first, then the claims by family — each statement about one run, or one
    family, as a database sharded by run sends it to one shard."""
    rows = yield q("family_of", run_id=run_id)
    return str(rows[0]["family_id"]) if rows else None


def family_holding(q: Queries, run_id: str, claim_key: str) -> Plan[Row | None]:
    """The claim (the member's ``run_id``, ``operation_id``, whether ``sent``) another run of
    ``run_id``'s family — or this run, for another operation — holds on ``claim_key``."""
    family = yield from family_of(q, run_id)
    rows = (yield q("family_holding", family_id=family, claim_key=claim_key)) if family is not None else []
    return rows[0] if rows else None


def family_operation(reads: LedgerReads, run_id: str, family_key: str) -> Plan[OperationRecord | None]:
    """The operation another member of ``run_id``'s family holds the claim on (see
    ``Store.family_operation``)."""
    held = yield from family_holding(reads.q, run_id, family_key)
    if held is None or held["run_id"] == run_id:
        return None
    rows = yield reads.q("family_operation", run_id=held["run_id"], operation_id=held["operation_id"])
    return operation_record(rows[0], reads.codec) if rows else None


def family_names(q: Queries, run_id: str, operation_id: str) -> Plan[bool]:
    """Whether a member of ``run_id``'s family holds a claim on an operation of this id."""
    family = yield from family_of(q, run_id)
    return family is not None and bool((yield q("family_names", family_id=family, operation_id=operation_id)))
