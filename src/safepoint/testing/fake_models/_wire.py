"""What the three wire formats share: the interface each API module implements, ids derived from
the request, deterministic token counts, and server-sent-event framing."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from typing import Any

from ._script import Turn

JSON = dict[str, Any]

# 2026-01-01T00:00:00Z: a reply with ids derived from the request is derived entirely, time too,
# so a repeated request gets a byte-identical answer.
_FIXED_CREATED = 1_767_225_600
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_WORD = re.compile(r"\s*\S+\s*|\s+")
_ARGUMENT_PIECE = 12  # characters of a tool call's JSON per streamed delta


def canonical(value: Any) -> str:
    """``value`` as canonical JSON (sorted keys, no spaces): equal values, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(body: Any) -> str:
    """The sha256 of ``body``'s canonical JSON, in hex."""
    return hashlib.sha256(canonical(body).encode()).hexdigest()


class Refused(Exception):
    """The request is one the real API answers 400 (``orphan``: a tool call and its result do
    not pair up); ``param`` and ``code`` fill the OpenAI error body."""

    def __init__(self, message: str, *, orphan: bool = False, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.orphan = orphan
        self.param = param


class ScriptProblem(Exception):
    """The script cannot answer this request (no such turn, a stop the API has no word for)."""


class Ids:
    """Mints a reply's ids and timestamp: from the request's digest (the same request, the same
    ids) or, ``fresh``, from a random seed and the clock, as a real API does."""

    def __init__(self, request_digest: str, *, fresh: bool) -> None:
        self._seed = secrets.token_hex(16) if fresh else request_digest
        self.created = int(time.time()) if fresh else _FIXED_CREATED

    def _bytes(self, kind: str) -> bytes:
        return hashlib.sha256(f"{self._seed}:{kind}".encode()).digest()

    def base62(self, kind: str, length: int) -> str:
        """``length`` base-62 characters naming ``kind`` (e.g. ``"tool.0"``) in this reply."""
        number = int.from_bytes(self._bytes(kind), "big")
        chars = []
        for _ in range(length):
            number, rest = divmod(number, 62)
            chars.append(_BASE62[rest])
        return "".join(chars)

    def hex(self, kind: str, length: int) -> str:
        """``length`` hex digits naming ``kind`` in this reply."""
        return self._bytes(kind).hex()[:length]


def tokens(text: str) -> int:
    """A deterministic token count for ``text``: about four characters a token, at least one."""
    return max(1, (len(text) + 3) // 4)


def input_tokens(body: JSON) -> int:
    """The prompt's token count: the request body without its transport switches."""
    return tokens(canonical({k: v for k, v in body.items() if k not in ("stream", "stream_options")}))


def output_tokens(turn: Turn) -> int:
    """The reply's token count: its text and its tool calls."""
    return tokens(turn.content + "".join(name + arguments for name, arguments in turn.calls))


def words(text: str) -> list[str]:
    """``text`` cut into the pieces a stream sends one delta each (a word and its spaces)."""
    return _WORD.findall(text)


def pieces(text: str) -> list[str]:
    """A tool call's JSON text cut into the pieces a stream sends."""
    return [text[i : i + _ARGUMENT_PIECE] for i in range(0, len(text), _ARGUMENT_PIECE)]


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event: ``event:`` line (when named) and ``data:`` line, then a blank line.
    A str ``data`` is sent as it is (``[DONE]``), anything else as JSON."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


class WireApi:
    """One API's wire format. The server asks, in order: ``turn_of`` (which turn answers),
    ``check`` (raise ``Refused`` for what the real API answers 400), ``render`` (the reply as
    the API's JSON), ``frames`` (the same reply as the API's server-sent events), and
    ``error`` for the API's error body."""

    name: str
    path: str
    request_id_header: str

    def turn_of(self, body: JSON) -> int:
        """How many assistant turns the request's history holds: the script's index for it."""
        raise NotImplementedError

    def check(self, body: JSON) -> None:
        """Raise ``Refused`` for a request the real API answers 400."""
        raise NotImplementedError

    def render(self, body: JSON, turn: Turn, ids: Ids) -> JSON:
        """``turn`` as the API's JSON reply to ``body`` (``ScriptProblem`` if it has no form here)."""
        raise NotImplementedError

    def frames(self, body: JSON, reply: JSON) -> list[bytes]:
        """``reply`` as the server-sent events that a streaming client accumulates into it."""
        raise NotImplementedError

    def error(self, status: int, message: str | None, *, request_id: str, param: str | None = None) -> JSON:
        """The API's error body for a ``status`` answer (``message``: ``None`` for the API's own
        words for that status)."""
        raise NotImplementedError

    def request_id(self, ids: Ids) -> str:
        """The value of the ``request_id_header`` the reply carries."""
        return "req_" + ids.base62("request", 24)


def blocks(message: Any) -> list[JSON]:
    """A message's content as a list of block dicts (a plain-text content has none)."""
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def assistant_messages(body: JSON) -> int:
    """How many assistant messages the body's ``messages`` hold (Anthropic's and Chat's turn)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def missing_field(body: JSON, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` the body lacks, if any."""
    return next((name for name in names if name not in body), None)
