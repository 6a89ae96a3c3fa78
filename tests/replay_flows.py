"""Workflows ``safepoint replay`` and ``safepoint check-deploy`` are tested with (importable as
``replay_flows``, for ``--import``).

The code a run is replayed under is chosen when the workflow runs, by ``$REPLAY_FLOWS_VARIANT``
(unset: the code as recorded; ``prompt edited``: the model-like decision is asked something
else), so that one process records a run and replays it under changed code.
"""

from __future__ import annotations

import os
from typing import Any

import safepoint as sp

VARIANT = "REPLAY_FLOWS_VARIANT"
CALLS: dict[str, int] = {}  # step function -> times called in this process


def _called(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def lookup(order_id: str) -> dict[str, Any]:
    _called("lookup")
    return {"order": order_id, "stock": 3}


def plan(prompt: str) -> dict[str, str]:
    _called("plan")
    return {"next_step_id": "ship"}


def ship(payload: Any, key: sp.EffectKey) -> dict[str, str]:
    _called("ship")
    return {"shipment": f"s-{payload['order']}"}


shipments = sp.Effect("replay-flows.ship", execute=ship)


@sp.workflow("replay-flows-order")
def order(run: sp.Run, order_id: str) -> dict[str, Any]:
    """A read, a model-like decision, an effect, a pure step, a value, then a wait."""
    found = run.read("lookup", lookup, order_id)
    prompt = f"plan order {order_id}"
    if os.environ.get(VARIANT) == "prompt edited":
        prompt += " (be brief)"
    decided = run.decide("plan", plan, prompt)
    receipt = run.effect("ship", shipments, payload={"order": order_id, "next": decided["next_step_id"]})
    total = run.pure("total", lambda f: f["stock"] * 2, found)
    stamp = run.uuid("stamp")
    word = run.wait_for("confirm")
    return {"receipt": receipt, "total": total, "stamp": stamp, "word": word}


def echo(text: str) -> str:
    if text.startswith("fail"):
        raise ValueError(text)
    return text


@sp.workflow("replay-flows-echo")
def echoed(run: sp.Run, text: str) -> dict[str, str]:
    """Returns (or raises with) whatever it is given: a value from the ledger to print."""
    return {"said": run.read("echo", echo, text)}
