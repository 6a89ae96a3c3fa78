"""A run's page: what it needs from a person and the forms that give it, then what it did.

The page is the run's facts, its chain and forks, then the sections of ``STATUS_SECTIONS`` that
apply to its status (each a decision drawn from the ledger: a blocked run's recovery record with
its payload, effect, key, evidence and resolutions; the payload an approval is asked for; the
limits to raise; the step to retry), then its timeline, operations and events. Everything shown
is escaped by default (``Html``); a form asks for the token and never holds it. The inbox draws the same
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
from .dashboard_history import events_section, operations_section, timeline_section
from .dashboard_layout import Html, json_text, page, run_path, value_cell, when
from .dashboard_timeline import chain_of, forks_made

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
    clock, the page's own address (``path``: where its forms post), where an action
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


Section = Callable[[RunView], Html]
"""A part of a run's page: its HTML, or ``""`` when it has nothing to say about this run."""


def status_badge(run: RunRecord, now: int) -> Html:
    """The run's status as it reads now: who holds a running run, or that nobody does; a run
    whose worker's lease expired is marked dead."""
    presence = ownership(run, now)
    dead = " dead" if presence.state == LEASE_EXPIRED else ""
    label = status_label(run, presence)
    word = "running — worker gone" if dead else "runnable" if presence.state == RELEASED else run.status.value
    return Html("<span class='badge s-{}{}' title='{}'>{}</span>").format(run.status.value, dead, label, word)


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


def needs(run: RunRecord, now: int) -> Html | str:
    """What a run needs, in a few words: text, or HTML (a listing's column)."""
    if run.status is RunStatus.BLOCKED:
        return str((run.recovery_record or {}).get("phase", ""))
    if run.status is RunStatus.WAITING:
        return waits_for(run.waiting_for)
    if run.status is RunStatus.STOPPED:
        return Html("a raised limit: {}").format(stop_words(run.recovery_record or {}))
    if run.status is RunStatus.FAILED:
        return Html("retry, once the cause is fixed")
    if run.successor_run_id:
        return Html("continued as <a href='{}'>{}</a>").format(
            run_path(run.successor_run_id), run.successor_run_id
        )
    presence = ownership(run, now)
    if presence.state == LEASE_EXPIRED:
        return Html("<span class=dead>{}</span>").format(status_label(run, presence))
    return status_label(run, presence) if presence.state != NONE else ""


# -- form parts ----------------------------------------------------------------------------------


def _form(view: RunView, action: str, inner: Html, button: str, *, css: str = "") -> Html:
    back = Html("<input type=hidden name=back value='{}'>").format(view.back) if view.back else ""
    return Html(
        "<form method=post action='{path}/{action}' class=act data-form='{action}'>"
        "{back}{inner}{token}<button class='{css}'>{button}</button></form>"
    ).format(
        path=view.path,
        action=action,
        back=back,
        inner=inner,
        token=_token(),
        css=css or "primary",
        button=button,
    )


def _input(
    typed: dict[str, str], name: str, placeholder: str, *, required: bool = False, size: int = 0
) -> Html:
    value = typed.get(name)
    return (
        Html("<input name={0} placeholder='{1}' aria-label='{1}'").format(name, placeholder)
        + (Html(" value='{}'").format(value) if value else Html())
        + (Html(" size={}").format(size) if size else Html())
        + (Html(" required") if required else Html())
        + Html(">")
    )


def _hidden(name: str, value: object) -> Html:
    return Html("<input type=hidden name={} value='{}'>").format(name, value)


def _who(typed: dict[str, str]) -> Html:
    return _input(typed, "by", "your name", required=True)


