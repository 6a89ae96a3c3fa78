"""Run families, written once for every store: the claim a member takes on an operation in the
transaction that sends it (``claim_in_family``), and what another member holds
(``family_operation``, ``family_names``), as plans over named queries both dialects define alike
(``family_*``). What a family key is, and what a member does with a refusal, are
``_rules.family``'s and the engine's.
"""

from __future__ import annotations

from ..errors import ClaimedInFamily
from ..types import OperationRecord
from ._rows import operation_record
from .codec import Codec
from .plans import Plan, Queries


def claim_in_family(q: Queries, run_id: str, operation_id: str, claim_key: str | None) -> Plan[None]:
    """Take the family's claim on ``claim_key`` for ``run_id``'s ``operation_id``, as sent — in
    the caller's transaction, after its own write, so that a refusal rolls that write back:
    ``ClaimedInFamily`` names the member that holds it. An operation with no family key (one
    prepared before families were recorded) claims nothing."""
    if claim_key is None:
        return
    if (yield q("family_claim", run_id=run_id, operation_id=operation_id, claim_key=claim_key)):
        return
    holder = yield q("family_holder", run_id=run_id, claim_key=claim_key)
    raise ClaimedInFamily(run_id, operation_id, holder[0]["run_id"], holder[0]["operation_id"])


def release_in_family(q: Queries, run_id: str, operation_id: str) -> Plan[None]:
    """A person said ``operation_id`` of ``run_id`` was not applied: its claim is given back."""
    yield q("family_release", run_id=run_id, operation_id=operation_id)


def family_operation(
    q: Queries, run_id: str, claim_key: str, codec: Codec | None = None
) -> Plan[OperationRecord | None]:
    """The operation another member of ``run_id``'s family holds the claim on (see
    ``Store.family_operation``)."""
    rows = yield q("family_operation", run_id=run_id, claim_key=claim_key)
    return operation_record(rows[0], codec) if rows else None


def family_names(q: Queries, run_id: str, operation_id: str) -> Plan[bool]:
    """Whether a member of ``run_id``'s family holds a claim on an operation of this id."""
    return bool((yield q("family_names", run_id=run_id, operation_id=operation_id)))
