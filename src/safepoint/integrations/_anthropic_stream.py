"""A recorded stream: a model step's final message, offered as the SDK's own stream.

A stream step records the message the stream ended with, never its events (their split is the
server's whim, and a replay must not depend on it). The workflow then reads a stream made from
that message — on the first run as on every replay, so both see the same thing: the SDK's own
``MessageStream`` (``BetaMessageStream``, and their async forms) fed with events synthesized from
the message — one ``message_start``, per content block a ``content_block_start``, its text,
JSON, thinking or signature as one delta each, a ``content_block_stop``, then ``message_delta``
and ``message_stop``. Iteration, ``text_stream``, ``until_done()`` and ``get_final_text()``
behave as the SDK's; ``get_final_message()`` returns the message rebuilt from the record
itself. The events come at once, after the whole reply is in: a recorded stream shows progress
no sooner than the step that made it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

import httpx2
from anthropic import types as api
from anthropic.lib.streaming import (
    AsyncMessageStream,
    BetaAsyncMessageStream,
    BetaMessageStream,
    MessageStream,
)
from anthropic.types import beta as beta_api

T = TypeVar("T")

_EVENTS: dict[bool, dict[str, Any]] = {
    False: {
        "message_start": api.RawMessageStartEvent,
        "content_block_start": api.RawContentBlockStartEvent,
        "content_block_delta": api.RawContentBlockDeltaEvent,
        "content_block_stop": api.RawContentBlockStopEvent,
        "message_delta": api.RawMessageDeltaEvent,
        "message_stop": api.RawMessageStopEvent,
    },
    True: {
        "message_start": beta_api.BetaRawMessageStartEvent,
        "content_block_start": beta_api.BetaRawContentBlockStartEvent,
        "content_block_delta": beta_api.BetaRawContentBlockDeltaEvent,
        "content_block_stop": beta_api.BetaRawContentBlockStopEvent,
        "message_delta": beta_api.BetaRawMessageDeltaEvent,
        "message_stop": beta_api.BetaRawMessageStopEvent,
    },
}

# Blocks whose input the SDK assembles from input_json deltas.
_TOOL_INPUTS = {False: ("tool_use", "server_tool_use"), True: ("tool_use", "server_tool_use", "mcp_tool_use")}


def event_dicts(recorded: dict[str, Any], *, beta: bool) -> list[dict[str, Any]]:
    """The events, as the API's JSON, that a stream ending in message ``recorded`` sends."""
    started = {**recorded, "content": [], "stop_reason": None, "stop_sequence": None}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": started}]
    for index, block in enumerate(recorded.get("content") or []):
        opened, deltas = _opening(block, beta)
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events.extend({"type": "content_block_delta", "index": index, "delta": d} for d in deltas)
        events.append({"type": "content_block_stop", "index": index})
    delta = {k: recorded.get(k) for k in ("stop_reason", "stop_sequence")}
    for key in ("stop_details", "container"):
        if recorded.get(key) is not None:
            delta[key] = recorded[key]
    usage = recorded.get("usage")
    output_tokens = usage.get("output_tokens", 0) if isinstance(usage, dict) else 0
    events.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": output_tokens}})
    events.append({"type": "message_stop"})
    return events


def _opening(block: Any, beta: bool) -> tuple[Any, list[dict[str, Any]]]:
    """A content block as its ``content_block_start`` opens it, and the deltas that fill it.
    A block of any other type (or one this SDK does not know) opens whole."""
    if not isinstance(block, dict):
        return block, []
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        opened = {k: v for k, v in block.items() if k != "citations"}
        deltas: list[dict[str, Any]] = (
            [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
        )
        deltas += [{"type": "citations_delta", "citation": c} for c in block.get("citations") or []]
        return {**opened, "text": ""}, deltas
    if kind in _TOOL_INPUTS[beta] and "input" in block:
        given = block["input"]
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(given)}] if given else []
        return {**block, "input": {}}, deltas
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}] if block["thinking"] else []
        if isinstance(block.get("signature"), str):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {**block, "thinking": "", "signature": ""}, deltas
    return block, []


def raw_events(recorded: dict[str, Any], *, beta: bool) -> list[Any]:
    """The SDK's raw stream events for ``event_dicts`` (built leniently, like a reply)."""
    classes = _EVENTS[beta]
    return [classes[e["type"]].construct(**e) for e in event_dicts(recorded, beta=beta)]


