"""A Claude Code session transcript kept in the ledger, so another machine resumes the session.

The CLI writes its transcript to a local JSONL file and hands the SDK each batch of entries
(``SessionStore.append``); the SDK materializes what ``load`` returns before a resume. Here each
batch is a recorded read of the run (step ``claude.session.<digest>``, one occurrence per
batch), so the transcript is wherever the ledger is. A resume in a new process walks those
occurrences: each recorded batch replays; the first occurrence not yet recorded marks the end
(it is recorded empty, and later batches take the occurrences after it).
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import safepoint as sp

# Session ids are UUIDs; the run's is derived from its id, so every resume names the same one.
_NAMESPACE = uuid.UUID("5b0f5d8e-3c2a-4c1e-9a57-6f1d2c9e8a11")

Answer = Callable[..., Awaitable[dict[str, Any]]]


def session_id_of(run: sp.AsyncRun) -> str:
    """The CLI session id of ``run``: a UUID made of the run id, the same on every resume."""
    return str(uuid.uuid5(_NAMESPACE, run.run_id))


class LedgerSessionStore:
    """A ``claude_agent_sdk`` ``SessionStore`` whose transcript is in the run's ledger.

    Entries are idempotent by their ``uuid`` (a batch the SDK retries is recorded once). On a
    resume, a call to one of the run's tools that the transcript holds without its result (the
    CLI stopped between the tool and recording it) gets its result from the ledger: the
    resumed session sees the receipt, not "outcome unknown"."""

    def __init__(self, run: sp.AsyncRun) -> None:
        self.run = run
        self.answer_orphan: Answer | None = None  # set by options(): answers a call by id
        self.tool_prefix = ""
        self.cost_so_far = 0.0  # the CLI's cumulative cost as the last segment reported it
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self._seen: dict[str, set[str]] = {}

    async def append(self, key: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        """Record a batch of the CLI's transcript entries (those not recorded already)."""
        slot = _slot(key)
        await self._walk(slot)
        seen = self._seen[slot]
        fresh = [e for e in entries if not (isinstance(e.get("uuid"), str) and e["uuid"] in seen)]
        if not fresh:
            return
        await self.run.read(slot, _Batch(fresh))
        self._keep(slot, fresh)

    async def load(self, key: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The transcript to resume from, with the ledger's results for calls it lacks."""
        slot = _slot(key)
        await self._walk(slot)
        entries = self._entries[slot]
        if not entries:
            return None
        return await self._with_results(entries)

    async def load_session(self, session_id: str) -> list[dict[str, Any]]:
        """The recorded entries of the main transcript of ``session_id`` (as recorded)."""
        slot = _slot({"session_id": session_id})
        await self._walk(slot)
        return list(self._entries[slot])

    async def _walk(self, slot: str) -> None:
        if slot in self._entries:
            return
        self._entries[slot], self._seen[slot] = [], set()
        while True:
            end = _Batch(None)  # called only where nothing is recorded yet: the end
            batch = await self.run.read(slot, end)
            if end.called:
                return
            if batch:
                self._keep(slot, batch)

    def _keep(self, slot: str, batch: list[dict[str, Any]]) -> None:
        self._entries[slot].extend(batch)
        self._seen[slot].update(e["uuid"] for e in batch if isinstance(e.get("uuid"), str))

    async def _with_results(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answered = {
            block.get("tool_use_id")
            for entry in entries
            for block in _blocks(entry)
            if block.get("type") == "tool_result"
        }
        out: list[dict[str, Any]] = []
        for entry in entries:
            out.append(entry)
            for block in _blocks(entry):
                name = str(block.get("name", ""))
                if (
                    block.get("type") == "tool_use"
                    and block.get("id") not in answered
                    and name.startswith(self.tool_prefix)
                    and self.answer_orphan is not None
                ):
                    result = await self.answer_orphan(
                        name[len(self.tool_prefix) :], dict(block.get("input") or {}), call_id=block["id"]
                    )
                    out.append(_result_entry(entry, block["id"], result))
        return out


class _Batch:
    """The function of one transcript step: it returns its batch (``None`` at the end), and
    says whether it was called — a recorded step replays without calling it. One class for
    both, so the step's recorded name is the same whichever wrote it."""

    def __init__(self, entries: list[dict[str, Any]] | None) -> None:
        self.entries = entries
        self.called = False

    def __call__(self) -> list[dict[str, Any]] | None:
        self.called = True
        return self.entries


def _slot(key: Mapping[str, Any]) -> str:
    """The step id of a transcript: by session and subagent path (not the project key, which
    is made of the working directory and differs from machine to machine)."""
    name = str(key.get("session_id", "")) + "/" + str(key.get("subpath") or "")
    return "claude.session." + hashlib.sha256(name.encode()).hexdigest()[:16]


def _blocks(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_entry(
    assistant: Mapping[str, Any], tool_use_id: str, result: Mapping[str, Any]
) -> dict[str, Any]:
    """The transcript entry the CLI would have written for the call's result, had it not
    stopped first: a user message answering ``tool_use_id``, child of the assistant entry."""
    entry = {k: copy.deepcopy(v) for k, v in assistant.items() if k not in ("message", "requestId")}
    entry.update(
        parentUuid=assistant.get("uuid"),
        type="user",
        uuid=str(uuid.uuid5(_NAMESPACE, "result/" + tool_use_id)),
        message={
            "role": "user",
            "content": [
                {
                    "tool_use_id": tool_use_id,
                    "type": "tool_result",
                    "content": result.get("content", []),
                    "is_error": bool(result.get("is_error", False)),
                }
            ],
        },
    )
    return entry
