"""The dashboard's pages: the runs, one run, an error; and the JSON the API answers with.

Everything shown is data from the ledger, escaped (``_e``), never markup; the pages carry no
script and never the dashboard's token (a form asks for it). A run's page is its header, then the
sections of ``STATUS_SECTIONS`` that apply to its status (what it needs, with the forms that give
it), then its steps, operations and events.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any
from urllib.parse import quote

from .._rules.approvals import revocable
from .._rules.limits import stop_words
from .._rules.presence import ownership, status_label
from .._rules.retry import failed_step, retriable_steps, retry_refusal
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
    StepRecord,
    UnreadableRun,
)
from .render import shown


def _e(value: object) -> str:
    """``value`` as HTML text: escaped, and every control or invisible character but a line
    break (a ``<pre>`` keeps those) shown as a visible escape (``\\x1b``), as the terminal
    shows it."""
    return html.escape("\n".join(map(shown, str(value).split("\n"))), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any, width: int = 80) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


_STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{background:#f4f4f4}code,pre{font:12px ui-monospace,monospace}
pre{background:#f8f8f8;padding:.6em;overflow:auto}.blocked{color:#b00}.waiting{color:#a0a}
.completed{color:#070}.failed{color:#b60}.stopped{color:#a60}.cancelled,.continued{color:#777}.err,.revoked{color:#b00}
form{display:inline-block;margin:.4em 1em .4em 0;padding:.5em;border:1px solid #ddd}
input,select{margin:.1em}section{margin:1.2em 0}.lease_expired{color:#b60;font-weight:bold}"""


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)} — safepoint"
        f"</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{body}</body>"
        "</html>"
    )


def error_page(title: str, message: str) -> str:
    """The page of a refused or failed request: what went wrong, and the way back."""
    return _page(title, f"<p class=err>{_e(message)}</p><p><a href='/'>runs</a></p>")


def run_path(run_id: str, action: str | None = None) -> str:
    """The address of a run's page (or of one of its actions): the run id is one path segment,
    whatever it holds (``/``, ``?``, ``#``, ``%``, spaces)."""
    return f"/runs/{quote(run_id, safe='')}" + (f"/{action}" if action else "")


def _status(run: RunRecord, now: int) -> str:
    """The run's status as it reads now: who holds a running run, or that nobody does."""
    presence = ownership(run, now)
    return (
        f"<span class='{_e(run.status.value)} {_e(presence.state)}'>{_e(status_label(run, presence))}</span>"
    )


def _needs(run: RunRecord) -> str:
    if run.status is RunStatus.BLOCKED:
        return _e((run.recovery_record or {}).get("phase", ""))
    if run.status is RunStatus.WAITING:
        return _e(waits_for(run.waiting_for))
    if run.status is RunStatus.STOPPED:
        return f"a raised limit: {_e(stop_words(run.recovery_record or {}))}"
    if run.successor_run_id:
        return f"→ <a href='{_e(run_path(run.successor_run_id))}'>{_e(run.successor_run_id)}</a>"
    return ""


def waits_for(waiting_for: dict[str, Any] | None) -> str:
    """What a waiting run waits for, in a few words (times in UTC)."""
    waiting = waiting_for or {}
    kind = waiting_kind(waiting)
    if kind == MESSAGE:
        timeout = waiting.get("timeout_at")
        return f"message {waiting.get('name')!r}" + (f" (times out {_when(timeout)})" if timeout else "")
    if kind == SLEEP:
        return f"sleep until {_when(waiting.get('until'))}"
    return f"approval of {waiting.get('step_id')}"


def _unreadable_row(run: UnreadableRun) -> str:
    """A run whose row cannot be read: what could, and why the rest cannot."""
    known = "" if run.status is None else f"{run.status.value}: "
    return (
        f"<tr><td>{_e(run.run_id)}</td>"
        f"<td>{_e(run.workflow or '?')}@{_e(run.workflow_version or '?')}</td>"
        f"<td><span class=blocked>unreadable</span></td>"
        f"<td class=blocked>{_e(known + run.reason)}</td>"
        + "".join(f"<td>{'?' if value is None else value}</td>" for value in (run.resume_count, run.fence))
        + f"<td>{_when(run.updated_at)}</td></tr>"
    )