def _stand_in_response() -> httpx2.Response:
    # The SDK's stream classes read the request's headers off the response; a recorded stream
    # came from no response of this process, so it gets an empty one (no request id).
    return httpx2.Response(200, request=httpx2.Request("POST", "http://recorded.invalid/v1/messages"))


class RecordedEvents:
    """The raw events of a recorded reply, as ``create(stream=True)`` gives them: iterate it
    (or ``with`` it, as the SDK's ``Stream``); ``message`` is the reply rebuilt."""

    def __init__(self, events: list[Any], message: Any) -> None:
        self.message = message
        self.response = _stand_in_response()
        self._events = iter(events)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self._events)

    def close(self) -> None:
        """Stop the iteration (nothing is open: the events are the record's)."""
        self._events = iter(())

    def __enter__(self) -> RecordedEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRecordedEvents:
    """``RecordedEvents`` for the async client: ``async for`` / ``async with``."""

    def __init__(self, events: list[Any], message: Any) -> None:
        self.message = message
        self.response = _stand_in_response()
        self._events = iter(events)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._events)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        """Stop the iteration."""
        self._events = iter(())

    async def __aenter__(self) -> AsyncRecordedEvents:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Recorded:
    """What the recorded streams add to the SDK's: the reply rebuilt from the record, which
    ``get_final_message()`` returns once the events are read."""

    _recorded: Any

    def __init__(self, events: RecordedEvents | AsyncRecordedEvents, output_format: Any) -> None:
        super().__init__(cast(Any, events), output_format=output_format)  # type: ignore[call-arg]
        self._recorded = events.message


class _RecordedSync(_Recorded):
    def get_final_message(self) -> Any:
        cast(Any, self).until_done()
        return self._recorded


class _RecordedAsync(_Recorded):
    async def get_final_message(self) -> Any:
        await cast(Any, self).until_done()
        return self._recorded


class RecordedMessageStream(_RecordedSync, MessageStream[T]):
    """The SDK's ``MessageStream`` over a recorded reply; ``get_final_message()`` is the
    reply rebuilt from the record."""


class RecordedBetaMessageStream(_RecordedSync, BetaMessageStream[T]):
    """``RecordedMessageStream`` of the beta API."""


class AsyncRecordedMessageStream(_RecordedAsync, AsyncMessageStream[T]):
    """The SDK's ``AsyncMessageStream`` over a recorded reply."""


class AsyncRecordedBetaMessageStream(_RecordedAsync, BetaAsyncMessageStream[T]):
    """``AsyncRecordedMessageStream`` of the beta API."""


S = TypeVar("S", bound="MessageStream[Any] | BetaMessageStream[Any]")
A = TypeVar("A", bound="AsyncMessageStream[Any] | BetaAsyncMessageStream[Any]")


class RecordedStreamManager(Generic[S]):
    """What ``messages.stream(...)`` returns: entering it takes the model step (replayed, or
    asked and recorded), then gives the stream of its reply — a ``MessageStream`` (or the
    beta's ``BetaMessageStream``)."""

    def __init__(
        self,
        take_step: Callable[[], RecordedEvents],
        stream: Callable[[RecordedEvents, Any], S],
        output_format: Any,
    ) -> None:
        self._take_step = take_step
        self._make_stream: Callable[[RecordedEvents, Any], S] = stream
        self._output_format = output_format
        self._stream: S | None = None

    def __enter__(self) -> S:
        self._stream = self._make_stream(self._take_step(), self._output_format)
        return self._stream

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stream is not None:
            self._stream.close()


class AsyncRecordedStreamManager(Generic[A]):
    """``RecordedStreamManager`` for the async client: ``async with``."""

    def __init__(
        self,
        take_step: Callable[[], Awaitable[AsyncRecordedEvents]],
        stream: Callable[[AsyncRecordedEvents, Any], A],
        output_format: Any,
    ) -> None:
        self._take_step = take_step
        self._make_stream: Callable[[AsyncRecordedEvents, Any], A] = stream
        self._output_format = output_format
        self._stream: A | None = None

    async def __aenter__(self) -> A:
        self._stream = self._make_stream(await self._take_step(), self._output_format)
        return self._stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stream is not None:
            await self._stream.close()
