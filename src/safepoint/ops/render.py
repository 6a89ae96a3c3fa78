"""What the command line prints: a run's header, its step timeline, its events — as data.

Everything printed here comes from a ledger that any process may have written, so every value
passes through ``shown`` on its way to the terminal: control characters (ESC, BEL, CR, the C1
controls), bidirectional overrides and invisible separators come out as visible escapes
(``\\x1b``), never as instructions to the terminal. Cells and lines are built as rich ``Text``,
which never reads markup, so an id like ``[/red]`` is printed as it is. JSON output (``show
--json``, ``record``, ``resume``) goes through ``as_json``, which escapes the same characters the
JSON way (``\\u001b``), so it stays valid, whole JSON.

Times are ISO 8601 UTC instants, beside how far from now they are (``in 25s``, ``3m ago``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._rules.approvals import revocable
from .._rules.kinds import KINDS
from .._rules.limits import stop_words
from .._rules.moments import instant, relative, when
from .._rules.presence import HELD, LEASE_EXPIRED, RELEASED, Ownership, ownership
from .._rules.records import record_fields
from .._rules.run_file import RecordedRun
from .._rules.run_file import run_document as file_document
from .._rules.waits import MESSAGE, SLEEP, waiting_kind
from ..errors import SafepointError
from ..storage.base import Store
from ..types import (
    ApprovalRecord,
    EffectState,
    EventRecord,
    Ledger,
    MessageRecord,
    RunRecord,
    RunStatus,
    StepKind,
    StepStatus,
    UnreadableRun,
)

_PREVIEW_WIDTH = 48
_UNBOUNDED_WIDTH = 10_000

RUN_STYLES: dict[RunStatus, str] = {
    RunStatus.PENDING: "blue",
    RunStatus.RUNNING: "cyan",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.BLOCKED: "bold red",
    RunStatus.CANCELLED: "dim",
    RunStatus.WAITING: "bold magenta",  # an approval, a message or a timer is awaited
    RunStatus.STOPPED: "bold yellow",  # a limit was reached: raise it to carry on
    RunStatus.CONTINUED: "green dim",
}

EFFECT_STYLES: dict[EffectState, str] = {
    EffectState.PREPARED: "blue",
    EffectState.DISPATCHING: "bold yellow",  # "may have happened": the state to notice
    EffectState.APPLIED: "yellow",
    EffectState.REJECTED: "red",
    EffectState.UNKNOWN: "bold red",
    EffectState.ACCEPTED: "green",
}

# A running run as its owner makes it: held by a live worker, or not really running at all.
_PRESENCE: dict[str, tuple[str, str]] = {
    HELD: ("running", RUN_STYLES[RunStatus.RUNNING]),
    LEASE_EXPIRED: ("lease expired", "bold yellow"),
    RELEASED: ("released", "yellow"),
}


# -- values as data ------------------------------------------------------------------------------

# C0 controls (ESC, BEL, CR, backspace, newline, …), DEL, the C1 controls (U+009B is CSI to some
# terminals), and the characters that reorder or hide text: bidi marks, embeddings, overrides
# and isolates, zero-width characters, line and paragraph separators, the byte-order mark.
_TERMINAL_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
# The same, less what JSON already escapes (C0): what may appear raw inside a JSON string.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def shown(value: object) -> str:
    """``value`` as text that is safe to print: every control or invisible character escaped
    visibly (``\\x1b``, ``\\u202e``). Markup stays literal as long as it is printed as
    ``Text`` (or with markup off), as everything here is."""
    return _TERMINAL_UNSAFE.sub(_visible, str(value))


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def as_json(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as whole, valid JSON that is safe to print: non-ASCII text stays readable,
    control and invisible characters are ``\\u`` escapes."""
    text = json.dumps(
        value,
        indent=indent,
        ensure_ascii=False,
        default=_json_default,
        separators=None if indent else (",", ":"),
    )
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _json_default(value: Any) -> Any:
    if isinstance(value, type):  # Retry.retry_on: exception classes
        return value.__qualname__
    return str(value)


def preview(value: Any, width: int = _PREVIEW_WIDTH) -> str:
    """A value as compact one-line JSON, cut to ``width`` characters."""
    text = as_json(value, indent=None)
    return text if len(text) <= width else text[: width - 1] + "…"


def text(value: object, style: str = "") -> Text:
    """A value as a ``Text`` that is safe to print (see ``shown``); never read as markup."""
    return Text(shown(value), style=style)


