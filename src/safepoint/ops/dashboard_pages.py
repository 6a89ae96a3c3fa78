"""A run's page: what it needs from a person and the forms that give it, then what it did.

The page is the run's facts, its chain and forks, then the sections of ``STATUS_SECTIONS`` that
apply to its status (each a decision drawn from the ledger: a blocked run's recovery record with
its payload, effect, key, evidence and resolutions; the payload an approval is asked for; the
limits to raise; the step to retry), then its timeline, operations and events. Everything shown
is escaped (``e``); a form asks for the token and never holds it. The inbox draws the same
sections for every run that needs a person.

A form whose action was refused is drawn again with what the person typed (``Typed``), the
token aside, so nothing typed is lost to an error.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._rules.approvals import revocable
from .._rules.limits import stop_words
from .._rules.presence import LEASE_EXPIRED, NONE, RELEASED, ownership, status_label
from .._rules.recovery import UNCERTAIN_PHASE
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
    UnreadableRun,
)
from .dashboard_layout import duration, e, json_text, page, run_path, table_section, value_cell, when
from .dashboard_timeline import chain_of, forks_made, timeline

__all__ = [
    "STATUS_SECTIONS",
    "RunView",
    "Section",
    "Typed",
    "needs",
    "run_page",
    "status_badge",
    "waits_for",
]


@dataclass(frozen=True)
class Typed:
    """What a person typed into a form whose action was refused: drawn again in that form."""

    run_id: str
    action: str
    fields: dict[str, str]


@dataclass(frozen=True)
class RunView:
    """What a run's sections are drawn from: the store, the run's ledger and events, the store's
    clock, the page's own address (``path``, escaped: where its forms post), where an action
    returns to (``back``: ``""`` the run's page, ``inbox`` the inbox) and a refused form's input."""

    store: Store
    ledger: Ledger
    events: list[EventRecord]
    now: int
    path: str
    back: str = ""
    typed: Typed | None = field(default=None)

    @property
    def run(self) -> RunRecord:
        return self.ledger.run

    def typed_for(self, action: str, variant: str | None = None) -> dict[str, str]:
        """What was typed into this run's ``action`` form (``variant``: its ``action`` field,
        one of a resolution's three forms), or nothing."""
        typed = self.typed
        if typed is None or typed.run_id != self.run.run_id or typed.action != action:
            return {}
        if variant is not None and typed.fields.get("action") != variant:
            return {}
        return typed.fields


Section = Callable[[RunView], str]
"""A part of a run's page: its HTML, or ``""`` when it has nothing to say about this run."""


def status_badge(run: RunRecord, now: int) -> str:
    """The run's status as it reads now: who holds a running run, or that nobody does; a run
    whose worker's lease expired is marked dead."""
    presence = ownership(run, now)
    dead = " dead" if presence.state == LEASE_EXPIRED else ""
    label = status_label(run, presence)
    word = "running — worker gone" if dead else "runnable" if presence.state == RELEASED else run.status.value
    return f"<span class='badge s-{e(run.status.value)}{dead}' title='{e(label)}'>{e(word)}</span>"


def waits_for(waiting_for: dict[str, Any] | None) -> str:
    """What a waiting run waits for, in a few words (times in UTC)."""
    waiting = waiting_for or {}
    kind = waiting_kind(waiting)
    if kind == MESSAGE:
        timeout = waiting.get("timeout_at")
        return f"message {waiting.get('name')!r}" + (f" (times out {when(timeout)})" if timeout else "")
    if kind == SLEEP:
        return f"sleep until {when(waiting.get('until'))}"
    return f"approval of {waiting.get('step_id')}"


def needs(run: RunRecord, now: int) -> str:
    """What a run needs, in a few words of HTML (a listing's column)."""
    if run.status is RunStatus.BLOCKED:
        return e((run.recovery_record or {}).get("phase", ""))
    if run.status is RunStatus.WAITING:
        return e(waits_for(run.waiting_for))
    if run.status is RunStatus.STOPPED:
        return f"a raised limit: {e(stop_words(run.recovery_record or {}))}"
    if run.status is RunStatus.FAILED:
        return "retry, once the cause is fixed"
    if run.successor_run_id:
        return f"continued as <a href='{e(run_path(run.successor_run_id))}'>{e(run.successor_run_id)}</a>"
    presence = ownership(run, now)
    if presence.state == LEASE_EXPIRED:
        return f"<span class=dead>{e(status_label(run, presence))}</span>"
    return e(status_label(run, presence)) if presence.state != NONE else ""


# -- form parts ----------------------------------------------------------------------------------


def _form(view: RunView, action: str, inner: str, button: str, *, css: str = "") -> str:
    back = f"<input type=hidden name=back value='{e(view.back)}'>" if view.back else ""
    return (
        f"<form method=post action='{view.path}/{action}' class=act data-form='{e(action)}'>"
        f"{back}{inner}{_token()}<button class='{css or 'primary'}'>{e(button)}</button></form>"
    )


def _input(
    typed: dict[str, str], name: str, placeholder: str, *, required: bool = False, size: int = 0
) -> str:
    value = typed.get(name)
    return (
        f"<input name={name} placeholder='{e(placeholder)}' aria-label='{e(placeholder)}'"
        + (f" value='{e(value)}'" if value else "")
        + (f" size={size}" if size else "")
        + (" required" if required else "")
        + ">"
    )


def _hidden(name: str, value: object) -> str:
    return f"<input type=hidden name={name} value='{e(value)}'>"


def _who(typed: dict[str, str]) -> str:
    return _input(typed, "by", "your name", required=True)


def _token() -> str:
    return (
        "<input name=token type=password placeholder='dashboard token' aria-label='dashboard token' required>"
    )


def _artifact(store: Store, digest: str | None) -> Any:
    """A stored payload, decoded, for a person to read (or why it cannot be)."""
    if not digest:
        return None
    try:
        return json.loads(store.get_artifact(digest))
    except (SafepointError, ValueError) as exc:
        return f"(the payload cannot be read: {getattr(exc, 'message', exc)})"


# -- the status sections -------------------------------------------------------------------------


def _blocked(view: RunView) -> str:
    """A blocked run's recovery record, as the decision it asks for: what was in doubt (the
    effect, its key, the payload sent, the evidence) and the resolutions, revision filled in."""
    run = view.run
    record = run.recovery_record
    if run.status is not RunStatus.BLOCKED or not record:
        return ""
    revision = record.get("state_revision", run.state_revision)
    operation = record.get("operation_id")
    payload = _artifact(view.store, record.get("payload_ref"))
    facts = "".join(
        f"<dt>{e(label)}</dt><dd>{value}</dd>"
        for label, value in (
            ("phase", e(record.get("phase"))),
            ("step", e(record.get("step_id") or "")),
            ("effect (its owner)", e(record.get("effect") or "")),
            ("operation", e(operation or "")),
            ("effect key", f"<code>{e(record.get('effect_key') or '')}</code>"),
            ("protocol state", e(record.get("effect_status") or "")),
            (
                "dispatches",
                e(record.get("dispatch_count") if record.get("dispatch_count") is not None else ""),
            ),
            ("first dispatched", when(record.get("first_dispatched_at"), view.now)),
            ("payload sent", _shown_whole(f"{run.run_id}-sent", payload) if payload is not None else ""),
            ("evidence", value_cell(f"{run.run_id}/evidence", record.get("evidence") or {})),
            ("revision", e(revision)),
        )
        if value
    )
    steps = "".join(
        f"<li>{e(filled_in(str(action), run.run_id, revision))}</li>"
        for action in record.get("next_actions", [])
    )
    common = _hidden("revision", revision) + _hidden("operation_id", operation or "")
    applied = view.typed_for("resolve", "applied")
    forms = ""
    # a transaction step that may have committed is decided as an operation is: its writes are
    # in the database (the value it returns stands for the receipt) or none is (it runs again)
    step = record.get("phase") == UNCERTAIN_PHASE
    if operation or step:
        receipt = "the value the step returns (JSON)" if step else "receipt JSON the owner holds"
        forms += _form(
            view,
            "resolve",
            common
            + _hidden("action", "applied")
            + _input(applied, "receipt", receipt, required=not step, size=30)
            + _input(applied, "evidence", "how you know")
            + _who(applied),
            "its writes are there: record it done" if step else "it happened: accept the receipt",
        )
    again = "none of its writes is there: run it again" if step else "it did not happen: send it again"
    plain = (("not_applied", again, "plain"),) if operation or step else ()
    for action, button, css in (*plain, ("abandon", "abandon the run", "danger")):
        inner = common + _hidden("action", action) + _who(view.typed_for("resolve", action))
        forms += _form(view, "resolve", inner, button, css=css)
    return (
        f"<section class=decision-card><h2 class=s-blocked>blocked: {e(record.get('phase'))}</h2>"
        f"<p><b>{e(record.get('reason'))}</b></p><dl class=decision>{facts}</dl>"
        f"<h3>What you can do</h3><ol class=actions>{steps}</ol>{forms}"
        f"<details data-key='{e(run.run_id)}-record'><summary>the whole recovery record</summary>"
        f"<pre>{e(json_text(record))}</pre></details></section>"
    )


def filled_in(action: str, run_id: str, revision: object) -> str:
    """A next action of a recovery record with this run's id and revision in place of its
    ``RUN`` and ``<state_revision>`` placeholders (the id quoted as a shell would need it)."""
    return re.sub(
        r"\bRUN\b", lambda _: shlex.quote(run_id), action.replace("<state_revision>", str(revision))
    )


def _waiting(view: RunView) -> str:
    run = view.run
    if run.status is not RunStatus.WAITING or not run.waiting_for:
        return ""
    waiting = run.waiting_for
    kind = waiting_kind(waiting)
    if kind == MESSAGE:
        typed = view.typed_for("answer")
        name = waiting.get("name")
        timeout = waiting.get("timeout_at")
        inner = (
            _hidden("name", name)
            + _hidden("wait", waiting.get("step_id"))
            + "<textarea name=payload placeholder='the message: JSON' aria-label='the message: JSON'"
            f" rows=3 cols=40 required>{e(typed.get('payload', ''))}</textarea>"
            + _input(typed, "message_id", "message id (optional)")
            + _who(typed)
        )
        return (
            f"<section><h2 class=s-waiting>waiting for a message</h2><p>step"
            f" {e(waiting.get('step_id'))} waits for message <b>{e(name)}</b> since"
            f" {when(waiting.get('since'), view.now)}"
            + (f"; it times out {when(timeout, view.now)}" if timeout else "")
            + "; it takes one answer: a second one is refused"
            + f"</p>{_form(view, 'answer', inner, f'answer {name}')}</section>"
        )
    if kind == SLEEP:
        return (
            f"<section><h2 class=s-waiting>sleeping</h2><p>step {e(waiting.get('step_id'))} sleeps"
            f" until {when(waiting.get('until'), view.now)}: a worker carries the run on then</p></section>"
        )
    digest = str(waiting.get("payload_digest"))
    typed = view.typed_for("approve")
    inner = (
        _hidden("step_id", waiting.get("step_id"))
        + _hidden("payload_digest", digest)
        + _input(typed, "expires_minutes", "expires in minutes", size=14)
        + _input(typed, "evidence", "why")
        + _who(typed)
    )
    return (
        f"<section><h2 class=s-waiting>waiting for approval</h2><p><b>{e(waiting.get('reason', ''))}</b></p>"
        "<dl class=decision>"
        f"<dt>step</dt><dd>{e(waiting.get('step_id'))}</dd>"
        f"<dt>effect</dt><dd>{e(waiting.get('effect'))} (operation {e(waiting.get('operation_id'))})</dd>"
        f"<dt>payload digest</dt><dd><code>{e(digest)}</code></dd>"
        f"<dt>target state</dt><dd><code>{e(waiting.get('target_digest') or 'none')}</code></dd>"
        f"<dt>waiting since</dt><dd>{when(waiting.get('since'), view.now)}</dd></dl>"
        f"<h3>The payload to approve</h3>{_payload_block(view, digest)}"
        f"{_form(view, 'approve', inner, 'approve this payload')}</section>"
    )


def _payload_block(view: RunView, digest: str) -> str:
    return _shown_whole(f"{view.run.run_id}-{digest}", _artifact(view.store, digest))


def _shown_whole(key: str, value: Any) -> str:
    """A value a decision rests on: shown whole, laid out, with a copy button."""
    ident = "whole-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in key)
    return (
        f"<pre id='{e(ident)}'>{e(json_text(value))}</pre>"
        f"<button type=button class=copy data-copy='{e(ident)}'>copy</button>"
    )


def _stopped(view: RunView) -> str:
    """A run stopped at a limit: which, how far it spent, and the form that raises its limits
    (each field left empty stays as it is), checked against the revision shown."""
    run = view.run
    if run.status is not RunStatus.STOPPED:
        return ""
    record = run.recovery_record or {}
    typed = view.typed_for("limits")
    fields = "".join(
        f"<label>{e(label)} {_input(typed, name, 'no limit' if now is None else str(now), size=8)}</label>"
        for name, label, now in (
            ("tokens", "tokens", run.token_budget),
            ("cost", "cost", run.cost_budget),
            ("model_calls", "model calls", run.model_call_budget),
            ("deadline_minutes", "deadline in minutes from now", ""),
            ("step_attempts", "step attempts", run.step_attempt_limit or ""),
            ("resume_budget", "resume budget", run.resume_budget),
        )
    )
    inner = _hidden("revision", run.state_revision) + fields + _who(typed) + _input(typed, "reason", "why")
    return (
        f"<section><h2 class=s-stopped>stopped: its {e(record.get('limit', '?'))} limit</h2>"
        f"<p><b>{e(stop_words(record))}</b></p><p>{e(record.get('reason', ''))}</p>"
        f"{_form(view, 'limits', inner, 'raise the limits and carry the run on')}"
        f"<details data-key='{e(run.run_id)}-stop'><summary>the whole record</summary>"
        f"<pre>{e(json_text(record))}</pre></details></section>"
    )


def _retry_form(view: RunView) -> str:
    """A failed run (or one stopped at a step that used its attempts): the form that retries it
    from its failed step, naming — if the person chooses — a rejected operation to send again."""
    run = view.run
    if retry_refusal(run, run.state_revision) is not None:
        return ""
    typed = view.typed_for("retry")
    at = failed_step(view.ledger)
    steps = "".join(
        f"<option value='{e(sid)}'{' selected' if typed.get('step') == sid else ''}>"
        f"run {e(sid)} again instead</option>"
        for sid in retriable_steps(view.ledger)
        if sid != at
    )
    default = (
        f"run {e(at)} again (the step it failed at)" if at else "no step moved (the workflow itself raised)"
    )
    rejected = [op for op in view.ledger.operations.values() if op.state is EffectState.REJECTED]
    resend = "".join(
        f"<option value='{e(op.operation_id)}'>send {e(op.operation_id)} ({e(op.step_id)}) again,"
        " under a key derived from its attempt</option>"
        for op in rejected
    )
    choose_resend = (
        f"<select name=resend><option value=''>send no rejected operation again</option>{resend}</select>"
        if rejected
        else ""
    )
    why = (run.error or {}).get("message") or (run.recovery_record or {}).get("reason", "")
    inner = (
        _hidden("revision", run.state_revision)
        + f"<select name=step aria-label='step'><option value=''>{default}</option>{steps}</select>"
        + choose_resend
        + _who(typed)
        + _input(typed, "reason", "why (the cause is fixed)")
    )
    return (
        f"<section><h2 class=s-failed>{e(run.status.value.capitalize())}: retry</h2><p><b>{e(why)}</b></p>"
        "<p class=muted>The failed step's record moves into the history and the run is carried on from it:"
        " what it recorded before replays. Nothing applied, and nothing whose outcome is"
        " uncertain, is sent again; an operation its owner rejected only if you choose it.</p>"
        f"{_form(view, 'retry', inner, 'retry the run')}</section>"
    )


def _approvals(view: RunView) -> str:
    """Every approval of the run, revoked ones marked; a revoke form for each effect not yet
    dispatched whose approval is in force."""
    approvals = view.store.approvals(view.run.run_id)
    if not approvals:
        return ""
    rows = "".join(
        f"<tr><td>{e(a.step_id)}</td><td>{e(a.approved_by)}</td><td>{when(a.approved_at)}"
        f"</td><td>{when(a.expires_at) or 'never'}</td><td><code>{e(a.payload_digest[:19])}…"
        f"</code></td><td>{_revoked(a)}</td></tr>"
        for a in approvals
    )
    typed = view.typed_for("revoke")
    forms = "".join(
        _form(
            view,
            "revoke",
            _hidden("step_id", step) + _who(typed) + _input(typed, "reason", "why", required=True),
            f"revoke the approval of {step}",
            css="danger",
        )
        for step in revocable(view.ledger.run, view.ledger.operations, approvals)
    )
    return (
        "<section><h2>approvals</h2><table><tr><th>step</th><th>approved by</th>"
        "<th>at (UTC)</th><th>expires (UTC)</th><th>payload</th><th>revoked</th></tr>"
        f"{rows}</table>{forms}</section>"
    )


def _revoked(approval: ApprovalRecord) -> str:
    if not approval.revoked:
        return ""
    return (
        f"<span class=s-failed>revoked by {e(approval.revoked_by)} at"
        f" {when(approval.revoked_at)}: {e(approval.revoke_reason)}</span>"
    )


def _messages(view: RunView) -> str:
    """Every message sent to the run, and the wait step that took each one."""
    sent: list[MessageRecord] = view.store.messages(view.run.run_id)
    if not sent:
        return ""
    rows = "".join(
        f"<tr><td>{m.seq}</td><td>{e(m.name)}</td><td>{e(m.sent_by or '')}</td>"
        f"<td>{when(m.sent_at)}</td><td>{e(m.message_id or '')}</td>"
        f"<td>{e(m.taken_by or 'not taken yet')}</td><td>{value_cell(f'msg-{m.seq}', m.payload)}</td></tr>"
        for m in sent
    )
    return (
        "<section><h2>messages</h2><table><tr><th>#</th><th>name</th><th>sent by</th>"
        f"<th>at (UTC)</th><th>message id</th><th>taken by</th><th>payload</th></tr>{rows}"
        "</table></section>"
    )


def _cancel_form(view: RunView) -> str:
    if view.run.status.terminal:
        return ""
    typed = view.typed_for("cancel")
    inner = _who(typed) + _input(typed, "reason", "why")
    return f"<section><h2>Cancel</h2>{_form(view, 'cancel', inner, 'cancel the run', css='danger')}</section>"


def _fork_form(view: RunView) -> str:
    """A fork of the run from one of its steps (any run but one a live worker holds, which
    the store refuses): the step, the fork's id, the operations it sends again, the code."""
    steps = sorted(view.ledger.steps.values(), key=lambda step: step.seq)
    if not steps:
        return ""
    typed = view.typed_for("fork")
    options = "".join(
        f"<option value='{e(step.step_id)}'{' selected' if typed.get('from_step') == step.step_id else ''}>"
        f"{e(step.step_id)}</option>"
        for step in steps
    )
    inner = (
        f"<select name=from_step aria-label='from step'>{options}</select>"
        + _input(typed, "new_run_id", "fork id (default: minted)")
        + _input(typed, "resend", "operations to send again (ids)")
        + "<label><input type=checkbox name=current_code value=1> on the current code</label>"
        + _who(typed)
        + _input(typed, "reason", "why")
    )
    return (
        "<section><details data-key='fork-form'><summary><b>Fork</b> <span class=muted>a new run with"
        " copies of the steps before the one chosen; what this run sent is not sent again, unless"
        f" named</span></summary>{_form(view, 'fork', inner, 'fork from this step', css='plain')}"
        "</details></section>"
    )


# -- the run's status sections: add a new one HERE ------------------------------------------------
# What a run needs from a person and the forms that give it, in the order the page shows them,
# between the run's facts and its timeline. Each section looks at the run and answers "" when its
# status is not the section's. A new form for a run's status is a Section function added to this
# tuple, with its action in dashboard_actions.ACTIONS: run_page itself does not change.
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

# The sections the inbox shows of each run: what a person must decide, no more.
DECISION_SECTIONS: tuple[Section, ...] = (_blocked, _waiting, _stopped, _retry_form)


# -- the page --------------------------------------------------------------------------------------


def run_facts(view: RunView) -> str:
    """The run's facts: status, workflow, owner and lease, values, limits, times."""
    run, now = view.run, view.now
    presence = ownership(run, now)
    lease = ""
    if run.owner:
        ended = "ended" if presence.state == LEASE_EXPIRED else "ends"
        lease = f"{e(run.owner)}, lease {ended} {when(run.lease_expires_at, now)}"
        lease += (
            f"; last heartbeat {when(run.heartbeat_at, now)}"
            if run.heartbeat_at
            else "; no heartbeat since the claim"
        )
    outcome = (
        ("result", value_cell(f"{run.run_id}/result", run.result))
        if run.status is RunStatus.COMPLETED
        else ("error", value_cell(f"{run.run_id}/error", run.error) if run.error is not None else "")
    )
    rows = (
        ("status", status_badge(run, now) + f" <small>{e(presence.label)}</small>"),
        ("workflow", e(f"{run.workflow}@{run.workflow_version}")),
        ("worker", f"<span class=dead>{lease}</span>" if presence.state == LEASE_EXPIRED else lease),
        ("inputs", value_cell(f"{run.run_id}/inputs", run.inputs)),
        outcome,
        ("revision · fence", f"{run.state_revision} · {run.fence}"),
        (
            "resumes",
            e(
                f"{run.resume_count} of {run.resume_budget}"
                if run.resume_budget is not None
                else run.resume_count
            ),
        ),
        (
            "spent",
            e(f"{run.tokens_spent} tokens, cost {run.cost_spent:g}, {run.model_calls_spent} model calls"),
        ),
        ("created", when(run.created_at, now)),
        ("updated", when(run.updated_at, now)),
    )
    return (
        "<table class=facts>"
        + "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in rows if v)
        + "</table>"
    )


def _lineage(view: RunView) -> str:
    """The run's continue-as-new chain, where it was forked from, and the forks made from it."""
    run = view.run
    parts = []
    chain = chain_of(view.store, run) if (run.parent_run_id or run.successor_run_id) else []
    if chain:
        links = " → ".join(
            f"<b>{e(link.run_id)}</b>"
            if link.run_id == run.run_id
            else f"<a href='{e(run_path(link.run_id))}'>{e(link.run_id)}</a>"
            for link in chain
        )
        parts.append(f"<p>continue-as-new chain ({len(chain)} runs): {links}</p>")
    if run.forked_from:
        source = str(run.forked_from.get("run_id"))
        resend = ", ".join(map(str, run.forked_from.get("resend") or []))
        parts.append(
            f"<p>forked from <a href='{e(run_path(source))}'>{e(source)}</a> at step"
            f" {e(run.forked_from.get('step_id'))}"
            + (f" (sends again: {e(resend)})" if resend else "")
            + "</p>"
        )
    made = forks_made(view.events)
    if made:
        items = "".join(
            f"<li><a href='{e(run_path(str(fork.get('fork'))))}'>{e(fork.get('fork'))}</a> from step"
            f" {e(fork.get('step_id'))}, by {e(fork.get('by'))} {when(fork.get('at'), view.now)}</li>"
            for fork in made
        )
        parts.append(f"<p>forks made from this run:</p><ul>{items}</ul>")
    return f"<section class=lineage>{''.join(parts)}</section>" if parts else ""


def timeline_section(view: RunView) -> str:
    """The steps and effects in order, each with its start, end, duration and kind; an effect's
    operation with its protocol state and dispatch count; each value whole on demand."""
    entries = timeline(view.ledger, view.events)
    if not entries:
        return (
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
            f"{e(op.effect)} <code>{e(op.operation_id)}</code><br>"
            f"<span class=badge>{e(op.state.value)}</span>"
            f" {op.dispatch_count} dispatch{'es' if op.dispatch_count != 1 else ''}"
            if op
            else ""
        )
        value = step.result if step.error is None else step.error
        status_word = e(step.status.value)
        shown_value = value_cell(f"step-{step.seq}", value)
        if entry.in_flight and op is not None:
            status_word = f"<b>in flight: {e(op.state.value)}</b>"
            shown_value = "<span class=muted>not recorded: its outcome is not settled</span>"
        rows.append(
            f"<tr><td>{step.seq}</td><td><span class=badge>{e(step.kind.value)}</span></td>"
            f"<td>{e(step.step_id)}<br><small>{e(step.name)}</small></td>"
            f"<td>{status_word}{f' (attempt {step.attempt})' if step.attempt > 1 else ''}</td>"
            f"<td>{when(entry.start)}<br><small>from {e(entry.start_from)}</small></td>"
            f"<td>{when(entry.end)}</td><td>{duration(entry.duration)}</td>"
            f"<td class=bar><span class='k-{e(step.kind.value)} {e(step.status.value)}'"
            f" data-left='{left:.1f}' data-width='{width:.1f}'></span></td>"
            f"<td>{effect}</td><td>{shown_value}</td></tr>"
        )
    note = (
        "<p class=muted>A step's start is derived: an effect step's from its operation's preparation,"
        " any other's from the step before it or the claim after that.</p>"
    )
    headers = ("#", "kind", "step", "status", "start (UTC)", "end", "took", "", "effect", "value")
    return table_section("timeline", "Timeline", headers, "".join(rows), note)


def _operations(view: RunView) -> str:
    ops = "".join(
        f"<tr><td><code>{e(op.operation_id)}</code></td><td>{e(op.step_id)}</td><td>{e(op.effect)}</td>"
        f"<td><span class=badge>{e(op.state.value)}</span></td><td>{op.dispatch_count}</td>"
        f"<td><code>{e(op.effect_key)}</code></td><td>{when(op.prepared_at)}</td>"
        f"<td>{value_cell(f'outcome-{op.operation_id}', op.receipt if op.error is None else op.error)}</td>"
        "</tr>"
        for op in view.ledger.operations.values()
    )
    if not ops:
        return ""
    headers = ("operation", "step", "effect", "state", "dispatches", "effect key", "prepared (UTC)")
    return table_section("operations", "Effect operations", (*headers, "receipt / error"), ops)


def _events(view: RunView) -> str:
    rows = "".join(
        f"<tr><td>{when(event.at)}</td><td>{e(event.kind)}</td><td>{e(event.step_id or '')}"
        f"</td><td>{e(event.operation_id or '')}</td><td>{e(event.worker or '')}</td>"
        f"<td>{e(event.fence or '')}</td>"
        f"<td>{'' if event.detail is None else value_cell(f'event-{event.event_id}', event.detail)}</td></tr>"
        for event in view.events
    )
    headers = ("at (UTC)", "event", "step", "operation", "worker", "fence", "detail")
    return table_section("events", "Events", headers, rows)


def run_page(
    store: Store,
    ledger: Ledger,
    events: list[EventRecord],
    now: int,
    *,
    flash: str | None = None,
    error: str | None = None,
    typed: Typed | None = None,
) -> str:
    """A run's page: its facts and lineage, the sections of ``STATUS_SECTIONS`` that apply to
    it, then its timeline, operations and events."""
    run = ledger.run
    view = RunView(store, ledger, events, now, e(run_path(run.run_id)), typed=typed)
    parts = [
        "<p><a href='/'>← runs</a></p>",
        f"<div data-live=facts>{run_facts(view)}{_lineage(view)}</div>",
        *(section(view) for section in STATUS_SECTIONS),
        timeline_section(view),
        _operations(view),
        _events(view),
    ]
    return page(run.run_id, "".join(parts), flash=flash, error=error, state=run.status.value)


def unreadable_page(run: RunRecord | UnreadableRun, reason: str, now: int) -> str:
    """The page of a run whose ledger cannot be read here — a value sealed with a key this
    store's keyring lacks, a row or an artifact that does not read: what could be read of its
    row, and why the rest cannot (``reason`` names the key, or the column). Never the stored
    bytes: an envelope is not a value."""
    facts = (
        ("workflow", f"{run.workflow or '?'}@{run.workflow_version or '?'}"),
        ("status", run.status.value if run.status else "unreadable"),
        ("state revision", "" if run.state_revision is None else str(run.state_revision)),
        ("owner", run.owner or ""),
    )
    rows = "".join(f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in facts)
    body = (
        "<p><a href='/'>← runs</a></p>"
        f"<p><span class='badge s-blocked'>unreadable</span> {e(reason)}</p>"
        f"<table class=facts>{rows}<tr><th>created (UTC)</th><td>{when(run.created_at)}</td></tr>"
        f"<tr><th>changed</th><td>{when(run.updated_at, now)}</td></tr></table>"
    )
    return page(run.run_id, body, live=False)