def runs_page(runs: list[RunRecord | UnreadableRun], status: str | None, now: int) -> str:
    """The runs (those with ``status`` only, when it is given), with what each one needs."""
    filters = " · ".join(f"<a href='/?status={s.value}'>{s.value}</a>" for s in RunStatus)
    rows = "".join(
        _unreadable_row(run)
        if isinstance(run, UnreadableRun)
        else f"<tr><td><a href='{_e(run_path(run.run_id))}'>{_e(run.run_id)}</a></td>"
        f"<td>{_e(run.workflow)}@{_e(run.workflow_version)}</td><td>{_status(run, now)}</td>"
        f"<td>{_needs(run)}</td><td>{run.resume_count}</td><td>{run.fence}</td>"
        f"<td>{_when(run.updated_at)}</td></tr>"
        for run in runs
    )
    return _page(
        "runs" + (f": {status}" if status else ""),
        (
            f"<p><a href='/'>all</a> · {filters}</p><table><tr><th>run</th><th>workflow</th>"
            f"<th>status</th><th>needs</th><th>resumes</th><th>fence</th><th>updated (UTC)</th></tr>"
            f"{rows}</table>"
        ),
    )


def ordered_steps(ledger: Ledger) -> list[StepRecord]:
    """The ledger's steps in the order they were recorded."""
    return sorted(ledger.steps.values(), key=lambda step: step.seq)


@dataclass(frozen=True)
class RunView:
    """What a run's page is drawn from: the store, the run's ledger and events, the store's
    clock, and the page's own address (``path``, escaped: where its forms post)."""

    store: Store
    ledger: Ledger
    events: list[EventRecord]
    now: int
    path: str

    @property
    def run(self) -> RunRecord:
        return self.ledger.run


Section = Callable[[RunView], str]
"""A part of a run's page: its HTML, or ``""`` when it has nothing to say about this run."""


def _blocked(view: RunView) -> str:
    run = view.run
    if run.status is RunStatus.BLOCKED and run.recovery_record:
        return _blocked_section(view.path, run.recovery_record)
    return ""


def _waiting(view: RunView) -> str:
    run = view.run
    if run.status is not RunStatus.WAITING or not run.waiting_for:
        return ""
    kind = waiting_kind(run.waiting_for)
    if kind == MESSAGE:
        return _message_section(view.path, run.waiting_for)
    if kind == SLEEP:
        return (
            f"<section><h2 class=waiting>sleeping</h2><p>step {_e(run.waiting_for.get('step_id'))}"
            f" sleeps until {_when(run.waiting_for.get('until'))} UTC: a worker carries the run on"
            " then</p></section>"
        )
    return _waiting_section(view.store, view.path, run.waiting_for)


def _messages(view: RunView) -> str:
    sent = view.store.messages(view.run.run_id)
    return _messages_section(sent) if sent else ""


def _approvals(view: RunView) -> str:
    approvals = view.store.approvals(view.run.run_id)
    return _approvals_section(view.path, view.ledger, approvals) if approvals else ""


def _stopped(view: RunView) -> str:
    """A run stopped at a limit: which, how far it spent, and the form that raises its limits
    (each field left empty stays as it is), checked against the revision shown."""
    run = view.run
    if run.status is not RunStatus.STOPPED:
        return ""
    record = run.recovery_record or {}
    fields = "".join(
        f"<label>{_e(label)} <input name={name} size=8"
        f" placeholder='{_e('no limit' if now is None else now)}'></label> "
        for name, label, now in (
            ("tokens", "tokens", run.token_budget),
            ("cost", "cost", run.cost_budget),
            ("model_calls", "model calls", run.model_call_budget),
            ("deadline_minutes", "deadline in minutes from now", ""),
            ("step_attempts", "step attempts", run.step_attempt_limit or ""),
            ("resume_budget", "resume budget", run.resume_budget),
        )
    )
    return (
        f"<section><h2 class=stopped>stopped: its {_e(record.get('limit', '?'))} limit</h2>"
        f"<p><b>{_e(stop_words(record))}</b></p><p>{_e(record.get('reason', ''))}</p>"
        f"<form method=post action='{view.path}/limits'>"
        f"<input type=hidden name=revision value='{run.state_revision}'>{fields}<br>{_who()}"
        f"<input name=reason placeholder='why'>{_token()}"
        "<button>raise the limits and carry the run on</button></form>"
        f"<pre>{_e(json.dumps(record, indent=2))}</pre></section>"
    )


def _cancel_form(view: RunView) -> str:
    if view.run.status.terminal:
        return ""
    return (
        f"<section><h2>cancel</h2><form method=post action='{view.path}/cancel'>"
        f"{_who()}<input name=reason placeholder='why'>{_token()}"
        "<button>cancel the run</button></form></section>"
    )


