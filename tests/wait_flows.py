"""Workflows the waits tests run, in this process and in child processes (importable as
``wait_flows``): they wait for messages and sleep, and send one effect to the local owner after
the wait, so a test counts at the owner whether anything after a wait happened twice."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import safepoint as sp
from safepoint.testing import owner_effect

replies = owner_effect("refunds")


def case(case_id: str) -> dict[str, Any]:
    return {"case": case_id}


@sp.workflow("waits-answer", version="1")
def answer(run: sp.Run, case_id: str) -> dict[str, Any]:
    """Read, wait for the answer, then send one reply carrying it."""
    found = run.read("read.case", case, case_id)
    said = run.wait_for("answer")
    reply = run.effect("effect.reply", replies, payload={"case": found["case"], "answer": said})
    return {"answer": said, "reply": reply["id"]}


@sp.workflow("waits-answer-async", version="1")
async def answer_async(run: sp.AsyncRun, case_id: str) -> dict[str, Any]:
    found = await run.read("read.case", case, case_id)
    said = await run.wait_for("answer")
    reply = await run.effect("effect.reply", replies, payload={"case": found["case"], "answer": said})
    return {"answer": said, "reply": reply["id"]}


@sp.workflow("waits-twice", version="1")
def twice(run: sp.Run) -> list[Any]:
    """Two waits for messages of one name: each takes its own, oldest first."""
    return [run.wait_for("vote"), run.wait_for("vote")]


@sp.workflow("waits-local", version="1")
def local(run: sp.Run, name: str) -> Any:
    """One wait, and nothing else to send anywhere."""
    return run.wait_for(name)


@sp.workflow("waits-timeout", version="1")
def timeout(run: sp.Run, seconds: float) -> dict[str, Any]:
    """A wait that may time out: the workflow goes on without the message."""
    try:
        return {"answer": run.wait_for("answer", timeout=seconds)}
    except sp.WaitTimedOut as exc:
        return {"timed_out": exc.timeout_at}


@sp.workflow("waits-timeout-async", version="1")
async def timeout_async(run: sp.AsyncRun, seconds: float) -> dict[str, Any]:
    try:
        return {"answer": await run.wait_for("answer", timeout=seconds)}
    except sp.WaitTimedOut as exc:
        return {"timed_out": exc.timeout_at}


@sp.workflow("waits-sleep", version="1")
def sleeper(run: sp.Run, case_id: str, seconds: float) -> dict[str, Any]:
    """Sleep, then send one reply."""
    run.read("read.case", case, case_id)
    run.sleep(timedelta(seconds=seconds))
    reply = run.effect("effect.reply", replies, payload={"case": case_id, "slept": seconds})
    return {"reply": reply["id"]}


@sp.workflow("waits-sleep-async", version="1")
async def sleeper_async(run: sp.AsyncRun, seconds: float) -> str:
    await run.sleep(seconds)
    return "woke"


@sp.workflow("waits-questions", version="1")
def questions(run: sp.Run, case_id: str) -> list[str]:
    """Two questions of one name, each gating the reply sent after it."""
    sent = []
    for n in (1, 2):
        said = run.wait_for("answer")
        reply = run.effect(f"effect.reply.{n}", replies, payload={"case": case_id, "n": n, "answer": said})
        sent.append(str(reply["id"]))
    return sent


@sp.workflow("waits-questions-async", version="1")
async def questions_async(run: sp.AsyncRun, case_id: str) -> list[str]:
    sent = []
    for n in (1, 2):
        said = await run.wait_for("answer")
        reply = await run.effect(
            f"effect.reply.{n}", replies, payload={"case": case_id, "n": n, "answer": said}
        )
        sent.append(str(reply["id"]))
    return sent
