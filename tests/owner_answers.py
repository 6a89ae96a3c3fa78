"""An effect whose owner answers what ``$RESOLVE_TEST_ANSWER`` says (importable as
``owner_answers``, also by a `safepoint resolve --import owner_answers` child process)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import safepoint as sp

ANSWER_ENV = "RESOLVE_TEST_ANSWER"
asked: list[str] = []  # the keys this process's reconcile was asked about
sent: list[str] = []  # the keys execute was called with


def send(payload: Any, key: sp.EffectKey) -> Any:
    sent.append(str(key))
    if len(sent) % 2:  # every other call: the response is lost
        raise TimeoutError("no answer from the owner")
    return {"id": "tk_1"}


def ask(key: sp.EffectKey) -> sp.Applied | sp.NotApplied | sp.Unknown:
    asked.append(str(key))
    answer = os.environ.get(ANSWER_ENV, "unknown")
    if answer == "applied":
        return sp.Applied({"id": "tk_9", "title": "t"})
    if answer == "not_applied":
        return sp.NotApplied()
    if answer == "raise":
        raise ConnectionError("the owner is down")
    return sp.Unknown("the owner's index lags")


tickets = sp.Effect("owner-answers.ticket", execute=send, reconcile=ask, dedup_retention=timedelta(hours=1))


@sp.workflow("owner-answers")
def flow(run: sp.Run) -> Any:
    return run.effect("ticket", tickets, payload={"title": "t"})
