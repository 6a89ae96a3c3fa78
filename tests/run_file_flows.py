"""A run with something in every part of a run file (importable as ``run_file_flows``): steps of
every kind, a read that failed once (an attempt), an effect approved by a person, a message
taken by a wait and one left in the mailbox, the run's own limits and step attempts — and no
call outside this process, so that the same inputs record the same run on every store."""

from __future__ import annotations

import contextlib
from typing import Any

import safepoint as sp

# The attempts each run's quote read has made: the first fails, so every run records one.
_QUOTE_CALLS: dict[str, int] = {}


def flaky_quote(case_id: str) -> dict[str, Any]:
    run_id = sp.current_run().run_id
    _QUOTE_CALLS[run_id] = _QUOTE_CALLS.get(run_id, 0) + 1
    if _QUOTE_CALLS[run_id] == 1:
        raise TimeoutError("the quote service did not answer")
    return {"case": case_id, "rate": 1.25, "note": "café ☕ \u202e"}  # text a terminal would act on


def scripted_model(*, model: str, messages: list[dict[str, str]], temperature: float = 0) -> Any:
    return {
        "text": f"refund case {messages[-1]['content']}",
        "model": model,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }


def one_row(tx: Any) -> int:
    return int(tx.execute("SELECT 1 AS n").fetchone()["n"])


def refund(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
    return {"id": f"re-{payload['case']}", "amount": payload["amount"]}


def note(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
    return {"id": f"note-{payload['case']}"}


refunds = sp.Effect("run-file.refund", execute=refund)
notes = sp.Effect("run-file.note", execute=note)


@sp.workflow(
    "run-file-every-part",
    version="3",
    step_attempts=sp.Retry(attempts=2, backoff=0.0),
    budget=sp.Budget(tokens=10_000, cost=2.5),
)
def every_part(run: sp.Run, case_id: str) -> dict[str, Any]:
    quote = run.read("read.quote", flaky_quote, case_id, retry=sp.Retry(attempts=3, backoff=0.0))
    draft = run.model(
        "model.draft", scripted_model, model="scripted-1", messages=[{"role": "user", "content": case_id}]
    )
    amount = run.pure("pure.amount", lambda: quote["rate"] * 10)  # 12.5: a float in the payload
    rows = run.transaction("transaction.one", one_row)
    route = run.decide("decision.route", lambda: "refund" if "refund" in draft["text"] else "reply")
    run.now("value.now")
    run.uuid("value.uuid")
    paid = run.effect("effect.refund", refunds, payload={"case": case_id, "amount": amount}, approval=True)
    said = run.wait_for("go")
    noted = run.effect("effect.note", notes, payload={"case": case_id, "said": said, "note": quote["note"]})
    return {"paid": paid, "noted": noted, "route": route, "rows": rows}


def record_every_part(store: sp.Store, run_id: str, case_id: str = "c-1") -> None:
    """Run ``every_part`` to its end: it waits for its approval, then for its message."""
    _QUOTE_CALLS.pop(run_id, None)  # the same run id on another store fails its first read too
    with contextlib.suppress(sp.AwaitingApproval):
        sp.start(store, every_part, case_id, run_id=run_id)
    sp.approve(store, run_id, "effect.refund", by="ana", evidence="ticket 7")
    with contextlib.suppress(sp.AwaitingMessage):
        sp.resume(store, run_id)
    sp.send(store, run_id, "go", {"ok": True}, message_id="m-1", by="bob")
    sp.send(store, run_id, "later", ["never", "taken"], by="bob")
    sp.resume(store, run_id)
