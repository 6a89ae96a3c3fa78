"""Forks, written once for every store: making one (``fork_run``) and finding an operation in a
run's fork ancestry (``fork_operation``), as plans (``plans``) over named queries both dialects
define alike (``fork_run_*``, ``fork_operation``). The decisions are ``_rules.fork``'s.

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
)
from ..errors import RunConflict, RunNotFound
from ..types import OperationRecord, RunRecord
from ._rows import operation_record, source_step
from .base import ForkRun
from .codec import Codec
from .ledger import LedgerReads, json_or_none, sealed_event
from .plans import Plan, Queries
from .resealing import reseal_fork


def fork_run(reads: LedgerReads, fork: ForkRun, now: int | None) -> Plan[RunRecord]:
    """Make the fork (see ``Store.fork_run``); ``now``: the store's clock, where the dialect
    reads it outside SQL (SQLite) — else the source's query reads the database's."""
    q = reads.q
    rows = yield q("fork_run_source", run_id=fork.source_run_id, now=now)
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
    for name in fork.resend:  # the source itself, and every run it was forked from
        if name not in held:
            found = yield from fork_operation(
                q, source.run_id, name, chained=None, min_depth=0, codec=reads.codec
            )
            held[name] = found is not None
    resend = check_resend(source, fork.resend, plan, held, (op.operation_id for op in operations))
    version = fork.workflow_version if fork.current_code else source.workflow_version
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
        forked_from=dumps(forked_from(source.run_id, fork.from_step, resend)),
    )
    if not created:
        raise RunConflict(
            fork.run_id,
            f"(a fork is a new run: name another; if it is the fork of {source.run_id!r} you"
            " asked for before, it is there — `safepoint show` it)",
        )
    copy = {"run_id": fork.run_id, "source_run_id": source.run_id, "from_seq": plan.from_seq}
    yield q("fork_run_copy_steps", **copy)
    yield q("fork_run_copy_operations", **copy)
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
    return (yield from reads.get_run(fork.run_id))


def fork_operation(
    q: Queries,
    run_id: str,
    operation_id: str,
    *,
    chained: bool | None,
    min_depth: int = 1,
    codec: Codec | None = None,
) -> Plan[OperationRecord | None]:
    """The operation as the nearest run of ``run_id``'s fork ancestry holds it (see
    ``Store.fork_operation``). ``chained`` None: looked up both ways; ``min_depth`` 0: in
    ``run_id`` itself too. ``codec``: the store's, for a sealed receipt or error."""
    rows = yield q(
        "fork_operation",
        run_id=run_id,
        operation_id=operation_id,
        by_chain=chained is not False,
        by_run=chained is not True,
        min_depth=min_depth,
    )
    return operation_record(rows[0], codec) if rows else None
