"""What a fake model says (``Turn``) and what it was asked (``FakeRequest``): API-neutral, so
one script answers an Anthropic, a Chat Completions and a Responses client alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import UsageError

#: The names of the APIs the fake speaks, as ``FakeRequest.api`` and the faults' ``api=`` say them.
ANTHROPIC = "anthropic"
CHAT = "chat"
RESPONSES = "responses"
APIS = (ANTHROPIC, CHAT, RESPONSES)


@dataclass(frozen=True, slots=True)
class Turn:
    """One assistant turn of a script, rendered in the wire format of whichever API is asked.

    Build one with ``Turn.text``, ``Turn.tool_calls`` or ``Turn.stop``: ``content`` is the
    turn's text, ``calls`` its tool calls as ``(name, arguments as JSON text)`` pairs, and
    ``stop_reason`` a special ending (``None``: the API's ordinary one — ``end_turn`` /
    ``tool_use``, ``stop`` / ``tool_calls``, ``completed``).
    """

    content: str = ""
    calls: tuple[tuple[str, str], ...] = ()
    stop_reason: str | None = None

    @classmethod
    def text(cls, text: str) -> Turn:
        """A turn that answers ``text`` and ends normally (``end_turn``, ``stop``, ``completed``)."""
        if not isinstance(text, str):
            raise UsageError(f"Turn.text takes a str, not {type(text).__name__}")
        return cls(content=text)

    @classmethod
    def tool_calls(cls, *calls: tuple[str, Mapping[str, Any] | str], text: str = "") -> Turn:
        """A turn that asks for the tools ``calls``, each a ``(name, arguments)`` pair, in order
        (several make one turn of parallel calls), optionally after some ``text``.

        ``arguments`` is a dict, or a str sent verbatim as the arguments' JSON text — so a test
        can have the model send invalid JSON (the OpenAI APIs carry it as text; Anthropic's
        ``input`` must be a JSON object, so there it must parse as one).
        """
        if not calls:
            raise UsageError("Turn.tool_calls needs at least one (name, arguments) pair")
        rendered: list[tuple[str, str]] = []
        for call in calls:
            if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], str) and call[0]):
                raise UsageError(f"a tool call is a (name, arguments) pair, not {call!r}")
            name, arguments = call
            if isinstance(arguments, str):
                rendered.append((name, arguments))
            elif isinstance(arguments, Mapping):
                rendered.append(
                    (name, json.dumps(dict(arguments), ensure_ascii=False, separators=(",", ":")))
                )
            else:
                raise UsageError(f"the arguments of {name!r} are a dict or JSON text, not {arguments!r}")
        return cls(content=text, calls=tuple(rendered))

    @classmethod
    def stop(cls, reason: str, text: str = "") -> Turn:
        """A turn that ends for ``reason``, optionally after some ``text``.

        A reason is named in any API's words and translated to the one asked: ``max_tokens`` =
        ``length`` = ``incomplete`` (Responses: ``incomplete``, ``max_output_tokens``);
        ``refusal`` = ``content_filter`` (Responses: ``incomplete``, ``content_filter``);
        ``incomplete:<reason>`` names a Responses ``incomplete_details.reason``. ``pause_turn``
        and ``compaction`` exist only in Anthropic's API; any other reason is sent as it is
        (to Anthropic and Chat Completions), for a test of a reason the client does not know.
        """
        if not (isinstance(reason, str) and reason):
            raise UsageError("Turn.stop needs a reason, e.g. 'max_tokens' or 'pause_turn'")
        return cls(content=text, stop_reason=reason)


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """One request the fake received: which ``api`` (``"anthropic"``, ``"chat"`` or
    ``"responses"``), its ``path``, ``headers`` (lower-case names), JSON ``body``, its ``turn``
    (how many assistant turns its history holds: the index into the script), and ``digest``
    (sha256 of the body's canonical JSON — equal bodies, equal digests, equal ids in the reply).
    """

    api: str
    path: str
    headers: Mapping[str, str] = field(repr=False)
    body: Mapping[str, Any] = field(repr=False)
    turn: int
    digest: str

    @property
    def stream(self) -> bool:
        """Whether the request asked for server-sent events (``"stream": true``)."""
        return self.body.get("stream") is True

    @property
    def retry_count(self) -> int | None:
        """The SDK's ``x-stainless-retry-count`` header: 0 for a first attempt, 1 for its first
        retry…; ``None`` when the client sent none."""
        value = self.headers.get("x-stainless-retry-count")
        return int(value) if value is not None and value.isdigit() else None