def _token() -> Html:
    return Html(
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


def _blocked(view: RunView) -> Html:
    """A blocked run's recovery record, as the decision it asks for: what was in doubt (the
    effect, its key, the payload sent, the evidence) and the resolutions, revision filled in."""
    run = view.run
    record = run.recovery_record
    if run.status is not RunStatus.BLOCKED or not record:
        return Html()
    revision = record.get("state_revision", run.state_revision)
    operation = record.get("operation_id")
    payload = _artifact(view.store, record.get("payload_ref"))
    dispatches = record.get("dispatch_count")
    facts = Html().join(
        Html("<dt>{}</dt><dd>{}</dd>").format(label, value)
        for label, value in (
            ("phase", str(record.get("phase"))),
            ("step", record.get("step_id") or ""),
            ("effect (its owner)", record.get("effect") or ""),
            ("operation", operation or ""),
            ("effect key", Html("<code>{}</code>").format(record.get("effect_key") or "")),
            ("protocol state", record.get("effect_status") or ""),
            ("dispatches", "" if dispatches is None else str(dispatches)),
            ("first dispatched", when(record.get("first_dispatched_at"), view.now)),
            ("payload sent", _shown_whole(f"{run.run_id}-sent", payload) if payload is not None else ""),
            ("evidence", value_cell(f"{run.run_id}/evidence", record.get("evidence") or {})),
            ("revision", str(revision)),
        )
        if value
    )
    steps = Html().join(
        Html("<li>{}</li>").format(filled_in(str(action), run.run_id, revision))
        for action in record.get("next_actions", [])
    )
    common = _hidden("revision", revision) + _hidden("operation_id", operation or "")
    applied = view.typed_for("resolve", "applied")
    forms = Html()
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
    return Html(
        "<section class=decision-card><h2 class=s-blocked>blocked: {phase}</h2>"
        "<p><b>{reason}</b></p><dl class=decision>{facts}</dl>"
        "<h3>What you can do</h3><ol class=actions>{steps}</ol>{forms}"
        "<details data-key='{id}-record'><summary>the whole recovery record</summary>"
        "<pre>{record}</pre></details></section>"
    ).format(
        phase=record.get("phase"),
        reason=record.get("reason"),
        facts=facts,
        steps=steps,
        forms=forms,
        id=run.run_id,
        record=json_text(record),
    )


def filled_in(action: str, run_id: str, revision: object) -> str:
    """A next action of a recovery record with this run's id and revision in place of its
    ``RUN`` and ``<state_revision>`` placeholders (the id quoted as a shell would need it)."""
    return re.sub(
        r"\bRUN\b", lambda _: shlex.quote(run_id), action.replace("<state_revision>", str(revision))
    )


def _waiting(view: RunView) -> Html:
    run = view.run
    if run.status is not RunStatus.WAITING or not run.waiting_for:
        return Html()
    waiting = run.waiting_for
    kind = waiting_kind(waiting)
    if kind == MESSAGE:
        typed = view.typed_for("answer")
        name = waiting.get("name")
        timeout = waiting.get("timeout_at")
        inner = (
            _hidden("name", name)
            + _hidden("wait", waiting.get("step_id"))
            + Html(
                "<textarea name=payload placeholder='the message: JSON' aria-label='the message: JSON'"
                " rows=3 cols=40 required>{}</textarea>"
            ).format(typed.get("payload", ""))
            + _input(typed, "message_id", "message id (optional)")
            + _who(typed)
        )
        return Html(
            "<section><h2 class=s-waiting>waiting for a message</h2><p>step"
            " {step} waits for message <b>{name}</b> since {since}{timeout}"
            "; it takes one answer: a second one is refused</p>{form}</section>"
        ).format(
            step=waiting.get("step_id"),
            name=name,
            since=when(waiting.get("since"), view.now),
            timeout=Html("; it times out {}").format(when(timeout, view.now)) if timeout else "",
            form=_form(view, "answer", inner, f"answer {name}"),
        )
    if kind == SLEEP:
        return Html(
            "<section><h2 class=s-waiting>sleeping</h2><p>step {} sleeps"
            " until {}: a worker carries the run on then</p></section>"
        ).format(waiting.get("step_id"), when(waiting.get("until"), view.now))
    digest = str(waiting.get("payload_digest"))
    typed = view.typed_for("approve")
    inner = (
        _hidden("step_id", waiting.get("step_id"))
        + _hidden("payload_digest", digest)
        + _input(typed, "expires_minutes", "expires in minutes", size=14)
        + _input(typed, "evidence", "why")
        + _who(typed)
    )
    return Html(
        "<section><h2 class=s-waiting>waiting for approval</h2><p><b>{reason}</b></p>"
        "<dl class=decision>"
        "<dt>step</dt><dd>{step}</dd>"
        "<dt>effect</dt><dd>{effect} (operation {operation})</dd>"
        "<dt>payload digest</dt><dd><code>{digest}</code></dd>"
        "<dt>target state</dt><dd><code>{target}</code></dd>"
        "<dt>waiting since</dt><dd>{since}</dd></dl>"
        "<h3>The payload to approve</h3>{payload}{form}</section>"
    ).format(
        reason=waiting.get("reason", ""),
        step=waiting.get("step_id"),
        effect=waiting.get("effect"),
        operation=waiting.get("operation_id"),
        digest=digest,
        target=waiting.get("target_digest") or "none",
        since=when(waiting.get("since"), view.now),
        payload=_payload_block(view, digest),
        form=_form(view, "approve", inner, "approve this payload"),
    )


def _payload_block(view: RunView, digest: str) -> Html:
    return _shown_whole(f"{view.run.run_id}-{digest}", _artifact(view.store, digest))


def _shown_whole(key: str, value: Any) -> Html:
    """A value a decision rests on: shown whole, laid out, with a copy button."""
    ident = "whole-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in key)
    return Html("<pre id='{0}'>{1}</pre><button type=button class=copy data-copy='{0}'>copy</button>").format(
        ident, json_text(value)
    )


def _stopped(view: RunView) -> Html:
    """A run stopped at a limit: which, how far it spent, and the form that raises its limits
    (each field left empty stays as it is), checked against the revision shown."""
    run = view.run
    if run.status is not RunStatus.STOPPED:
        return Html()
    record = run.recovery_record or {}
    typed = view.typed_for("limits")
    fields = Html().join(
        Html("<label>{} {}</label>").format(
            label, _input(typed, name, "no limit" if now is None else str(now), size=8)
        )
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
    return Html(
        "<section><h2 class=s-stopped>stopped: its {limit} limit</h2>"
        "<p><b>{words}</b></p><p>{reason}</p>{form}"
        "<details data-key='{id}-stop'><summary>the whole record</summary>"
        "<pre>{record}</pre></details></section>"
    ).format(
        limit=record.get("limit", "?"),
        words=stop_words(record),
        reason=record.get("reason", ""),
        form=_form(view, "limits", inner, "raise the limits and carry the run on"),
        id=run.run_id,
        record=json_text(record),
    )


def _retry_form(view: RunView) -> Html:
    """A failed run (or one stopped at a step that used its attempts): the form that retries it
    from its failed step, naming — if the person chooses — a rejected operation to send again."""
    run = view.run
    if retry_refusal(run, run.state_revision) is not None:
        return Html()
    typed = view.typed_for("retry")
    at = failed_step(view.ledger)
    steps = Html().join(
        Html("<option value='{0}'{1}>run {0} again instead</option>").format(
            sid, Html(" selected") if typed.get("step") == sid else ""
        )
        for sid in retriable_steps(view.ledger)
        if sid != at
    )
    default = (
        f"run {at} again (the step it failed at)" if at else "no step moved (the workflow itself raised)"
    )
    rejected = [op for op in view.ledger.operations.values() if op.state is EffectState.REJECTED]
    resend = Html().join(
        Html(
            "<option value='{0}'>send {0} ({1}) again, under a key derived from its attempt</option>"
        ).format(op.operation_id, op.step_id)
        for op in rejected
    )
    choose_resend = (
        Html(
            "<select name=resend><option value=''>send no rejected operation again</option>{}</select>"
        ).format(resend)
        if rejected
        else Html()
    )
    why = (run.error or {}).get("message") or (run.recovery_record or {}).get("reason", "")
    inner = (
        _hidden("revision", run.state_revision)
        + Html("<select name=step aria-label='step'><option value=''>{}</option>{}</select>").format(
            default, steps
        )
        + choose_resend
        + _who(typed)
        + _input(typed, "reason", "why (the cause is fixed)")
    )
    return Html(
        "<section><h2 class=s-failed>{}: retry</h2><p><b>{}</b></p>"
        "<p class=muted>The failed step's record moves into the history and the run is carried on from it:"
        " what it recorded before replays. Nothing applied, and nothing whose outcome is"
        " uncertain, is sent again; an operation its owner rejected only if you choose it.</p>"
        "{}</section>"
    ).format(run.status.value.capitalize(), why, _form(view, "retry", inner, "retry the run"))


def _approvals(view: RunView) -> Html:
    """Every approval of the run, revoked ones marked; a revoke form for each effect not yet
    dispatched whose approval is in force."""
    approvals = view.store.approvals(view.run.run_id)
    if not approvals:
        return Html()
    rows = Html().join(
        Html(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}…</code></td><td>{}</td></tr>"
        ).format(
            a.step_id,
            a.approved_by,
            when(a.approved_at),
            when(a.expires_at) or "never",
            a.payload_digest[:19],
            _revoked(a),
        )
        for a in approvals
    )
    typed = view.typed_for("revoke")
    forms = Html().join(
        _form(
            view,
            "revoke",
            _hidden("step_id", step) + _who(typed) + _input(typed, "reason", "why", required=True),
            f"revoke the approval of {step}",
            css="danger",
        )
        for step in revocable(view.ledger.run, view.ledger.operations, approvals)
    )
    return Html(
        "<section><h2>approvals</h2><table><tr><th>step</th><th>approved by</th>"
        "<th>at (UTC)</th><th>expires (UTC)</th><th>payload</th><th>revoked</th></tr>"
        "{}</table>{}</section>"
    ).format(rows, forms)


def _revoked(approval: ApprovalRecord) -> Html:
    if not approval.revoked:
        return Html()
    return Html("<span class=s-failed>revoked by {} at {}: {}</span>").format(
        approval.revoked_by, when(approval.revoked_at), approval.revoke_reason
    )


def _messages(view: RunView) -> Html:
    """Every message sent to the run, and the wait step that took each one."""
    sent: list[MessageRecord] = view.store.messages(view.run.run_id)
    if not sent:
        return Html()
    rows = Html().join(
        Html("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>").format(
            m.seq,
            m.name,
            m.sent_by or "",
            when(m.sent_at),
            m.message_id or "",
            m.taken_by or "not taken yet",
            value_cell(f"msg-{m.seq}", m.payload),
        )
        for m in sent
    )
    return Html(
        "<section><h2>messages</h2><table><tr><th>#</th><th>name</th><th>sent by</th>"
        "<th>at (UTC)</th><th>message id</th><th>taken by</th><th>payload</th></tr>{}"
        "</table></section>"
    ).format(rows)


def _cancel_form(view: RunView) -> Html:
    if view.run.status.terminal:
        return Html()
    typed = view.typed_for("cancel")
    inner = _who(typed) + _input(typed, "reason", "why")
    return Html("<section><h2>Cancel</h2>{}</section>").format(
        _form(view, "cancel", inner, "cancel the run", css="danger")
    )


def _fork_form(view: RunView) -> Html:
    """A fork of the run from one of its steps (any run but one a live worker holds, which
    the store refuses): the step, the fork's id, the operations it sends again, the code."""
    steps = sorted(view.ledger.steps.values(), key=lambda step: step.seq)
    if not steps:
        return Html()
    typed = view.typed_for("fork")
    options = Html().join(
        Html("<option value='{0}'{1}>{0}</option>").format(
            step.step_id, Html(" selected") if typed.get("from_step") == step.step_id else ""
        )
        for step in steps
    )
    inner = (
        Html("<select name=from_step aria-label='from step'>{}</select>").format(options)
        + _input(typed, "new_run_id", "fork id (default: minted)")
        + _input(typed, "resend", "operations to send again (ids)")
        + Html("<label><input type=checkbox name=current_code value=1> on the current code</label>")
        + _who(typed)
        + _input(typed, "reason", "why")
    )
    return Html(
        "<section><details data-key='fork-form'><summary><b>Fork</b> <span class=muted>a new run with"
        " copies of the steps before the one chosen; what this run sent is not sent again, unless"
        " named</span></summary>{}</details></section>"
    ).format(_form(view, "fork", inner, "fork from this step", css="plain"))


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


def run_facts(view: RunView) -> Html:
    """The run's facts: status, workflow, owner and lease, values, limits, times."""
    run, now = view.run, view.now
    presence = ownership(run, now)
    lease = Html()
    if run.owner:
        ended = "ended" if presence.state == LEASE_EXPIRED else "ends"
        lease = Html("{}, lease {} {}").format(run.owner, ended, when(run.lease_expires_at, now))
        lease += (
            Html("; last heartbeat {}").format(when(run.heartbeat_at, now))
            if run.heartbeat_at
            else "; no heartbeat since the claim"
        )
    outcome = (
        ("result", value_cell(f"{run.run_id}/result", run.result))
        if run.status is RunStatus.COMPLETED
        else ("error", value_cell(f"{run.run_id}/error", run.error) if run.error is not None else "")
    )
    rows = (
        ("status", status_badge(run, now) + Html(" <small>{}</small>").format(presence.label)),
        ("workflow", f"{run.workflow}@{run.workflow_version}"),
        (
            "worker",
            Html("<span class=dead>{}</span>").format(lease) if presence.state == LEASE_EXPIRED else lease,
        ),
        ("inputs", value_cell(f"{run.run_id}/inputs", run.inputs)),
        outcome,
        ("revision · fence", f"{run.state_revision} · {run.fence}"),
        (
            "resumes",
            str(
                f"{run.resume_count} of {run.resume_budget}"
                if run.resume_budget is not None
                else run.resume_count
            ),
        ),
        ("spent", f"{run.tokens_spent} tokens, cost {run.cost_spent:g}, {run.model_calls_spent} model calls"),
        ("created", when(run.created_at, now)),
        ("updated", when(run.updated_at, now)),
    )
    return Html("<table class=facts>{}</table>").format(
        Html().join(Html("<tr><th>{}</th><td>{}</td></tr>").format(k, v) for k, v in rows if v)
    )


def _lineage(view: RunView) -> Html:
    """The run's continue-as-new chain, where it was forked from, and the forks made from it."""
    run = view.run
    parts = []
    chain = chain_of(view.store, run) if (run.parent_run_id or run.successor_run_id) else []
    if chain:
        links = Html(" → ").join(
            Html("<b>{}</b>").format(link.run_id)
            if link.run_id == run.run_id
            else Html("<a href='{}'>{}</a>").format(run_path(link.run_id), link.run_id)
            for link in chain
        )
        parts.append(Html("<p>continue-as-new chain ({} runs): {}</p>").format(len(chain), links))
    if run.forked_from:
        source = str(run.forked_from.get("run_id"))
        resend = ", ".join(map(str, run.forked_from.get("resend") or []))
        parts.append(
            Html("<p>forked from <a href='{}'>{}</a> at step {}{}</p>").format(
                run_path(source),
                source,
                run.forked_from.get("step_id"),
                Html(" (sends again: {})").format(resend) if resend else "",
            )
        )
    made = forks_made(view.events)
    if made:
        items = Html().join(
            Html("<li><a href='{}'>{}</a> from step {}, by {} {}</li>").format(
                run_path(str(fork.get("fork"))),
                fork.get("fork"),
                fork.get("step_id"),
                fork.get("by"),
                when(fork.get("at"), view.now),
            )
            for fork in made
        )
        parts.append(Html("<p>forks made from this run:</p><ul>{}</ul>").format(items))
    return Html("<section class=lineage>{}</section>").format(Html().join(parts)) if parts else Html()


def run_page(
    store: Store,
    ledger: Ledger,
    events: list[EventRecord],
    now: int,
    *,
    flash: str | None = None,
    error: str | None = None,
    typed: Typed | None = None,
) -> Html:
    """A run's page: its facts and lineage, the sections of ``STATUS_SECTIONS`` that apply to
    it, then its timeline, operations and events."""
    run = ledger.run
    view = RunView(store, ledger, events, now, run_path(run.run_id), typed=typed)
    parts = [
        Html("<p><a href='/'>← runs</a></p>"),
        Html("<div data-live=facts>{}{}</div>").format(run_facts(view), _lineage(view)),
        *(section(view) for section in STATUS_SECTIONS),
        timeline_section(ledger, events),
        operations_section(ledger),
        events_section(events),
    ]
    return page(run.run_id, Html().join(parts), flash=flash, error=error, state=run.status.value)


def unreadable_page(run: RunRecord | UnreadableRun, reason: str, now: int) -> Html:
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
    rows = Html().join(Html("<tr><th>{}</th><td>{}</td></tr>").format(name, value) for name, value in facts)
    body = Html(
        "<p><a href='/'>← runs</a></p>"
        "<p><span class='badge s-blocked'>unreadable</span> {}</p>"
        "<table class=facts>{}<tr><th>created (UTC)</th><td>{}</td></tr>"
        "<tr><th>changed</th><td>{}</td></tr></table>"
    ).format(reason, rows, when(run.created_at), when(run.updated_at, now))
    return page(run.run_id, body, live=False)
