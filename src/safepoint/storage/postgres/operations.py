"""The PostgreSQL stores' operations that only run their plan: one line each, for both stores.

``PostgresStore`` and ``AsyncPostgresStore`` both inherit this class; each line becomes a
method of each (``def`` in the one, ``async def`` in the other) that runs the plan
``PostgresLedger`` has for the operation on that store's executor (``storage.operations``).
The reads, forks, retries and a key rotation's pages are every store's (the bases).
"""

from __future__ import annotations

from ..forks import ForkOperations
from ..ledger import LedgerOperations
from ..operations import reading, writing
from ..resealing import ResealOperations
from ..retry import RetryOperations
from .ledger import PostgresLedger

__all__ = ["PostgresOperations"]


class PostgresOperations(LedgerOperations, ForkOperations, RetryOperations, ResealOperations):
    """Every operation of a PostgreSQL store that only runs one plan."""

    # reads: read again on a fresh connection when the server ended the session under them
    schema_version = reading(PostgresLedger.schema_version)

    # a worker's fenced writes: each statement commits by itself
    renew_lease = writing(PostgresLedger.renew_lease, atomic=False)
    record_step = writing(PostgresLedger.record_step, atomic=False, warns=True)
    record_steps = writing(PostgresLedger.record_steps, atomic=False, warns=True)
    record_attempt = writing(PostgresLedger.record_attempt, atomic=False)
    prepare_effect = writing(PostgresLedger.prepare_effect, atomic=False, warns=True)
    prepare_and_mark_dispatching = writing(
        PostgresLedger.prepare_and_mark_dispatching, atomic=False, warns=True
    )
    record_outcome = writing(PostgresLedger.record_outcome, atomic=False, warns=True)

    # writes in one transaction
    create_run = writing(PostgresLedger.create_run)
    claim_run = writing(PostgresLedger.claim_run)
    claim_next = writing(PostgresLedger.claim_next)
    resolve = writing(PostgresLedger.resolve)
    request_cancel = writing(PostgresLedger.request_cancel)
    replan = writing(PostgresLedger.replan)
    release_run = writing(PostgresLedger.release_run)
    end_slice = writing(PostgresLedger.end_slice)
    reprepare_effect = writing(PostgresLedger.reprepare_effect)
    await_approval = writing(PostgresLedger.await_approval)
    approve = writing(PostgresLedger.approve)
    revoke_approval = writing(PostgresLedger.revoke_approval)
    continue_as_new = writing(PostgresLedger.continue_as_new)
    stop_run = writing(PostgresLedger.stop_run)
    extend_limits = writing(PostgresLedger.extend_limits)
    send_message = writing(PostgresLedger.send_message)
    answer_wait = writing(PostgresLedger.answer_wait)
    await_message = writing(PostgresLedger.await_message, warns=True)
    await_timer = writing(PostgresLedger.await_timer, warns=True)
