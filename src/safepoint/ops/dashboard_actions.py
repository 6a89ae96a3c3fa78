"""The dashboard's actions: what each POST to ``/runs/RUN/<action>`` does, and the fields its
form may carry.

Each action calls the same function as the API and the CLI (``cancel``, ``resolve``,
``approve``, ``revoke_approval``, ``fork``, ``retry``, ``extend_limits``, ``send``,
``answer``), so a decision made in the browser is checked and recorded as one made anywhere
else. An action answers with the run it acted on — or, when it made another (a fork), that
one's id, whose page the answer then shows. A new action is a function here and an entry in
``ACTIONS``; the dashboard's request handling (admission, the token, the answer) does not
change.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from http import HTTPStatus

from .._engine.fork import current_code, fork
from .._engine.limits import extend_limits
from .._engine.messages import answer, send
from .._engine.operator import approve, resolve, revoke_approval
from .._engine.retry import retry
from .._engine.verbs import cancel
from .._rules.canonical import decode_json
from ..storage.base import Store
from ..types import JSON, ResolutionAction
from .admission import Refusal


def _cancel(store: Store, run_id: str, form: dict[str, str]) -> None:
    cancel(store, run_id, by=form["by"], reason=form.get("reason") or None)


_RESOLUTIONS = ", ".join(action.value for action in ResolutionAction)


def _resolve(store: Store, run_id: str, form: dict[str, str]) -> None:
    if form["action"] not in {action.value for action in ResolutionAction}:
        raise Refusal(
            HTTPStatus.BAD_REQUEST, f"no resolution {form['action'][:40]!r}: name one of {_RESOLUTIONS}"
        )
    receipt = form.get("receipt")
    try:
        held = decode_json(receipt) if receipt else None
    except ValueError as exc:
        raise Refusal(HTTPStatus.BAD_REQUEST, f"the receipt is not JSON: {exc}") from None
    resolve(
        store,
        run_id,
        form["action"],
        revision=int(form["revision"]),
        by=form["by"],
        operation_id=form.get("operation_id") or None,
        receipt=held,
        evidence=form.get("evidence") or None,
    )


def _approve(store: Store, run_id: str, form: dict[str, str]) -> None:
    minutes = form.get("expires_minutes")
    approve(
        store,
        run_id,
        form["step_id"],
        by=form["by"],
        expires=timedelta(minutes=float(minutes)) if minutes else None,
        evidence=form.get("evidence") or None,
        payload_digest=form.get("payload_digest") or None,
    )


def _revoke(store: Store, run_id: str, form: dict[str, str]) -> None:
    revoke_approval(store, run_id, form["step_id"], by=form["by"], reason=form["reason"])


def _limits(store: Store, run_id: str, form: dict[str, str]) -> None:
    """Raise (or set) the limits the form fills in; an empty field stays as it is."""

    def whole(name: str) -> int | None:
        return int(form[name]) if form.get(name) else None

    minutes = form.get("deadline_minutes")
    extend_limits(
        store,
        run_id,
        tokens=whole("tokens"),
        cost=float(form["cost"]) if form.get("cost") else None,
        model_calls=whole("model_calls"),
        deadline=timedelta(minutes=float(minutes)) if minutes else None,
        step_attempts=whole("step_attempts"),
        resume_budget=whole("resume_budget"),
        by=form["by"],
        reason=form.get("reason") or None,
        expected_revision=whole("revision"),
    )


def _fork(store: Store, run_id: str, form: dict[str, str]) -> str:
    made = fork(
        store,
        run_id,
        from_step=form["from_step"],
        new_run_id=form.get("new_run_id") or None,
        # the code the dashboard's process imported (--import)
        workflow=current_code(store, run_id) if form.get("current_code") else None,
        resend=form.get("resend", "").replace(",", " ").split(),
        by=form["by"],
        reason=form.get("reason") or None,
    )
    return made.run_id


def _retry(store: Store, run_id: str, form: dict[str, str]) -> None:
    resend = form.get("resend")
    retry(
        store,
        run_id,
        by=form["by"],
        reason=form.get("reason") or None,
        resend=(resend,) if resend else (),
        step=form.get("step") or None,
        expected_revision=int(form["revision"]),
    )


def _send(store: Store, run_id: str, form: dict[str, str]) -> None:
    """A mailbox message, queued for the next wait of its name (the API's)."""
    send(store, run_id, form["name"], _payload(form), **_delivery(form))


def _answer(store: Store, run_id: str, form: dict[str, str]) -> None:
    """The waiting run's form: an answer to the wait the page showed (``wait``), kept once —
    a second person answering it is refused (``WaitAnswered``), nothing kept."""
    answer(store, run_id, form["name"], _payload(form), wait=form.get("wait") or None, **_delivery(form))


def _payload(form: dict[str, str]) -> JSON:
    try:
        parsed: JSON = decode_json(form["payload"])
    except ValueError as exc:
        raise Refusal(HTTPStatus.BAD_REQUEST, f"the message is not JSON: {exc}") from None
    return parsed


def _delivery(form: dict[str, str]) -> dict[str, str | None]:
    """Who sends a message, and under which delivery id."""
    return {"message_id": form.get("message_id") or None, "by": form.get("by") or None}


Action = Callable[[Store, str, dict[str, str]], str | None]
"""An action: given the store, the run id and the fields of its form; it answers with the id
of the run to show when that is not the one acted on (a fork it made)."""

# Each action with the fields its form takes (besides the token): any other field is refused.
ACTIONS: dict[str, tuple[Action, frozenset[str]]] = {
    "cancel": (_cancel, frozenset({"by", "reason"})),
    "resolve": (_resolve, frozenset({"action", "revision", "by", "operation_id", "receipt", "evidence"})),
    "approve": (_approve, frozenset({"step_id", "by", "expires_minutes", "evidence", "payload_digest"})),
    "revoke": (_revoke, frozenset({"step_id", "by", "reason"})),
    "limits": (
        _limits,
        frozenset(
            {
                "tokens",
                "cost",
                "model_calls",
                "deadline_minutes",
                "step_attempts",
                "resume_budget",
                "by",
                "reason",
                "revision",
            }
        ),
    ),
    "fork": (_fork, frozenset({"from_step", "new_run_id", "resend", "current_code", "by", "reason"})),
    "retry": (_retry, frozenset({"revision", "by", "reason", "resend", "step"})),
    "send": (_send, frozenset({"name", "payload", "message_id", "by"})),
    "answer": (_answer, frozenset({"name", "wait", "payload", "message_id", "by"})),
}