def _fork_form(view: RunView) -> str:
    """A fork of the run from one of its steps (any run but one a live worker holds, which
    the store refuses): the step, the fork's id, the operations it sends again, the code."""
    steps = ordered_steps(view.ledger)
    if not steps:
        return ""
    options = "".join(f"<option value='{_e(step.step_id)}'>{_e(step.step_id)}</option>" for step in steps)
    return (
        f"<section><h2>fork</h2><p>A new run with copies of the steps before the one chosen,"
        " which executes from there; what this run sent is not sent again, unless named.</p>"
        f"<form method=post action='{view.path}/fork'><select name=from_step>{options}</select>"
        "<input name=new_run_id placeholder='fork id (default: minted)'>"
        "<input name=resend placeholder='operations to send again (ids)'>"
        "<label><input type=checkbox name=current_code value=1> on the current code</label>"
        f"{_who()}<input name=reason placeholder='why'>{_token()}"
        "<button>fork from this step</button></form></section>"
    )


def _retry_form(view: RunView) -> str:
    """A failed run (or one stopped at a step that used its attempts): the form that retries it
    from its failed step, naming — if the person chooses — a rejected operation to send again."""
    run = view.run
    if retry_refusal(run, run.state_revision) is not None:
        return ""
    at = failed_step(view.ledger)
    steps = "".join(
        f"<option value='{_e(sid)}'>run {_e(sid)} again instead</option>"
        for sid in retriable_steps(view.ledger)
        if sid != at
    )
    default = (
        f"run {_e(at)} again (the step it failed at)" if at else "no step moved (the workflow itself raised)"
    )
    rejected = [op for op in view.ledger.operations.values() if op.state is EffectState.REJECTED]
    resend = "".join(
        f"<option value='{_e(op.operation_id)}'>send {_e(op.operation_id)} ({_e(op.step_id)}) again,"
        " under a key derived from its attempt</option>"
        for op in rejected
    )
    choose_resend = (
        f"<select name=resend><option value=''>send no rejected operation again</option>{resend}</select>"
        if rejected
        else ""
    )
    why = (run.error or {}).get("message") or (run.recovery_record or {}).get("reason", "")
    return (
        f"<section><h2 class=failed>{_e(run.status.value)}: retry</h2><p><b>{_e(why)}</b></p>"
        "<p>The failed step's record moves into the history and the run is carried on from it:"
        " what it recorded before replays. Nothing applied, and nothing whose outcome is"
        " uncertain, is sent again; an operation its owner rejected only if you choose it.</p>"
        f"<form method=post action='{view.path}/retry'>"
        f"<input type=hidden name=revision value='{run.state_revision}'>"
        f"<select name=step><option value=''>{default}</option>{steps}</select>{choose_resend}"
        f"{_who()}<input name=reason placeholder='why (the cause is fixed)'>{_token()}"
        "<button>retry the run</button></form></section>"
    )


# -- the run's status sections: add a new one HERE ------------------------------------------------
# What a run needs from a person and the forms that give it, in the order the page shows them,
# between the run's header and its steps. Each section looks at the run and answers "" when its
# status is not the section's. A new form for a run's status (a stopped run's "raise limits",
# say) is a Section function added to this tuple, with its action in dashboard_actions.ACTIONS:
# run_page itself does not change.
STATUS_SECTIONS: tuple[Section, ...] = (
    _blocked,
    _waiting,
    _stopped,
    _retry_form,
    _approvals,
    _messages,
    _cancel_form,
    _fork_form,
)


def run_page(store: Store, ledger: Ledger, events: list[EventRecord], now: int) -> str:
    """A run's page: its header, the sections of ``STATUS_SECTIONS`` that apply to it, then its
    steps, operations and events."""
    run = ledger.run
    view = RunView(store, ledger, events, now, _e(run_path(run.run_id)))
    header = "".join(
        f"<tr><th>{_e(k)}</th><td>{v}</td></tr>"
        for k, v in (
            ("status", _status(run, now)),
            ("workflow", _e(f"{run.workflow}@{run.workflow_version}")),
            *([("forked from", _forked_from(run.forked_from))] if run.forked_from else []),
            ("inputs", f"<code>{_e(_short(run.inputs, 200))}</code>"),
            ("revision", str(run.state_revision)),
            ("fence", str(run.fence)),
            ("resumes", _e(f"{run.resume_count} of {run.resume_budget}")),
            (
                "result" if run.result is not None else "error",
                f"<code>{_e(_short(run.result if run.result is not None else run.error, 300))}</code>",
            ),
            ("updated (UTC)", _when(run.updated_at)),
        )
    )
    parts = [f"<p><a href='/'>runs</a></p><table>{header}</table>"]
    parts.extend(section(view) for section in STATUS_SECTIONS)
    parts.append(_ledger_tables(ledger, events))
    return _page(run.run_id, "".join(parts))


