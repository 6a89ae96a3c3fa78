"""Workflows the limits tests run in child processes (importable as ``limit_flows``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import safepoint as sp
from safepoint.testing import owner_effect


def flaky_fetch(calls_path: str, fail_first: int) -> dict[str, Any]:
    """Fails its first ``fail_first`` calls, counted in a file that every process appends to
    (with its pid and the wall-clock time of the call)."""
    path = Path(calls_path)
    made = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as calls:
        calls.write(json.dumps({"pid": os.getpid(), "at_ms": time.time_ns() // 1_000_000}) + "\n")
    if made < fail_first:
        raise TimeoutError(f"the quote service timed out (call {made + 1})")
    return {"quote": 1.0842, "call": made + 1}


@sp.workflow("limits-flaky-read", version="1")
def flaky_read(run: sp.Run, calls_path: str, fail_first: int, attempts: int) -> dict[str, Any]:
    """One read, tried ``attempts`` times with a back-off long enough to be killed in."""
    try:
        value = run.read(
            "read.quote", flaky_fetch, calls_path, fail_first, retry=sp.Retry(attempts=attempts, backoff=1.5)
        )
    except sp.StepFailed as failed:
        return {"gave_up_after": failed.attempts}
    return {"value": value}


# -- stopped at a limit, raised, carried on ----------------------------------------------------

CALLS_ENV = "SAFEPOINT_TEST_MODEL_CALLS"  # a file every model call of these workflows appends to
notes = owner_effect("tickets", name="limits.notes")


def counted_model(*, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """A model that answers at once, reports 17 tokens, and appends each call it makes (the
    process, the question) to the file ``$SAFEPOINT_TEST_MODEL_CALLS`` names."""
    with Path(os.environ[CALLS_ENV]).open("a") as calls:
        calls.write(json.dumps({"pid": os.getpid(), "asked": messages[-1]["content"]}) + "\n")
    return {
        "text": f"ok {messages[-1]['content']}",
        "model": model,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }


@sp.workflow("limits-turns", version="1", budget=sp.Budget(model_calls=3))
def turns(run: sp.Run, tag: str, count: int) -> dict[str, Any]:
    """``count`` turns, each a model call then an effect at the owner; a turn limit of 3."""
    receipts = []
    for turn in range(count):
        reply = run.model(
            f"turn.{turn}",
            counted_model,
            model="m-1",
            messages=[{"role": "user", "content": f"{tag}/{turn}"}],
        )
        receipts.append(run.effect(f"note.{turn}", notes, payload={"tag": tag, "reply": reply["text"]})["id"])
    return {"notes": receipts}
