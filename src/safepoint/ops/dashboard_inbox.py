"""The console's inbox and workers pages: what needs a person, and who holds which run.

The inbox lists, oldest first within each kind, the runs a person must decide about — blocked
runs (their recovery record drawn as the decision), runs waiting for an approval (the payload
and its digest), runs stopped at a limit (the form that raises it) and failed runs (retry) —
each with the same sections and forms as its own page, posting back to the inbox. Runs waiting
for a message or a timer wait for a program or the clock, not a person: they are not here.

The workers page groups the running runs by the worker that holds them, with each lease's end
and the last heartbeat; a run whose lease ended is marked dead: its worker is gone or stalled.
"""

from __future__ import annotations

from .._rules.waits import MESSAGE, SLEEP, waiting_kind
from ..errors import SafepointError
from ..storage.base import Store
from ..types import RunQuery, RunRecord, RunStatus, UnreadableRun
from .dashboard_api import workers
from .dashboard_layout import e, page, run_path, when
from .dashboard_pages import DECISION_SECTIONS, RunView, Typed, status_badge

__all__ = ["INBOX_KINDS", "inbox_page", "workers_page"]

INBOX_LIMIT = 50  # runs of each kind drawn in full; the page says how many more there are

# Each kind of run the inbox shows: its status, its heading, and which of that status it holds.
INBOX_KINDS: tuple[tuple[RunStatus, str], ...] = (
    (RunStatus.BLOCKED, "Blocked: decide what happened"),
    (RunStatus.WAITING, "Waiting for approval"),
    (RunStatus.STOPPED, "Stopped by a limit"),
    (RunStatus.FAILED, "Failed: retry once the cause is fixed"),
)


def _needs_person(run: RunRecord) -> bool:
    if run.status is RunStatus.WAITING:  # a message or a timer is not a person's to give
        return waiting_kind(run.waiting_for or {}) not in (MESSAGE, SLEEP)
    return True


def _card(store: Store, run: RunRecord, now: int, typed: Typed | None) -> str:
    try:
        ledger = store.load_ledger(run.run_id)
        events = store.events(run.run_id)
    except SafepointError as exc:
        return f"<article class=card><p class=error>{e(run.run_id)}: {e(exc.message)}</p></article>"
    view = RunView(store, ledger, events, now, e(run_path(run.run_id)), back="inbox", typed=typed)
    sections = "".join(section(view) for section in DECISION_SECTIONS)
    return (
        f"<article class=card data-run='{e(run.run_id)}'><p><a href='{e(run_path(run.run_id))}'>"
        f"<b>{e(run.run_id)}</b></a> {status_badge(run, now)} <small>{e(run.workflow)}@"
        f"{e(run.workflow_version)}, changed {when(run.updated_at, now)}</small></p>{sections}</article>"
    )


def inbox_page(
    store: Store, now: int, *, flash: str | None = None, error: str | None = None, typed: Typed | None = None
) -> str:
    """What needs a person, kind by kind, each run with its decision and forms."""
    parts = []
    waiting_count = 0
    for status, heading in INBOX_KINDS:
        found = store.query_runs(RunQuery(status=status, limit=INBOX_LIMIT))
        runs = [run for run in found.runs if not isinstance(run, UnreadableRun) and _needs_person(run)]
        unreadable = [run for run in found.runs if isinstance(run, UnreadableRun)]
        if status is RunStatus.WAITING:
            waiting_count = found.total - len(runs)
        more = found.total - len(found.runs)
        cards = "".join(_card(store, run, now, typed) for run in reversed(runs))  # oldest first
        cards += "".join(
            f"<article class=card><p class=error>{e(run.run_id)}: unreadable: {e(run.reason)}</p></article>"
            for run in unreadable
        )
        tail = (
            f"<p class=muted>and {more} more:"
            f" <a href='/?status={status.value}'>all {status.value} runs</a></p>"
            if more > 0
            else ""
        )
        count = len(runs) + len(unreadable)
        parts.append(
            f"<section id='inbox-{status.value}'><h2>{e(heading)} <span class=badge>{count}</span></h2>"
            f"{cards or '<p class=muted>nothing</p>'}{tail}</section>"
        )
    note = (
        f"<p class=muted>{waiting_count} waiting run(s) wait for a message or a timer, not a person:"
        " <a href='/?status=waiting'>see them</a>.</p>"
        if waiting_count > 0
        else ""
    )
    # Not refreshed live: every card holds forms, and a refresh must never take a form away
    # from under a person's hands.
    return page("Inbox", note + "".join(parts), here="/inbox", flash=flash, error=error, live=False)


def workers_page(store: Store, now: int) -> str:
    """The running runs by worker: each lease's end, the last heartbeat, dead ones marked."""
    held, unreadable, total = workers(store, now)
    blocks = []
    for worker, runs in sorted(held.items()):
        dead = sum(1 for h in runs if h.expired)
        rows = "".join(
            f"<tr{' class=dead' if h.expired else ''}>"
            f"<td><a href='{e(run_path(h.run.run_id))}'>{e(h.run.run_id)}</a></td>"
            f"<td>{e(h.run.workflow)}@{e(h.run.workflow_version)}</td><td>{status_badge(h.run, now)}</td>"
            f"<td>{when(h.run.lease_expires_at, now)}</td>"
            f"<td>{when(h.run.heartbeat_at, now) if h.run.heartbeat_at else 'none since the claim'}</td>"
            f"<td>{h.run.fence}</td></tr>"
            for h in runs
        )
        name = e(worker) if worker else "nobody (released: the next claim carries these on)"
        flag = (
            f" <span class='badge dead'>{dead} lease(s) expired: worker gone or stalled</span>"
            if dead
            else ""
        )
        blocks.append(
            f"<section><h2>{name}{flag}</h2><table><tr><th>run</th><th>workflow</th><th>status</th>"
            f"<th>lease ends</th><th>last heartbeat</th><th>fence</th></tr>{rows}</table></section>"
        )
    if unreadable:
        rows = "".join(
            f"<tr><td>{e(run.run_id)}</td><td>{e(run.owner or '?')}</td>"
            f"<td class=s-blocked>{e(run.reason)}</td></tr>"
            for run in unreadable
        )
        blocks.append(
            "<section><h2>Unreadable here <span class='badge s-blocked'>unreadable</span></h2>"
            f"<table><tr><th>run</th><th>worker</th><th>why</th></tr>{rows}</table></section>"
        )
    shown = sum(len(runs) for runs in held.values()) + len(unreadable)
    summary = f"<p>{total} running run(s)" + (f", {shown} shown" if shown < total else "") + "</p>"
    body = summary + ("".join(blocks) or "<p class=muted>No worker holds a run.</p>")
    return page("Workers", f"<div data-live=workers>{body}</div>", here="/workers")