def _forked_from(forked: dict[str, Any]) -> str:
    source = str(forked.get("run_id"))
    resend = ", ".join(map(str, forked.get("resend") or []))
    return f"<a href='{_e(run_path(source))}'>{_e(source)}</a> at step {_e(forked.get('step_id'))}" + (
        f" (sends again: {_e(resend)})" if resend else ""
    )


def _ledger_tables(ledger: Ledger, events: list[EventRecord]) -> str:
    """The run's steps, operations and events, as tables."""
    steps = "".join(
        f"<tr><td>{step.seq}</td><td>{_e(step.kind.value)}</td><td>{_e(step.step_id)}</td>"
        f"<td>{_e(step.status.value)}</td><td><code>{_e(_short(step.result))}</code></td>"
        f"<td>{_e(step.operation_id or '')}</td></tr>"
        for step in ordered_steps(ledger)
    )
    ops = "".join(
        f"<tr><td>{_e(op.operation_id)}</td><td>{_e(op.effect)}</td><td>{_e(op.state.value)}"
        f"</td><td>{op.dispatch_count}</td><td><code>{_e(op.effect_key)}</code></td></tr>"
        for op in ledger.operations.values()
    )
    history = "".join(
        f"<tr><td>{_when(event.at)}</td><td>{_e(event.kind)}</td><td>{_e(event.step_id or '')}"
        f"</td><td>{_e(event.operation_id or '')}</td><td>{_e(event.fence or '')}</td>"
        f"<td><code>{_e(_short(event.detail))}</code></td></tr>"
        for event in events
    )
    return (
        f"<section><h2>steps</h2><table><tr><th>#</th><th>kind</th><th>step</th>"
        f"<th>status</th><th>result</th><th>operation</th></tr>{steps}</table></section>"
        f"<section><h2>operations</h2><table><tr><th>operation</th><th>effect</th>"
        f"<th>state</th><th>dispatches</th><th>effect key</th></tr>{ops}</table>"
        "</section>"
        f"<section><h2>events</h2><table><tr><th>at (UTC)</th><th>event</th>"
        f"<th>step</th><th>operation</th><th>fence</th><th>detail</th></tr>{history}"
        "</table></section>"
    )


def _who() -> str:
    return "<input name=by placeholder='your name' required>"


def _token() -> str:
    return "<input name=token type=password placeholder='dashboard token' required>"


def _blocked_section(rid: str, record: dict[str, Any]) -> str:
    revision = _e(record.get("state_revision"))
    operation = _e(record.get("operation_id") or "")
    actions = "".join(f"<li>{_e(action)}</li>" for action in record.get("next_actions", []))
    common = (
        f"<input type=hidden name=revision value='{revision}'>"
        f"<input type=hidden name=operation_id value='{operation}'>{_who()}"
    )
    forms = (
        (
            f"<form method=post action='{rid}/resolve'>{common}"
            "<input type=hidden name=action value=applied>"
            "<input name=receipt placeholder='receipt JSON the owner holds' required>"
            f"<input name=evidence placeholder='how you know'>{_token()}"
            "<button>it happened</button></form>"
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=not_applied>{_token()}"
            "<button>it did not happen</button></form>"
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=abandon>{_token()}"
            "<button>abandon the run</button></form>"
        )
        if record.get("operation_id")
        else (
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=abandon>{_token()}"
            "<button>abandon the run</button></form>"
        )
    )
    return (
        f"<section><h2 class=blocked>blocked: {_e(record.get('phase'))}</h2>"
        f"<p><b>{_e(record.get('reason'))}</b></p>"
        f"<p>operation {operation} ({_e(record.get('effect_status') or '')}), effect key "
        f"<code>{_e(record.get('effect_key') or '')}</code>, revision {revision}</p>"
        f"<ol>{actions}</ol>{forms}<pre>{_e(json.dumps(record, indent=2))}</pre></section>"
    )


