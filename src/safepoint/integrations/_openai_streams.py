"""Streams, replayed: a streamed reply is recorded as the final completion or response it added
up to, and the workflow is handed a stream rebuilt from that record — on the first run as on
every replay, so both see the same (redacted) reply.

The events are synthesized from the record in each API's wire order (a chat completion as its
role, content, refusal and tool-call chunks, then the finish and the usage; a response as
``response.created``, each output item added, its parts and deltas, done, then the terminal
event) and fed through the SDK's own accumulators (``ChatCompletionStreamState``,
``ResponseStreamState``), so the events a caller sees are the SDK's own types with the SDK's
snapshots and parsing. Each delta carries a whole part at once: the tokens' pacing is not
recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

from openai.lib.streaming.chat import ChatCompletionStreamEvent, ChatCompletionStreamState
from openai.lib.streaming.responses import ResponseStreamEvent, ResponseStreamState
from openai.types.chat import ChatCompletionChunk, ParsedChatCompletion
from openai.types.responses import (
    ParsedResponse,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseRefusalDeltaEvent,
    ResponseRefusalDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses import ResponseStreamEvent as RawResponseEvent

T = TypeVar("T")
S = TypeVar("S")


# -- the events a record implies ---------------------------------------------------------------


def completion_chunks(recorded: dict[str, Any]) -> list[ChatCompletionChunk]:
    """The chunks a chat completion streams as: per choice its role and content, its refusal,
    each tool call, its finish; then the usage, as a stream asked to include it ends."""
    base: dict[str, Any] = {
        key: recorded[key]
        for key in ("id", "created", "model", "system_fingerprint", "service_tier")
        if key in recorded
    }
    base["object"] = "chat.completion.chunk"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk.construct(**base, choices=choices, **extra)

    chunks: list[ChatCompletionChunk] = []
    for choice in recorded.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        first: dict[str, Any] = {"role": message.get("role") or "assistant"}
        if message.get("content") is not None:
            first["content"] = message["content"]
        deltas = [first]
        if message.get("refusal") is not None:
            deltas.append({"refusal": message["refusal"]})
        for position, call in enumerate(message.get("tool_calls") or []):
            deltas.append({"tool_calls": [{**call, "index": position}]})
        for delta in deltas:
            chunks.append(chunk([{"index": index, "delta": delta, "finish_reason": None}]))
        last = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        if choice.get("logprobs") is not None:
            last["logprobs"] = choice["logprobs"]
        chunks.append(chunk([last]))
    if recorded.get("usage") is not None:
        chunks.append(chunk([], usage=recorded["usage"]))
    return chunks


_TERMINAL = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}

_EVENT_TYPES: dict[str, Any] = {
    "response.created": ResponseCreatedEvent,
    "response.in_progress": ResponseInProgressEvent,
    "response.output_item.added": ResponseOutputItemAddedEvent,
    "response.output_item.done": ResponseOutputItemDoneEvent,
    "response.content_part.added": ResponseContentPartAddedEvent,
    "response.content_part.done": ResponseContentPartDoneEvent,
    "response.output_text.delta": ResponseTextDeltaEvent,
    "response.output_text.done": ResponseTextDoneEvent,
    "response.refusal.delta": ResponseRefusalDeltaEvent,
    "response.refusal.done": ResponseRefusalDoneEvent,
    "response.function_call_arguments.delta": ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": ResponseFunctionCallArgumentsDoneEvent,
    "response.completed": ResponseCompletedEvent,
    "response.incomplete": ResponseIncompleteEvent,
    "response.failed": ResponseFailedEvent,
}


def response_events(recorded: dict[str, Any]) -> list[RawResponseEvent]:
    """The events a response streams as, numbered from 0 as ``sequence_number`` does: created
    and in progress (no output yet), each output item added, its content's parts and deltas (a
    function call's arguments), the item done, and the terminal event with the whole response."""
    frames: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append({"type": kind, "sequence_number": len(frames), **fields})

    started = {**recorded, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(recorded.get("output") or []):
        _item_events(emit, index, item)
    terminal = _TERMINAL.get(str(recorded.get("status")), "response.completed")
    emit(terminal, response=recorded)
    return [_EVENT_TYPES[frame["type"]].construct(**frame) for frame in frames]


def _item_events(emit: Callable[..., None], index: int, item: dict[str, Any]) -> None:
    kind, item_id = item.get("type"), item.get("id", "")
    where = {"item_id": item_id, "output_index": index}
    if kind == "message":
        emit(
            "response.output_item.added",
            output_index=index,
            item={**item, "content": [], "status": "in_progress"},
        )
        for part_index, part in enumerate(item.get("content") or []):
            at = {**where, "content_index": part_index}
            if part.get("type") == "output_text":
                emit("response.content_part.added", **at, part={**part, "text": "", "annotations": []})
                logprobs = part.get("logprobs") or []
                emit("response.output_text.delta", **at, delta=part.get("text", ""), logprobs=logprobs)
                emit("response.output_text.done", **at, text=part.get("text", ""), logprobs=logprobs)
            elif part.get("type") == "refusal":
                emit("response.content_part.added", **at, part={**part, "refusal": ""})
                emit("response.refusal.delta", **at, delta=part.get("refusal", ""))
                emit("response.refusal.done", **at, refusal=part.get("refusal", ""))
            else:
                emit("response.content_part.added", **at, part=part)
            emit("response.content_part.done", **at, part=part)
    elif kind == "function_call":
        emit(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        arguments = item.get("arguments", "")
        emit("response.function_call_arguments.delta", **where, delta=arguments)
        emit("response.function_call_arguments.done", **where, arguments=arguments, name=item.get("name"))
    else:
        emit("response.output_item.added", output_index=index, item=item)
    emit("response.output_item.done", output_index=index, item=item)


# -- what a caller holds ------------------------------------------------------------------------


class _Replay(Generic[T, S]):
    """Events replayed from a record, sync and async: iterated once, like the SDK's."""

    def __init__(self, events: Iterator[T], final: Callable[[], S]) -> None:
        self._events = events
        self._final = final

    def _drain(self) -> None:
        for _ in self._events:
            pass

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def __aenter__(self: Any) -> Any:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class ReplayedStream(_Replay[T, None]):
    """What ``create(stream=True)`` returns: the raw chunks (chat) or events (Responses) the
    recorded reply implies, iterable (``for`` / ``async for``) once, as the SDK's ``Stream`` is."""

    def __init__(self, items: list[T]) -> None:
        super().__init__(iter(items), lambda: None)

    def __iter__(self) -> Iterator[T]:
        return self._events

    def __next__(self) -> T:
        return next(self._events)

    def __aiter__(self) -> AsyncIterator[T]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[T]:
        for item in self._events:
            yield item

    async def __anext__(self) -> T:
        try:
            return next(self._events)
        except StopIteration:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Nothing is open: the reply was read whole when it was recorded."""


def _chat_events(chunks: list[ChatCompletionChunk], state: ChatCompletionStreamState[Any]) -> Iterator[Any]:
    for chunk in chunks:
        yield from state.handle_chunk(chunk)


class ChatCompletionReplay(_Replay[Any, ParsedChatCompletion[Any]]):  # events: a typing-only alias
    """What ``with gpt.chat.completions.stream(...) as stream`` gives: the SDK's stream events
    (``chunk``, ``content.delta``, ``tool_calls.function.arguments.done``, …) synthesized from
    the recorded completion, and ``get_final_completion()``, ``until_done()``,
    ``current_completion_snapshot`` as ``ChatCompletionStream`` offers them."""

    def __init__(
        self,
        recorded: dict[str, Any],
        state: ChatCompletionStreamState[Any],
        final: Callable[[], ParsedChatCompletion[Any]],
    ) -> None:
        self._state = state
        super().__init__(_chat_events(completion_chunks(recorded), state), final)

    def __iter__(self) -> Iterator[ChatCompletionStreamEvent[Any]]:
        return self._events

    def __next__(self) -> ChatCompletionStreamEvent[Any]:
        event: ChatCompletionStreamEvent[Any] = next(self._events)
        return event

    def until_done(self) -> ChatCompletionReplay:
        """Read the remaining events."""
        self._drain()
        return self

    def get_final_completion(self) -> ParsedChatCompletion[Any]:
        """The recorded completion, parsed as ``.stream()`` parses it."""
        self._drain()
        return self._final()

    @property
    def current_completion_snapshot(self) -> Any:
        """The completion as the events read so far add up to."""
        return self._state.current_completion_snapshot

    def close(self) -> None:
        """Nothing is open: the reply was read whole when it was recorded."""


class AsyncChatCompletionReplay(ChatCompletionReplay):
    """``ChatCompletionReplay`` for ``AsyncOpenAI``: ``async for``, and ``await`` its methods."""

    def __aiter__(self) -> AsyncIterator[ChatCompletionStreamEvent[Any]]:
        return _async_iter(self._events)

    async def __anext__(self) -> ChatCompletionStreamEvent[Any]:
        event: ChatCompletionStreamEvent[Any] = _next_or_stop(self._events)
        return event

    async def until_done(self) -> AsyncChatCompletionReplay:  # type: ignore[override]  # awaited here
        self._drain()
        return self

    async def get_final_completion(self) -> ParsedChatCompletion[Any]:  # type: ignore[override]
        self._drain()
        return self._final()

    async def close(self) -> None:  # type: ignore[override]
        return None


def _response_events(events: list[RawResponseEvent], state: ResponseStreamState[Any]) -> Iterator[Any]:
    for event in events:
        yield from state.handle_event(event)


class ResponseReplay(_Replay[Any, ParsedResponse[Any]]):  # events: a typing-only alias
    """What ``with gpt.responses.stream(...) as stream`` gives: the SDK's stream events
    (``response.created``, ``response.output_text.delta``, …, ``response.completed``)
    synthesized from the recorded response, and ``get_final_response()`` and ``until_done()``
    as ``ResponseStream`` offers them. A response that ended ``incomplete`` or ``failed`` is
    returned by ``get_final_response()`` as recorded (the SDK's own stream raises there)."""

    def __init__(
        self,
        recorded: dict[str, Any],
        state: ResponseStreamState[Any],
        final: Callable[[], ParsedResponse[Any]],
    ) -> None:
        super().__init__(_response_events(response_events(recorded), state), final)

    def __iter__(self) -> Iterator[ResponseStreamEvent[Any]]:
        return self._events

    def __next__(self) -> ResponseStreamEvent[Any]:
        event: ResponseStreamEvent[Any] = next(self._events)
        return event

    def until_done(self) -> ResponseReplay:
        """Read the remaining events."""
        self._drain()
        return self

    def get_final_response(self) -> ParsedResponse[Any]:
        """The recorded response, parsed as ``.stream()`` parses it."""
        self._drain()
        return self._final()

    def close(self) -> None:
        """Nothing is open: the reply was read whole when it was recorded."""


class AsyncResponseReplay(ResponseReplay):
    """``ResponseReplay`` for ``AsyncOpenAI``: ``async for``, and ``await`` its methods."""

    def __aiter__(self) -> AsyncIterator[ResponseStreamEvent[Any]]:
        return _async_iter(self._events)

    async def __anext__(self) -> ResponseStreamEvent[Any]:
        event: ResponseStreamEvent[Any] = _next_or_stop(self._events)
        return event

    async def until_done(self) -> AsyncResponseReplay:  # type: ignore[override]  # awaited here
        self._drain()
        return self

    async def get_final_response(self) -> ParsedResponse[Any]:  # type: ignore[override]
        self._drain()
        return self._final()

    async def close(self) -> None:  # type: ignore[override]
        return None


async def _async_iter(events: Iterator[T]) -> AsyncIterator[T]:
    for event in events:
        yield event


def _next_or_stop(events: Iterator[T]) -> T:
    try:
        return next(events)
    except StopIteration:
        raise StopAsyncIteration from None


class StreamManager(Generic[T]):
    """What ``.stream(...)`` returns: entering it records the model step (or replays it) and
    gives the replayed stream, as the SDK's manager sends the request on entering."""

    def __init__(self, open_stream: Callable[[], T]) -> None:
        self._open = open_stream
        self._stream: T | None = None

    def __enter__(self) -> T:
        self._stream = self._open()
        return self._stream

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stream = None


class AsyncStreamManager(Generic[T]):
    """``StreamManager`` for ``AsyncOpenAI``: ``async with gpt.responses.stream(...) as s``."""

    def __init__(self, open_stream: Callable[[], Any]) -> None:
        self._open = open_stream

    async def __aenter__(self) -> T:
        stream: T = await self._open()
        return stream

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None
