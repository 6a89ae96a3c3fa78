"""A run's history on its page: the timeline of its steps and effects, its effect operations
and its events, each a live region of one table, each value whole on demand."""

from __future__ import annotations

from ..types import EventRecord, Ledger
from .dashboard_layout import Html, duration, table_section, value_cell, when
from .dashboard_timeline import timeline

__all__ = ["events_section", "operations_section", "timeline_section"]


def timeline_section(ledger: Ledger, events: list[EventRecord]) -> Html:
    """The steps and effects in order, each with its start, end, duration and kind; an effect's
    operation with its protocol state and dispatch count; each value whole on demand."""
    entries = timeline(ledger, events)
    if not entries:
        return Html(
            "<section data-live=timeline><h2>Timeline</h2><p class=muted>no step recorded yet</p></section>"
        )
    first = min(entry.start for entry in entries)
    last = max(entry.end for entry in entries)
    total = max(1, last - first)
    rows = []
    for entry in entries:
        step, op = entry.step, entry.operation
        left = 100 * (entry.start - first) / total
        width = max(0.5, 100 * entry.duration / total)
        effect = (
            Html("{} <code>{}</code><br><span class=badge>{}</span> {} dispatch{}").format(
                op.effect,
                op.operation_id,
                op.state.value,
                op.dispatch_count,
                "es" if op.dispatch_count != 1 else "",
            )
            if op
            else Html()
        )
        value = step.result if step.error is None else step.error
        status_word: Html | str = step.status.value
        shown_value = value_cell(f"step-{step.seq}", value)
        if entry.in_flight and op is not None:
            status_word = Html("<b>in flight: {}</b>").format(op.state.value)
            shown_value = Html("<span class=muted>not recorded: its outcome is not settled</span>")
        rows.append(
            Html(
                "<tr><td>{seq}</td><td><span class=badge>{kind}</span></td>"
                "<td>{step}<br><small>{name}</small></td><td>{status}{attempt}</td>"
                "<td>{start}<br><small>from {start_from}</small></td>"
                "<td>{end}</td><td>{took}</td>"
                "<td class=bar><span class='k-{kind} {state}'"
                " data-left='{left:.1f}' data-width='{width:.1f}'></span></td>"
                "<td>{effect}</td><td>{value}</td></tr>"
            ).format(
                seq=step.seq,
                kind=step.kind.value,
                step=step.step_id,
                name=step.name,
                status=status_word,
                attempt=f" (attempt {step.attempt})" if step.attempt > 1 else "",
                start=when(entry.start),
                start_from=entry.start_from,
                end=when(entry.end),
                took=duration(entry.duration),
                state=step.status.value,
                left=left,
                width=width,
                effect=effect,
                value=shown_value,
            )
        )
    note = Html(
        "<p class=muted>A step's start is derived: an effect step's from its operation's preparation,"
        " any other's from the step before it or the claim after that.</p>"
    )
    headers = ("#", "kind", "step", "status", "start (UTC)", "end", "took", "", "effect", "value")
    return table_section("timeline", "Timeline", headers, Html().join(rows), note)


def operations_section(ledger: Ledger) -> Html:
    """Every effect operation: its protocol state, dispatches, key, and receipt or error."""
    ops = Html().join(
        Html(
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td><span class=badge>{}</span></td>"
            "<td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>"
        ).format(
            op.operation_id,
            op.step_id,
            op.effect,
            op.state.value,
            op.dispatch_count,
            op.effect_key,
            when(op.prepared_at),
            value_cell(f"outcome-{op.operation_id}", op.receipt if op.error is None else op.error),
        )
        for op in ledger.operations.values()
    )
    if not ops:
        return Html()
    headers = ("operation", "step", "effect", "state", "dispatches", "effect key", "prepared (UTC)")
    return table_section("operations", "Effect operations", (*headers, "receipt / error"), ops)


def events_section(events: list[EventRecord]) -> Html:
    """Every event of the run, oldest first, each detail whole on demand."""
    rows = Html().join(
        Html("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>").format(
            when(event.at),
            event.kind,
            event.step_id or "",
            event.operation_id or "",
            event.worker or "",
            event.fence or "",
            "" if event.detail is None else value_cell(f"event-{event.event_id}", event.detail),
        )
        for event in events
    )
    headers = ("at (UTC)", "event", "step", "operation", "worker", "fence", "detail")
    return table_section("events", "Events", headers, rows)