def say(console: Console, *parts: str | Text, style: str = "") -> None:
    """Print one line of prose made of ``parts`` (data passes through ``shown``; a part that is
    already a ``Text`` is sanitized too), soft-wrapped so that it reads whole in a pipe."""
    line = Text(style=style)
    for part in parts:
        line.append_text(_clean(part))
    console.print(line, soft_wrap=True)


def _clean(part: str | Text) -> Text:
    if isinstance(part, str):
        return text(part)
    if shown(part.plain) == part.plain:
        return part
    return Text(shown(part.plain), style=part.style)


# -- times ---------------------------------------------------------------------------------------


# instant, relative and when: see ``_rules.moments``.


def ago(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` the moment ``ms`` was; past a week, its date (UTC)."""
    if now_ms - ms >= 7 * 86_400_000:
        return instant(ms)[:10]
    return relative(min(ms, now_ms), now_ms)


_RAW_INSTANT = r"(?:epoch ms )?(?<!\d){}(?!\d)"


def error_text(exc: SafepointError, now: int) -> str:
    """An error's message as the CLI prints it, nothing unsafe in it, and each moment the
    error carries (a field named ``…_at``, in epoch ms) readable: in place where the message
    quotes it raw, else said after it (``lease expires at 2030-…Z (in 25s)``)."""
    message = exc.message
    for name, value in sorted(vars(exc).items()):
        if name.endswith("_at") and type(value) is int:
            readable, found = re.subn(_RAW_INSTANT.format(value), when(value, now), message)
            message = readable if found else f"{message} ({name.replace('_', ' ')} {when(value, now)})"
    return shown(message)


def _readable_times(value: Any) -> Any:
    """An event's detail with each ``…_at`` moment as an instant, for its preview."""
    if isinstance(value, dict):
        return {
            key: instant(item)
            if isinstance(key, str) and key.endswith("_at") and type(item) is int
            else _readable_times(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_readable_times(item) for item in value]
    return value


# -- tables --------------------------------------------------------------------------------------


def print_table(console: Console, table: Table) -> None:
    """Print a table one line per row.

    On a terminal the table fits the window: the columns marked squeezable are cut with … first.
    Into a pipe or a file it keeps its natural width instead, so that `safepoint show RUN | grep`
    finds whole effect keys and step ids rather than fragments.
    """
    if console.is_terminal:
        console.print(table)
        return
    unbounded = console.options.update_width(_UNBOUNDED_WIDTH)
    needed = console.measure(table, options=unbounded).maximum
    # Console.print(width=) can only narrow the output, so widen the console for this table.
    saved = console.width
    console.width = max(saved, needed)
    try:
        console.print(table)
    finally:
        console.width = saved


def _table(*columns: str, squeeze: tuple[str, ...] = ()) -> Table:
    """A borderless table; only the ``squeeze`` columns give up width on a narrow terminal."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in columns:
        # rich narrows only wrappable columns before cutting every column evenly; cells are
        # never wrapped anyway (see _row), so "wrappable" here just means "may be narrowed".
        table.add_column(name, no_wrap=name not in squeeze, overflow="ellipsis")
    return table


def _row(table: Table, *cells: str | Text) -> None:
    """Add a row of data, each cell safe to print, never wrapped: one line per row, cut with …
    when squeezed."""
    texts = []
    for cell in cells:
        safe = _clean(cell).copy()
        safe.no_wrap, safe.overflow = True, "ellipsis"
        texts.append(safe)
    table.add_row(*texts)


def status_cell(run: RunRecord, now: int) -> Text:
    """A run's status as it really stands: a ``running`` run nobody holds says so."""
    presence = _PRESENCE.get(ownership(run, now).state)
    if run.status is RunStatus.RUNNING and presence is not None:
        return Text(presence[0], style=presence[1])
    return Text(run.status.value, style=RUN_STYLES[run.status])


def owner_cell(run: RunRecord, now: int) -> str:
    """Who holds the run, in a word or two: ``w-1 (lease ends in 25s)``."""
    held = ownership(run, now)
    if held.owner is None:
        return "(nobody)" if held.state == RELEASED else ""
    if held.lease_expires_at is None:
        return held.owner
    verb = "expired" if held.state == LEASE_EXPIRED else "ends"
    return f"{held.owner} (lease {verb} {relative(held.lease_expires_at, now)})"


def runs_table(found: Iterable[RunRecord | UnreadableRun], now: int) -> Table:
    """The runs, one row each: who holds a running one, and what a blocked or waiting one
    needs; a run whose row cannot be read, as such."""
    table = _table(
        "run",
        "workflow",
        "status",
        "owner",
        "resumes",
        "fence",
        "updated",
        "phase",
        squeeze=("workflow", "owner", "phase"),
    )
    for run in found:
        if isinstance(run, UnreadableRun):
            _unreadable_row(table, run, now)
            continue
        phase = Text("")
        if run.status is RunStatus.BLOCKED:
            phase = text((run.recovery_record or {}).get("phase", ""), "red")
        elif run.status is RunStatus.WAITING:
            phase = text(waiting_summary(run.waiting_for, now), "magenta")
        elif run.status is RunStatus.STOPPED:
            phase = text(stop_words(run.recovery_record or {}), "yellow")
        elif run.successor_run_id:
            phase = text(f"→ {run.successor_run_id}")
        _row(
            table,
            run.run_id,
            f"{run.workflow}@{run.workflow_version}",
            status_cell(run, now),
            owner_cell(run, now),
            str(run.resume_count),
            str(run.fence),
            ago(run.updated_at, now),
            phase,
        )
    return table


def _unreadable_row(table: Table, run: UnreadableRun, now: int) -> None:
    """A run whose row cannot be read: what could, and why the rest cannot (its status, when
    that can be read, leads the reason)."""
    known = "" if run.status is None else f"{run.status.value}: "
    _row(
        table,
        run.run_id,
        f"{run.workflow or '?'}@{run.workflow_version or '?'}",
        Text("unreadable", style="bold red"),
        text(run.owner or ""),
        *("?" if value is None else str(value) for value in (run.resume_count, run.fence)),
        "?" if run.updated_at is None else ago(run.updated_at, now),
        text(known + run.reason, "red"),
    )


def timeline_table(ledger: Ledger, now: int | None = None) -> Table:
    """One row per recorded step in ``seq`` order, then every operation still in flight.

    An effect's step row is written only when the effect is accepted, so an operation that is
    prepared, dispatching, unknown, applied or rejected has no step yet: it is listed after the
    steps, because that is exactly what a person resolving a blocked run needs to see.
    """
    table = _table(
        "#", "kind", "step", "result", "operation", "effect", "effect key", squeeze=("result", "effect key")
    )
    shown_ops: set[str] = set()
    for step in sorted(ledger.steps.values(), key=lambda s: s.seq):
        operation = effect = key = Text("")
        if KINDS[step.kind].has_operation and step.operation_id:
            shown_ops.add(step.operation_id)
            op = ledger.operations.get(step.operation_id)
            operation = text(step.operation_id)
            if op is not None:
                effect = Text(op.state.value, style=EFFECT_STYLES[op.state])
                key = text(op.effect_key, "dim")
        result: str | Text = preview(step.result)
        if step.status is StepStatus.FAILED:
            # A failed step is recorded and raised again on replay: show why, not a null result.
            error = step.error or {}
            result = text(f"✗ {error.get('type', 'error')}: {error.get('message', '')}", "red")
        elif KINDS[step.kind].picks_next and step.next_step_id:
            result = f"→ {step.next_step_id}"
        _row(table, str(step.seq), step.kind.value, step.step_id, result, operation, effect, key)
    for op in sorted(ledger.operations.values(), key=lambda o: o.prepared_at):
        if op.operation_id in shown_ops:
            continue
        evidence = op.error if op.state is EffectState.REJECTED else "(no outcome recorded)"
        if op.state is EffectState.PREPARED and op.approval_required and op.dispatch_count == 0:
            evidence = "(not dispatched: needs approval)"
        _row(
            table,
            "…",
            StepKind.EFFECT.value,
            op.step_id,
            preview(evidence),
            op.operation_id,
            Text(op.state.value, style=EFFECT_STYLES[op.state]),
            text(op.effect_key, "dim"),
        )
    _retry_rows(table, ledger, ledger.run.updated_at if now is None else now)
    return table


def _retry_rows(table: Table, ledger: Ledger, now: int) -> None:
    """A step waiting to be tried again has no step row yet: show its last failed attempt."""
    for step_id, tried in sorted(ledger.attempts.items()):
        last, step = tried[-1], ledger.steps.get(step_id)
        if last.kind is StepKind.WAIT:  # not a failure: the instant a wait times out at
            if step is None:
                when_out = when(last.retry_at, now)
                waits = text(f"⧗ waiting; times out {when_out}", "magenta")
                _row(table, "…", last.kind.value, step_id, waits, "", "", "")
            continue
        if step is not None and step.attempt > last.attempt:
            continue  # it was recorded after this attempt: its row above says how it ended
        error = last.error
        _row(
            table,
            "…",
            last.kind.value,
            step_id,
            text(
                f"⟳ attempt {last.attempt} failed ({error.get('type', 'error')}:"
                f" {error.get('message', '')}); next at {when(last.retry_at, now)}",
                "yellow",
            ),
            "",
            "",
            "",
        )


def events_table(events: Iterable[EventRecord]) -> Table:
    """What happened to a run, when (UTC), by which worker under which fence."""
    table = _table(
        "at", "event", "step", "operation", "worker", "fence", "detail", squeeze=("worker", "detail")
    )
    for event in events:
        _row(
            table,
            instant(event.at, millis=True),
            event.kind,
            event.step_id or "",
            event.operation_id or "",
            event.worker or "",
            "" if event.fence is None else str(event.fence),
            "" if event.detail is None else preview(_readable_times(event.detail)),
        )
    return table


# -- one run -------------------------------------------------------------------------------------


def _header(run: RunRecord, now: int) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()

    def row(label: str, value: str | Text) -> None:
        grid.add_row(Text(label), _clean(value))

    row("run", run.run_id)
    held = ownership(run, now)
    status = status_cell(run, now)
    if status.plain != run.status.value:  # not what the ledger's status says: say both
        status.append(f" (status {run.status.value})", style="dim")
    row("status", status)
    if held.owner is not None or held.state == RELEASED:
        row("owner", _owner_line(held, now))
    row("workflow", f"{run.workflow}@{run.workflow_version}")
    row("inputs", preview(run.inputs, 200))
    if run.status is RunStatus.COMPLETED:
        row("result", preview(run.result, 200))
    if run.error:
        row("error", text(f"{run.error.get('type', 'error')}: {run.error.get('message', '')}", "red"))
    if run.cancel_requested_at is not None and not run.status.terminal:
        row("cancel", f"requested {when(run.cancel_requested_at, now)}")
    if run.parent_run_id:
        row("continues", f"{run.parent_run_id} (run {run.chain_index + 1} of chain {run.chain_id})")
    if run.successor_run_id:
        row("continued as", run.successor_run_id)
    if run.forked_from:
        row("forked from", fork_line(run.forked_from))
    row("history", _history(run))
    row(
        "resumes",
        str(run.resume_count) + (f" of {run.resume_budget}" if run.resume_budget is not None else ""),
    )
    _limit_rows(row, run, now)
    row("fence", str(run.fence))
    row("revision", str(run.state_revision))
    row("created", when(run.created_at, now))
    row("updated", when(run.updated_at, now))
    return grid


def fork_line(forked: dict[str, Any]) -> str:
    """A fork's origin as a person reads it: the run and step, and what it sends again."""
    line = f"{forked.get('run_id')} at step {forked.get('step_id')}"
    if forked.get("resend"):
        line += f" (sends again, under its own key: {', '.join(map(str, forked['resend']))})"
    return line


def _owner_line(held: Ownership, now: int) -> Text:
    """The owner row: who, until when, and what that means for the run."""
    if held.owner is None:
        return text(held.label, "yellow")
    lease = (
        ""
        if held.lease_expires_at is None
        else (
            f", lease {'expired' if held.state == LEASE_EXPIRED else 'until'}"
            f" {when(held.lease_expires_at, now)}"
        )
    )
    line = text(f"{held.owner}{lease}")
    if held.state == LEASE_EXPIRED:
        line.append(
            " — its worker is gone or stalled: any worker (or a resume) takes the run over", style="yellow"
        )
    return line


def _limit_rows(row: Any, run: RunRecord, now: int) -> None:
    """The run's own limits, with what it spent against each."""
    if run.deadline_at is not None:
        row("deadline", when(run.deadline_at, now))
    if run.token_budget is not None or run.tokens_spent:
        limit = "" if run.token_budget is None else f" of {run.token_budget}"
        row("tokens", f"{run.tokens_spent}{limit} spent")
    if run.cost_budget is not None or run.cost_spent:
        limit = "" if run.cost_budget is None else f" of {run.cost_budget:g}"
        row("cost", f"{run.cost_spent:g}{limit} spent")
    if run.model_call_budget is not None or run.model_calls_spent:
        limit = "" if run.model_call_budget is None else f" of {run.model_call_budget}"
        row("model calls", f"{run.model_calls_spent}{limit} made")
    if run.step_attempts is not None or run.step_attempt_limit is not None:
        attempts = "" if run.step_attempts is None else str(run.step_attempts.attempts)
        raised = "" if run.step_attempt_limit is None else f"raised to {run.step_attempt_limit}"
        row("step attempts", " ".join(part for part in (attempts, raised) if part))


def _history(run: RunRecord) -> Text:
    """``812 events and steps (limits: soft 10000, hard 50000)``: the run's history."""
    line = Text(f"{run.history_size} events and steps")
    limits = [
        f"{name} {value}"
        for name, value in (("soft", run.history_soft_limit), ("hard", run.history_hard_limit))
        if value is not None
    ]
    line.append(f" (limits: {', '.join(limits)})" if limits else " (no limit)")
    if run.history_warned_at is not None:
        line.append(" past the soft limit: continue it as new", style="yellow")
    return line


def _print_blocked(console: Console, run: RunRecord) -> None:
    record = run.recovery_record or {}
    console.rule(text(f"blocked: {record.get('phase', '?')}", "bold red"), align="left")
    say(console, text(record.get("reason", "no reason recorded"), "bold"))
    if record.get("operation_id"):
        say(
            console,
            f"operation {record['operation_id']} ({record.get('effect')},"
            f" {record.get('effect_status')}) effect key {record.get('effect_key')}",
        )
    console.print(Text("next actions:", style="bold"))
    for action in record.get("next_actions", []):
        say(console, f"  • {_filled_in(str(action), run.run_id, record)}")
    say(console, f"full recovery record: safepoint record {shlex.quote(run.run_id)}")


def _print_stopped(console: Console, run: RunRecord) -> None:
    """A run stopped at a limit: which, how far it spent, the step it stopped before, and the
    command that raises it."""
    record = run.recovery_record or {}
    console.rule(text(f"stopped: its {record.get('limit', '?')} limit", "bold yellow"), align="left")
    say(console, text(stop_words(record), "bold"))
    say(console, text(record.get("reason", "no reason recorded")))
    console.print(Text("next actions:", style="bold"))
    for action in record.get("next_actions", []):
        say(console, f"  • {_filled_in(str(action), run.run_id, record)}")
    say(console, f"full recovery record: safepoint record {shlex.quote(run.run_id)}")


def _filled_in(action: str, run_id: str, record: dict[str, Any]) -> str:
    """A next action as a command to copy: this run's id and the revision the block made."""
    for verb in ("resolve", "limits", "resume", "cancel"):
        action = action.replace(f"safepoint {verb} RUN", f"safepoint {verb} {shlex.quote(run_id)}")
    revision = record.get("state_revision")
    return action if revision is None else action.replace("<state_revision>", str(revision))


def waiting_summary(waiting_for: dict[str, Any] | None, now: int) -> str:
    """What a waiting run waits for, in a few words: an approval of a step, a message (and
    when it stops waiting for it), or the end of a sleep."""
    waiting = waiting_for or {}
    kind = waiting_kind(waiting)
    if kind == MESSAGE:
        timeout = waiting.get("timeout_at")
        until = "" if timeout is None else f", times out {when(int(timeout), now)}"
        return f"message {waiting.get('name')!r}{until}"
    if kind == SLEEP:
        return f"sleep until {when(int(waiting.get('until') or 0), now)}"
    return f"approval of {waiting.get('step_id')}"


def _print_waiting(console: Console, store: Store, run: RunRecord, now: int) -> None:
    """What a waiting run waits for: a message (and how to send it), its timer, or the exact
    payload a person is asked to approve, its digest, and the command that approves it."""
    waiting = run.waiting_for or {}
    if waiting_kind(waiting) in (MESSAGE, SLEEP):
        _print_waiting_outside(console, run, waiting, now)
        return
    console.rule(Text("waiting for approval", style="bold magenta"), align="left")
    say(console, text(waiting.get("reason", ""), "bold"))
    step = str(waiting.get("step_id"))
    say(console, f"step {step}, operation {waiting.get('operation_id')} ({waiting.get('effect')})")
    digest = str(waiting.get("payload_digest"))
    say(console, f"payload {digest}:")
    try:
        payload = json.loads(store.get_artifact(digest))
        # as_json escapes every unsafe character inside strings; its lines are its own
        console.print(Text(as_json(payload)), soft_wrap=True)
    except SafepointError as exc:  # the person must see it: say plainly that it is missing
        say(console, text(f"(the payload cannot be read: {exc.message})", "red"))
    target = waiting.get("target_digest")
    say(console, f"target state {target or '(the effect reads none)'}")
    console.print(Text("approve it:", style="bold"))
    say(
        console,
        f"  safepoint approve {shlex.quote(run.run_id)} {shlex.quote(step)} --by <you>"
        f" --payload-digest {digest} [--expires 2h] [--evidence '<why>']",
    )
    say(
        console,
        f"  then a worker carries it on, or: safepoint resume {shlex.quote(run.run_id)} --import <module>",
    )


def _print_waiting_outside(console: Console, run: RunRecord, waiting: dict[str, Any], now: int) -> None:
    """A run waiting for a message (and how to answer it), or sleeping (until when)."""
    rid, step = shlex.quote(run.run_id), str(waiting.get("step_id"))
    if waiting_kind(waiting) == SLEEP:
        console.rule(Text("sleeping", style="bold magenta"), align="left")
        say(console, f"step {step} sleeps until {when(int(waiting.get('until') or 0), now)}")
        say(console, "a worker carries the run on once it is due (safepoint worker --import <module>)")
        return
    name = str(waiting.get("name"))
    console.rule(Text("waiting for a message", style="bold magenta"), align="left")
    since = waiting.get("since")
    say(
        console,
        f"step {step} waits for message {name!r}" + ("" if since is None else f" since {when(since, now)}"),
    )
    timeout = waiting.get("timeout_at")
    if timeout is not None:
        say(console, f"it times out {when(int(timeout), now)}: a worker then carries the run on without it")
    console.print(Text("answer it (once: a second answer to this wait is refused):", style="bold"))
    say(
        console,
        f"  safepoint answer {rid} {shlex.quote(name)} --wait {shlex.quote(step)} --payload '<json>'"
        " [--message-id <id>] [--by <you>]",
    )


def message_line(message: MessageRecord, now: int) -> str:
    """One message as `safepoint show` lists it: its name, who sent it when, whether a wait
    took it, and its payload (shortened)."""
    sender = f" by {message.sent_by}" if message.sent_by else ""
    delivery = f" (message id {message.message_id})" if message.message_id else ""
    taken = (
        f"taken by step {message.taken_by} {when(message.taken_at or 0, now)}"
        if message.taken_by
        else "kept: no wait took it yet"
    )
    if message.for_wait is not None:
        taken = f"answers wait {message.for_wait}, {taken}"
    payload = as_json(message.payload, indent=None)
    if len(payload) > _PREVIEW_WIDTH * 2:
        payload = payload[: _PREVIEW_WIDTH * 2] + "…"
    return f"#{message.seq} {message.name}{sender} {when(message.sent_at, now)}{delivery}: {taken}; {payload}"


def _print_messages(console: Console, store: Store, run_id: str, now: int) -> None:
    """Every message sent to the run, oldest first."""
    sent = store.messages(run_id)
    if not sent:
        return
    console.print()
    console.rule("messages", align="left")
    for message in sent:
        say(console, f"  {message_line(message, now)}")


def approval_line(approval: ApprovalRecord, now: int) -> str:
    """One approval as `safepoint show` lists it: who, when, what for — and a revocation."""
    expiry = "no expiry" if approval.expires_at is None else f"expires {when(approval.expires_at, now)}"
    line = (
        f"step {approval.step_id}: approved by {approval.approved_by} at"
        f" {when(approval.approved_at, now)}, {expiry}, for payload"
        f" {approval.payload_digest[:19]}… target {(approval.target_digest or 'none')[:19]}"
    )
    if approval.revoked_at is not None:
        line += (
            f" — REVOKED by {approval.revoked_by} at {when(approval.revoked_at, now)}:"
            f" {approval.revoke_reason}"
        )
    return line


def _print_approvals(console: Console, store: Store, ledger: Ledger, now: int) -> None:
    """Every approval given in the run, revoked ones marked, and how to take back one still
    in force of an effect not yet dispatched."""
    given = store.approvals(ledger.run.run_id)
    if not given:
        return
    console.print()
    console.rule("approvals", align="left")
    for approval in given:
        say(console, f"  {approval_line(approval, now)}")
    for step in revocable(ledger.run, ledger.operations, given):
        say(
            console,
            f"  take it back: safepoint revoke {shlex.quote(ledger.run.run_id)}"
            f" {shlex.quote(step)} --by <you> --reason '<why>'",
        )


def slices_line(run: RunRecord, events: Iterable[EventRecord], now: int) -> str | None:
    """What the run's slices came to (``slice=``, ``--slice``): how many ended, the last one
    when, before which step and after how long, and — while the run stands released where the
    last one left it — that the next call carries it on. None for a run never cut in slices."""
    events = list(events)
    ended = [e for e in events if e.kind == "run.slice_ended"]
    if not ended:
        return None
    last, detail = ended[-1], ended[-1].detail or {}
    claimed_since = any(e.kind == "run.claimed" and e.event_id > last.event_id for e in events)
    before = f" before step {last.step_id}" if last.step_id else ""
    line = (
        f"{len(ended)} slice{'s' if len(ended) > 1 else ''} ended; the last {when(last.at, now)}{before},"
        f" {detail.get('elapsed_ms', '?')} ms into a slice of {detail.get('slice_ms', '?')} ms"
    )
    if run.status is RunStatus.RUNNING and run.owner is None and not claimed_since:
        line += " — released there: the next resume (or a worker) carries it on at once"
    return line


def print_run(console: Console, store: Store, run_id: str) -> None:
    """The run header, its step timeline and its events: the body of `safepoint show`."""
    ledger = store.load_ledger(run_id)
    now = store.now()
    events = store.events(run_id)
    print_table(console, _header(ledger.run, now))  # whole lines in a pipe, too
    if (sliced := slices_line(ledger.run, events, now)) is not None:
        console.print()
        say(console, text("slices: ", "bold"), sliced)
    if ledger.run.status is RunStatus.BLOCKED:
        console.print()
        _print_blocked(console, ledger.run)
    if ledger.run.status is RunStatus.WAITING:
        console.print()
        _print_waiting(console, store, ledger.run, now)
    if ledger.run.status is RunStatus.STOPPED:
        console.print()
        _print_stopped(console, ledger.run)
    _print_approvals(console, store, ledger, now)
    _print_messages(console, store, run_id, now)
    console.print()
    console.rule("steps", align="left")
    print_table(console, timeline_table(ledger, now))
    console.print()
    console.rule("events", align="left")
    print_table(console, events_table(events))


_PARTS_SHOWN = ("steps", "operations", "attempts", "approvals", "messages", "events")


def run_document(store: Store, run_id: str) -> dict[str, Any]:
    """Everything the ledger holds about a run, whole, as one JSON-ready document: the body of
    `safepoint show --json`. Times stay epoch milliseconds on the store's clock (``now`` is
    that clock when it was read); ``ownership`` says who holds the run at ``now``. The parts are
    the run file's (``safepoint export``), but for what a person reading the run is shown
    besides: an operation whose payload cannot be read has it null, beside ``payload_error``,
    and the run's step attempts name the exception classes they retry (``retry_on``)."""
    ledger = store.load_ledger(run_id)
    now = store.now()
    payloads: dict[str, bytes] = {}
    unread: dict[str, str] = {}
    for op in ledger.operations.values():
        try:
            payloads[op.payload_ref] = store.get_artifact(op.payload_ref)
        except SafepointError as exc:
            unread[op.payload_ref] = exc.message
    recorded = RecordedRun(
        ledger.run,
        ledger.steps,
        ledger.operations,
        ledger.attempts,
        store.approvals(run_id),
        store.messages(run_id),
        store.events(run_id),
        payloads,
    )
    document = file_document(recorded)
    for entry in document["operations"]:
        if entry["payload_ref"] in unread:
            entry["payload_error"] = unread[entry["payload_ref"]]
    if ledger.run.step_attempts is not None:
        document["run"]["step_attempts"] = record_fields(ledger.run.step_attempts)
    shown = {"run": document["run"], "now": now, "ownership": asdict(ownership(ledger.run, now))}
    shown.update((part, document[part]) for part in _PARTS_SHOWN)
    return shown
