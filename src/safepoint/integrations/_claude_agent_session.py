"""A Claude Code session transcript kept in the ledger, so another machine resumes the session.

The CLI writes its transcript to a local JSONL file and hands the SDK each batch of entries
(``SessionStore.append``); the SDK materializes what ``load`` returns before a resume. Here each
batch is a recorded read of the run (step ``claude.session.<digest>``, one occurrence per
batch), so the transcript is wherever the ledger is. A resume in a new process walks those
occurrences: each recorded batch replays; the first occurrence not yet recorded marks the end
(it is recorded empty, and later batches take the occurrences after it).

The entries are the CLI's, written on the caller's behalf, and hold what each CLI release
chooses (one began writing ``"credential": "key"``, the kind of credential a request used):
a batch is recorded with every credential redacted (``secrets="redact"``), never refused for
one field, and the resumed CLI reads back what was recorded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import safepoint as sp

# Session ids are UUIDs; the run's is derived from its id, so every resume names the same one.
_NAMESPACE = uuid.UUID("5b0f5d8e-3c2a-4c1e-9a57-6f1d2c9e8a11")


def session_id_of(run: sp.AsyncRun, started: int = 0) -> str:
    """The CLI session id of ``run``: a UUID made of the run id, the same on every resume.
    ``started``: how many sessions the run started before (see ``LedgerSessionStore.session``)."""
    return str(uuid.uuid5(_NAMESPACE, run.run_id if not started else f"{run.run_id}/{started}"))


class LedgerSessionStore:
    """A ``claude_agent_sdk`` ``SessionStore`` whose transcript is in the run's ledger.

    Entries are idempotent by their ``uuid`` (a batch the SDK retries is recorded once). On a
    resume, the transcript is completed from the ledger before the CLI reads it:

    - a call to one of the run's tools that the transcript holds without its result (the CLI
      stopped between the tool and recording it) gets its result from the ledger: the resumed
      session sees the receipt, not "outcome unknown";
    - a call the PreToolUse hook let through that the transcript does not hold at all (the
      process was killed before the CLI's batch with the call reached the ledger) is put back,
      with its result, after the transcript's last entry. Without it the resumed CLI would
      find the prompt unanswered, answer it with a made-up "No response requested.", and go
      on from there — with the call's effect left dispatching and its model never told."""

    def __init__(self, run: sp.AsyncRun) -> None:
        self.run = run
        self.calls: Calls | None = None  # set by options(): the run's tool calls
        self.cost_so_far = 0.0  # the CLI's cumulative cost as the last segment reported it
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self._seen: dict[str, set[str]] = {}
        self._log: list[dict[str, Any]] | None = None  # the run's sessions (``_sessions``)

    async def append(self, key: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        """Record a batch of the CLI's transcript entries (those not recorded already)."""
        slot = _slot(key)
        await self._walk(slot)
        seen = self._seen[slot]
        fresh = [e for e in entries if not (isinstance(e.get("uuid"), str) and e["uuid"] in seen)]
        if not fresh:
            return
        self._keep(slot, await self.run.read(slot, _Batch(fresh), secrets="redact"))

    async def load(self, key: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The transcript to resume from, with the ledger's results for calls it lacks."""
        slot = _slot(key)
        await self._walk(slot)
        entries = self._entries[slot]
        if not entries:
            return None
        # The hook's calls are the main session's: a subagent's transcript never gets them back.
        return await self._with_results(entries, put_back=not key.get("subpath"))

    async def session(self) -> tuple[str, bool]:
        """(id, resuming) of the CLI session the next segment runs: the run's last one, resumed,
        when the ledger holds its transcript and no flush of it failed; otherwise a new one, under
        an id no CLI was given before. A session the ledger lost entries of (a failed flush), or
        that a process started and died before its first message reached the ledger, has a
        transcript on that machine's disk that the ledger does not have: the CLI refuses to start
        a session of that id again ("already in use"), and resuming what the ledger holds of it
        would resume a transcript with a hole. The model then starts from the prompt; a call an
        earlier session made is given its first id back by the intent the hook recorded, so its
        effect is answered from the ledger, never sent again (``Session.pre_tool_use``)."""
        log = await self._sessions()
        started = [str(e["start"]) for e in log if "start" in e]
        lost = {str(e["lost"]) for e in log if "lost" in e}
        current = started[-1] if started else session_id_of(self.run)
        allowed = bool(self.calls and self.calls.allowed)
        if current not in lost and _conversation(await self.load_session(current), allowed):
            return current, True
        fresh = session_id_of(self.run, len(started))
        await self.run.read("claude.sessions", _Batch({"start": fresh}), secrets="redact")
        log.append({"start": fresh})
        return fresh, False

    async def lost(self, session_id: str) -> None:
        """Note that a batch of ``session_id``'s transcript never reached the ledger (the SDK
        said so with a ``mirror_error``): the next segment starts a new session."""
        log = await self._sessions()
        if {"lost": session_id} not in log:
            await self.run.read("claude.sessions", _Batch({"lost": session_id}), secrets="redact")
            log.append({"lost": session_id})

    async def _sessions(self) -> list[dict[str, Any]]:
        """The run's session log (step ``claude.sessions``, one occurrence per event, walked to
        its end as a transcript is): the sessions started, and those whose flush failed."""
        if self._log is None:
            self._log = [e for e in await walk(self.run, "claude.sessions", _Batch) if isinstance(e, dict)]
        return self._log

    async def load_session(self, session_id: str) -> list[dict[str, Any]]:
        """The recorded entries of the main transcript of ``session_id`` (as recorded)."""
        slot = _slot({"session_id": session_id})
        await self._walk(slot)
        return list(self._entries[slot])

    async def _walk(self, slot: str) -> None:
        if slot in self._entries:
            return
        self._entries[slot], self._seen[slot] = [], set()
        for batch in await walk(self.run, slot, _Batch):
            self._keep(slot, batch)

    def _keep(self, slot: str, batch: list[dict[str, Any]]) -> None:
        self._entries[slot].extend(batch)
        self._seen[slot].update(e["uuid"] for e in batch if isinstance(e.get("uuid"), str))

    async def _with_results(self, entries: list[dict[str, Any]], *, put_back: bool) -> list[dict[str, Any]]:
        calls = self.calls
        if calls is None:
            return entries
        answered = {
            block.get("tool_use_id")
            for entry in entries
            for block in _blocks(entry)
            if block.get("type") == "tool_result"
        }
        out: list[dict[str, Any]] = []
        held: list[tuple[str, dict[str, Any]]] = []  # the transcript's calls of the run's tools
        for entry in entries:
            out.append(entry)
            for block in _blocks(entry):
                if not _is_call(block, calls.prefix):
                    continue
                tool, arguments = str(block["name"])[len(calls.prefix) :], dict(block.get("input") or {})
                held.append((tool, block))
                if block.get("id") not in answered:
                    result = await calls.answer_orphan(tool, arguments, call_id=block["id"])
                    out.append(_result_entry(entry, block["id"], result))
        lost = lost_calls(calls.allowed, held) if put_back else []
        if lost:
            out.extend(await self._put_back(out, lost, calls))
        return out

    async def _put_back(
        self, entries: list[dict[str, Any]], lost: list[tuple[str, str, dict[str, Any]]], calls: Calls
    ) -> list[dict[str, Any]]:
        """The entries of the ``lost`` calls (id, tool, arguments), as the CLI would have
        written them: one assistant message with the calls, then each call's result from the
        ledger, chained after the transcript's last entry."""
        last = next((e for e in reversed(entries) if isinstance(e.get("uuid"), str)), None)
        if last is None:  # nothing to hang them on: the CLI starts the session afresh
            return []
        named = [(call_id, calls.prefix + tool, arguments) for call_id, tool, arguments in lost]
        added = [_call_entry(last, named)]
        for call_id, tool, arguments in lost:
            result = await calls.answer(tool, arguments, call_id=call_id)
            added.append(_result_entry(added[0], call_id, result, parent=added[-1]))
        return added


async def walk(run: sp.AsyncRun, step_id: str, function: Callable[[Any], Any]) -> list[Any]:
    """The values recorded at ``step_id``'s occurrences, in order, until the first one not
    recorded yet, which is recorded empty (``function(None)``, called only there) and marks the
    end: a later value takes the occurrence after it. The log of a run's transcript batches,
    sessions and let-through calls, kept as steps, so a resume in any process reads it back."""
    found: list[Any] = []
    while True:
        end = function(None)
        value = await run.read(step_id, end, secrets="redact")
        if end.called:
            return found
        if value:
            found.append(value)


def lost_calls(
    allowed: Mapping[str, tuple[str, dict[str, Any]]], held: list[tuple[str, dict[str, Any]]]
) -> list[tuple[str, str, dict[str, Any]]]:
    """The calls of ``allowed`` (by first id: tool and arguments) that the transcript does not
    hold, as (id, tool, arguments), in the order they were allowed. ``held``: the transcript's
    calls of the run's tools, (tool, tool_use block). A held call is one of ``allowed`` by its
    id or, when a resumed CLI's model named it again with a new id (the hook gave it back its
    first id, see ``Session.pre_tool_use``), by its tool and arguments."""
    missing = {call_id: call for call_id, call in allowed.items()}
    renamed: list[str] = []
    for tool, block in held:
        if block.get("id") in missing:
            del missing[str(block["id"])]
        else:
            renamed.append(call_intent(tool, block.get("input") or {}))
    for intent in renamed:  # each a call asked again: it holds one allowed call like it
        like = next((i for i, (t, a) in missing.items() if call_intent(t, a) == intent), None)
        if like is not None:
            del missing[like]
    return [(call_id, tool, dict(arguments)) for call_id, (tool, arguments) in missing.items()]


class Calls(Protocol):
    """What the transcript needs of the run's tool calls (``claude_agent.Session``)."""

    @property
    def prefix(self) -> str:
        """The CLI's name of one of the run's tools is prefix + its name."""

    @property
    def allowed(self) -> Mapping[str, tuple[str, dict[str, Any]]]:
        """Every call the hook let through, in any process: tool and arguments by first id."""

    async def answer(self, name: str, arguments: dict[str, Any], *, call_id: str) -> dict[str, Any]:
        """Answer the call ``call_id`` through the ledger (its step ``tool.<call_id>``)."""

    async def answer_orphan(self, name: str, arguments: dict[str, Any], *, call_id: str) -> dict[str, Any]:
        """Answer a call the transcript holds under ``call_id`` (an earlier call's, if aliased)."""


class _Batch:
    """The function of one transcript step (or one event of the session log): it returns its
    value (``None`` at the end), and says whether it was called — a recorded step replays
    without calling it. One class for every writer, so the step's recorded name is the same
    whichever wrote it."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.called = False

    def __call__(self) -> Any:
        self.called = True
        return self.value


def _slot(key: Mapping[str, Any]) -> str:
    """The step id of a transcript: by session and subagent path (not the project key, which
    is made of the working directory and differs from machine to machine)."""
    name = str(key.get("session_id", "")) + "/" + str(key.get("subpath") or "")
    return "claude.session." + hashlib.sha256(name.encode()).hexdigest()[:16]


def _conversation(entries: list[dict[str, Any]], allowed: bool) -> bool:
    """Whether a transcript holds a conversation the CLI can resume: a reply of the model's, or
    the prompt and calls the hook let through (``load`` puts them back after it). Its first
    batch may hold only the CLI's own records (the request's route, the prompt's queueing): a
    CLI told to resume that answers "No conversation found". One that holds the prompt alone is
    answered by the resumed CLI itself ("No response requested."), and the model, asked to go on
    from there, never makes the call: such a session is started again from the prompt."""
    kinds = {e.get("type") for e in entries if isinstance(e.get("uuid"), str)}
    return "assistant" in kinds or ("user" in kinds and allowed)


def _blocks(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _is_call(block: Mapping[str, Any], prefix: str) -> bool:
    return block.get("type") == "tool_use" and str(block.get("name", "")).startswith(prefix)


def call_intent(tool: str, arguments: Mapping[str, Any]) -> str:
    """A call's tool and arguments as one string: calls alike have the same."""
    return tool + ":" + json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def intent_digest(intent: str) -> str:
    """What step ``claude.intent`` records of a ``call_intent``: its digest, which holds none
    of the arguments (a ledger written before recorded the intent itself; both are matched)."""
    return "sha256:" + hashlib.sha256(intent.encode()).hexdigest()


# The fields of a transcript entry that say where it was written, not what it holds.
_PLACE = ("isSidechain", "userType", "entrypoint", "cwd", "sessionId", "version", "gitBranch", "timestamp")


def _call_entry(last: Mapping[str, Any], calls: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """The assistant entry the CLI would have written for ``calls`` (id, CLI tool name,
    arguments), child of ``last``. Its uuid and message id are made of the first call's id: a
    later resume puts back the same entry."""
    first = calls[0][0]
    entry = {k: copy.deepcopy(last[k]) for k in _PLACE if k in last}
    entry.update(
        parentUuid=last.get("uuid"),
        type="assistant",
        uuid=str(uuid.uuid5(_NAMESPACE, "call/" + first)),
        message={
            "id": "msg_" + uuid.uuid5(_NAMESPACE, "message/" + first).hex,
            "type": "message",
            "role": "assistant",
            "model": "<synthetic>",
            "content": [
                {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
                for call_id, name, arguments in calls
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    )
    return entry


def _result_entry(
    assistant: Mapping[str, Any],
    tool_use_id: str,
    result: Mapping[str, Any],
    *,
    parent: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The transcript entry the CLI would have written for the call's result, had it not
    stopped first: a user message answering ``tool_use_id``, child of ``parent`` (the
    assistant entry unless given)."""
    entry = {k: copy.deepcopy(v) for k, v in assistant.items() if k not in ("message", "requestId")}
    entry.update(
        parentUuid=(parent or assistant).get("uuid"),
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