def _waiting_section(store: Store, rid: str, waiting: dict[str, Any]) -> str:
    digest = str(waiting.get("payload_digest"))
    try:
        payload = json.dumps(json.loads(store.get_artifact(digest)), indent=2, ensure_ascii=False)
    except SafepointError as exc:
        payload = f"(the payload cannot be read: {exc.message})"
    return (
        f"<section><h2 class=waiting>waiting for approval</h2>"
        f"<p><b>{_e(waiting.get('reason', ''))}</b></p>"
        f"<p>step {_e(waiting.get('step_id'))}, operation {_e(waiting.get('operation_id'))}"
        f" ({_e(waiting.get('effect'))}); payload <code>{_e(digest)}</code>, target state "
        f"<code>{_e(waiting.get('target_digest') or 'none')}</code></p>"
        f"<pre>{_e(payload)}</pre>"
        f"<form method=post action='{rid}/approve'>"
        f"<input type=hidden name=step_id value='{_e(waiting.get('step_id'))}'>"
        f"<input type=hidden name=payload_digest value='{_e(digest)}'>{_who()}"
        "<input name=expires_minutes placeholder='expires in minutes' size=16>"
        f"<input name=evidence placeholder='why'>{_token()}"
        "<button>approve this payload</button></form></section>"
    )


def _message_section(rid: str, waiting: dict[str, Any]) -> str:
    """A run waiting for a message: which, until when, and the form that sends it."""
    name = waiting.get("name")
    timeout = waiting.get("timeout_at")
    until = f"; it times out {_when(timeout)} UTC" if timeout else ""
    return (
        f"<section><h2 class=waiting>waiting for a message</h2><p>step"
        f" {_e(waiting.get('step_id'))} waits for message <b>{_e(name)}</b> since"
        f" {_when(waiting.get('since'))} UTC{until}</p>"
        f"<form method=post action='{rid}/send'>"
        f"<input type=hidden name=name value='{_e(name)}'>"
        "<textarea name=payload placeholder='the message: JSON' rows=3 cols=50 required></textarea>"
        f"<input name=message_id placeholder='message id (optional)'>{_who()}{_token()}"
        f"<button>send {_e(name)}</button></form></section>"
    )


def _messages_section(sent: list[MessageRecord]) -> str:
    """Every message sent to the run, and the wait step that took each one."""
    rows = "".join(
        f"<tr><td>{m.seq}</td><td>{_e(m.name)}</td><td>{_e(m.sent_by or '')}</td>"
        f"<td>{_when(m.sent_at)}</td><td>{_e(m.message_id or '')}</td>"
        f"<td>{_e(m.taken_by or 'not taken yet')}</td><td><code>{_e(_short(m.payload))}</code></td></tr>"
        for m in sent
    )
    return (
        f"<section><h2>messages</h2><table><tr><th>#</th><th>name</th><th>sent by</th>"
        f"<th>at (UTC)</th><th>message id</th><th>taken by</th><th>payload</th></tr>{rows}"
        "</table></section>"
    )


def _approvals_section(rid: str, ledger: Ledger, approvals: list[ApprovalRecord]) -> str:
    """Every approval of the run, revoked ones marked; a revoke form for each effect not yet
    dispatched whose approval is in force."""
    rows = "".join(
        f"<tr><td>{_e(a.step_id)}</td><td>{_e(a.approved_by)}</td><td>{_when(a.approved_at)}"
        f"</td><td>{_when(a.expires_at) or 'never'}</td><td><code>{_e(a.payload_digest[:19])}…"
        f"</code></td><td>{_revoked(a)}</td></tr>"
        for a in approvals
    )
    forms = "".join(
        f"<form method=post action='{rid}/revoke'>"
        f"<input type=hidden name=step_id value='{_e(step)}'>{_who()}"
        f"<input name=reason placeholder='why' required>{_token()}"
        f"<button>revoke the approval of {_e(step)}</button></form>"
        for step in revocable(ledger.run, ledger.operations, approvals)
    )
    return (
        f"<section><h2>approvals</h2><table><tr><th>step</th><th>approved by</th>"
        f"<th>at (UTC)</th><th>expires (UTC)</th><th>payload</th><th>revoked</th></tr>"
        f"{rows}</table>{forms}</section>"
    )


def _revoked(approval: ApprovalRecord) -> str:
    if not approval.revoked:
        return ""
    return (
        f"<span class=revoked>revoked by {_e(approval.revoked_by)} at"
        f" {_when(approval.revoked_at)}: {_e(approval.revoke_reason)}</span>"
    )


def run_json(run: RunRecord | UnreadableRun, now: int) -> dict[str, Any]:
    """A run as JSON, with how its ownership reads now (an unreadable one: what could be read,
    and why the rest cannot)."""
    if isinstance(run, UnreadableRun):
        return {**plain(run), "unreadable": True}
    return {**plain(run), "ownership": asdict(ownership(run, now))}


def plain(record: Any) -> Any:
    """A record as JSON-ready data (enums by value)."""
    if is_dataclass(record) and not isinstance(record, type):
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(record).items()}
    return record
