"""Forks, written once for every store: making one (``fork_run``), as a plan (``plans``) over
named queries both dialects define alike (``fork_run_*``). The decisions are ``_rules.fork``'s;
what a fork sends is held by its family's claims (``families``).

``fork_run`` is one transaction: the source's row read (and, on PostgreSQL, locked: a worker's
fenced write on the source waits for the fork to commit) with the clock the whole fork is
stamped with, its steps and operations read, the fork decided, then the new run, its copied
steps and operations and both events written.
"""

from __future__ import annotations

from .._rules.canonical import dumps
from .._rules.fork import (
    check_resend,
    fork_detail,
    fork_made_detail,
    forked_from,
    plan_fork,
    refuse_live,
    resent_by,
)
from .._rules.kinds import WITH_OPERATION
from ..errors import RunConflict, RunNotFound
from ..types import RunRecord
from ._rows import operation_record, source_step
from .base import ForkRun
from .families import family_names, family_operation
from .ledger import LedgerReads, json_or_none, sealed_event
from .operations import reading, writing
from .plans import Plan
from .resealing import reseal_fork


def fork_run(reads: LedgerReads, fork: ForkRun) -> Plan[RunRecord]:
    """Make the fork (see ``Store.fork_run``), stamped with the store's clock: the process's
    where the store keeps it (SQLite), else the database's, as the source's query reads it."""
    q = reads.q
    rows = yield q(
        "fork_run_source", run_id=fork.source_run_id, now=None if reads.clock is None else reads.clock()
    )
    if not rows:
        raise RunNotFound(fork.source_run_id)
    source = yield from reads.run_record(rows[0])
    now = int(rows[0]["now"])
    refuse_live(source, now)
    steps = [source_step(row) for row in (yield q("fork_run_steps", run_id=source.run_id))]
    operations = [
        operation_record(row, reads.codec)
        for row in (yield q("load_ledger_operations", run_id=source.run_id))
    ]
    plan = plan_fork(source, steps, operations, fork.from_step)
    held = {op.operation_id: True for op in operations}
    for name in fork.resend:  # the source itself, and every run of its family
        if name not in held:
            held[name] = yield from family_names(q, source.run_id, name)
    resend = check_resend(source, fork.resend, plan, held, (op.operation_id for op in operations))
    version = fork.workflow_version if fork.current_code else source.workflow_version
    # what the source's chain was told to send again (and by whom), for the fork to inherit
    head = source if source.chain_id in (None, source.run_id) else (yield from reads.get_run(source.chain_id))
    inherited = resent_by(head)
    created = yield q(
        "fork_run",
        run_id=fork.run_id,
        source_run_id=source.run_id,
        now=now,
        current_code=fork.current_code,
        workflow_version=fork.workflow_version,
        workflow_fingerprint=fork.workflow_fingerprint,
        workflow_manifest=json_or_none(fork.workflow_manifest),
        tokens_spent=plan.tokens,
        cost_spent=plan.cost,
        model_calls_spent=plan.model_calls,
        step_count=plan.steps,
        forked_from=dumps(forked_from(source.run_id, fork.from_step, resend, fork.run_id, inherited)),
    )
    if not created:
        raise RunConflict(
            fork.run_id,
            f"(a fork is a new run: name another; if it is the fork of {source.run_id!r} you"
            " asked for before, it is there — `safepoint show` it)",
        )
    copy = {"run_id": fork.run_id, "source_run_id": source.run_id, "from_seq": plan.from_seq}
    yield q("fork_run_copy_steps", **copy)
    yield q("fork_run_copy_operations", **copy, with_operation=dumps(WITH_OPERATION))
    if reads.codec is not None:  # copied as they are: sealed for the source's rows
        yield from reseal_fork(reads, source.run_id, fork.run_id)
    detail = fork_detail(
        source.run_id,
        fork.from_step,
        plan,
        resend,
        by=fork.by,
        reason=fork.reason,
        workflow_version=version or source.workflow_version,
        current_code=fork.current_code,
    )
    made = fork_made_detail(fork.run_id, fork.from_step, by=fork.by, reason=fork.reason)
    for run_id, kind, said in ((fork.run_id, "run.forked", detail), (source.run_id, "run.fork_made", made)):
        event_id, text = yield from sealed_event(reads, said, run_id, kind)  # its id first, sealed
        yield q(
            "fork_run_event",
            event_id=event_id,
            run_id=run_id,
            kind=kind,
            from_step=fork.from_step,
            by=fork.by,
            now=now,
            detail=text,
        )
    yield q("fork_run_count_source_event", source_run_id=source.run_id)
    made_run = yield from reads.get_run(fork.run_id)
    yield from reads.wake_workers(made_run.workflow)  # a pending run
    return made_run


class ForkOperations:
    """Forks, and the operation another member of a run's family holds (``operations``)."""

    fork_run = writing(fork_run)
    family_operation = reading(family_operation)
