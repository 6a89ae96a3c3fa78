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
from .dashboard_layout import Html, page, run_path, when
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


def _card(store: Store, run: RunRecord, now: int, typed: Typed | None) -> Html:
    try:
        ledger = store.load_ledger(run.run_id)
        events = store.events(run.run_id)
    except SafepointError as exc:
        return Html("<article class=card><p class=error>{}: {}</p></article>").format(run.run_id, exc.message)
    view = RunView(store, ledger, events, now, run_path(run.run_id), back="inbox", typed=typed)
    sections = Html().join(section(view) for section in DECISION_SECTIONS)
    return Html(
        "<article class=card data-run='{id}'><p><a href='{href}'><b>{id}</b></a> {badge} <small>{workflow}@"
        "{version}, changed {changed}</small></p>{sections}</article>"
    ).format(
        id=run.run_id,
        href=run_path(run.run_id),
        badge=status_badge(run, now),
        workflow=run.workflow,
        version=run.workflow_version,
        changed=when(run.updated_at, now),
        sections=sections,
    )


def inbox_page(
    store: Store, now: int, *, flash: str | None = None, error: str | None = None, typed: Typed | None = None
) -> Html:
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
        cards = Html().join(_card(store, run, now, typed) for run in reversed(runs))  # oldest first
        cards += Html().join(
            Html("<article class=card><p class=error>{}: unreadable: {}</p></article>").format(
                run.run_id, run.reason
            )
            for run in unreadable
        )
        tail = (
            Html("<p class=muted>and {0} more: <a href='/?status={1}'>all {1} runs</a></p>").format(
                more, status.value
            )
            if more > 0
            else ""
        )
        count = len(runs) + len(unreadable)
        parts.append(
            Html("<section id='inbox-{}'><h2>{} <span class=badge>{}</span></h2>{}{}</section>").format(
                status.value, heading, count, cards or Html("<p class=muted>nothing</p>"), tail
            )
        )
    note = (
        Html(
            "<p class=muted>{} waiting run(s) wait for a message or a timer, not a person:"
            " <a href='/?status=waiting'>see them</a>.</p>"
        ).format(waiting_count)
        if waiting_count > 0
        else Html()
    )
    # Not refreshed live: every card holds forms, and a refresh must never take a form away
    # from under a person's hands.
    return page("Inbox", note + Html().join(parts), here="/inbox", flash=flash, error=error, live=False)


def workers_page(store: Store, now: int) -> Html:
    """The running runs by worker: each lease's end, the last heartbeat, dead ones marked."""
    held, unreadable, total = workers(store, now)
    blocks = []
    for worker, runs in sorted(held.items()):
        dead = sum(1 for h in runs if h.expired)
        rows = Html().join(
            Html(
                "<tr{dead}><td><a href='{href}'>{id}</a></td><td>{workflow}@{version}</td><td>{badge}</td>"
                "<td>{lease}</td><td>{heartbeat}</td><td>{fence}</td></tr>"
            ).format(
                dead=Html(" class=dead") if h.expired else "",
                href=run_path(h.run.run_id),
                id=h.run.run_id,
                workflow=h.run.workflow,
                version=h.run.workflow_version,
                badge=status_badge(h.run, now),
                lease=when(h.run.lease_expires_at, now),
                heartbeat=when(h.run.heartbeat_at, now) if h.run.heartbeat_at else "none since the claim",
                fence=h.run.fence,
            )
            for h in runs
        )
        name = worker or "nobody (released: the next claim carries these on)"
        flag = (
            Html(" <span class='badge dead'>{} lease(s) expired: worker gone or stalled</span>").format(dead)
            if dead
            else ""
        )
        blocks.append(
            Html(
                "<section><h2>{}{}</h2><table><tr><th>run</th><th>workflow</th><th>status</th>"
                "<th>lease ends</th><th>last heartbeat</th><th>fence</th></tr>{}</table></section>"
            ).format(name, flag, rows)
        )
    if unreadable:
        rows = Html().join(
            Html("<tr><td>{}</td><td>{}</td><td class=s-blocked>{}</td></tr>").format(
                run.run_id, run.owner or "?", run.reason
            )
            for run in unreadable
        )
        blocks.append(
            Html(
                "<section><h2>Unreadable here <span class='badge s-blocked'>unreadable</span></h2>"
                "<table><tr><th>run</th><th>worker</th><th>why</th></tr>{}</table></section>"
            ).format(rows)
        )
    shown = sum(len(runs) for runs in held.values()) + len(unreadable)
    summary = Html("<p>{} running run(s){}</p>").format(total, f", {shown} shown" if shown < total else "")
    body = summary + (Html().join(blocks) or Html("<p class=muted>No worker holds a run.</p>"))
    return page("Workers", Html("<div data-live=workers>{}</div>").format(body), here="/workers")
