"""Chat Completions as model steps: ``create``, ``parse`` and ``stream`` of a bound client.

Each records the completion as the API's JSON (``to_dict(mode="json")``, without the SDK's
``parsed`` fields: those are parsed again from the record) and hands back the SDK's object
rebuilt from the record — ``ChatCompletion.construct``, which keeps fields the SDK does not
know — or, for ``parse`` and ``stream``, parsed as the SDK parses them. A completion cut short
(``length``, ``content_filter``) under ``parse`` is recorded too, and rebuilding it raises the
SDK's ``LengthFinishReasonError`` / ``ContentFilterFinishReasonError``, now and on replay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from openai import ContentFilterFinishReasonError, LengthFinishReasonError, omit
from openai.lib._parsing import parse_chat_completion, validate_input_tools  # what .parse() itself runs
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion

from safepoint.errors import TransientFailure

from ._openai_requests import Binding, materialized, wire
from ._openai_streams import (
    AsyncChatCompletionReplay,
    AsyncStreamManager,
    ChatCompletionReplay,
    ReplayedStream,
    StreamManager,
    completion_chunks,
)

_CUT_SHORT = (LengthFinishReasonError, ContentFilterFinishReasonError)


def plain_completion(completion: Any) -> dict[str, Any]:
    """A completion (or the snapshot a stream added up to) as the API's JSON: without the SDK's
    parsing (``parsed``, ``parsed_arguments``) or the stream's tool-call ``index``."""
    recorded: dict[str, Any] = wire(completion)
    for choice in recorded.get("choices") or []:
        message = choice.get("message") or {}
        message.pop("parsed", None)
        for call in message.get("tool_calls") or []:
            call.pop("index", None)
            if isinstance(call.get("function"), dict):
                call["function"].pop("parsed_arguments", None)
    return recorded


def ended(recorded: dict[str, Any]) -> dict[str, Any]:
    """A streamed completion, refused unless every choice finished: a stream that stopped
    before its end is an attempt that failed, not a reply."""
    choices = recorded.get("choices") or []
    if not choices or any(choice.get("finish_reason") is None for choice in choices):
        raise TransientFailure("the chat completion stream ended before the completion finished")
    return recorded


def _with_usage(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # usage on the stream's last chunk: the step's tokens count against the run's budget
    options = {"include_usage": True, **(kwargs.get("stream_options") or {})}
    return {**kwargs, "stream_options": options}


def rebuild(recorded: dict[str, Any]) -> ChatCompletion:
    """The SDK's object of a recorded completion (lenient: unknown fields are kept)."""
    return ChatCompletion.construct(**recorded)


def rebuild_parsed(recorded: dict[str, Any], kwargs: Mapping[str, Any]) -> ParsedChatCompletion[Any]:
    """A recorded completion parsed as ``.parse()`` / ``.stream()`` parse it: the content into
    the ``response_format`` class, strict tools' arguments into theirs."""
    return parse_chat_completion(
        response_format=kwargs.get("response_format", omit),
        input_tools=kwargs.get("tools", omit),
        chat_completion=rebuild(recorded),
    )


def _stream_state(kwargs: Mapping[str, Any]) -> ChatCompletionStreamState[Any]:
    return ChatCompletionStreamState(
        input_tools=kwargs.get("tools", omit), response_format=kwargs.get("response_format", omit)
    )


# -- the calls a step makes (the client has its retries off) -----------------------------------


def _create(client: Any, kwargs: dict[str, Any]) -> Any:
    return wire(client.chat.completions.create(**kwargs))


def _create_streamed(client: Any, kwargs: dict[str, Any]) -> Any:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    with client.chat.completions.create(**_with_usage(kwargs), stream=True) as chunks:
        for chunk in chunks:
            state.handle_chunk(chunk)
    return _accumulated(state)


def _parse(client: Any, kwargs: dict[str, Any]) -> Any:
    try:
        return plain_completion(client.chat.completions.parse(**kwargs))
    except _CUT_SHORT as exc:  # recorded: rebuilding it raises the same, now and on replay
        return plain_completion(exc.completion)


def _stream(client: Any, kwargs: dict[str, Any]) -> Any:
    try:
        with client.chat.completions.stream(**_with_usage(kwargs)) as stream:
            return _read_stream(stream)
    except _CUT_SHORT as exc:
        return ended(plain_completion(exc.completion))


def _read_stream(stream: Any) -> Any:
    read = sum(1 for _ in stream)
    if not read:
        raise TransientFailure("the chat completion stream ended before its first chunk")
    return ended(plain_completion(stream.current_completion_snapshot))


def _accumulated(state: ChatCompletionStreamState[Any]) -> Any:
    try:
        snapshot = state.current_completion_snapshot
    except AssertionError:  # no chunk came
        raise TransientFailure("the chat completion stream ended before its first chunk") from None
    return ended(plain_completion(snapshot))


async def _create_async(client: Any, kwargs: dict[str, Any]) -> Any:
    return wire(await client.chat.completions.create(**kwargs))


async def _create_streamed_async(client: Any, kwargs: dict[str, Any]) -> Any:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    async with await client.chat.completions.create(**_with_usage(kwargs), stream=True) as chunks:
        async for chunk in chunks:
            state.handle_chunk(chunk)
    return _accumulated(state)


async def _parse_async(client: Any, kwargs: dict[str, Any]) -> Any:
    try:
        return plain_completion(await client.chat.completions.parse(**kwargs))
    except _CUT_SHORT as exc:
        return plain_completion(exc.completion)


async def _stream_async(client: Any, kwargs: dict[str, Any]) -> Any:
    try:
        async with client.chat.completions.stream(**_with_usage(kwargs)) as stream:
            read = 0
            async for _ in stream:
                read += 1
            if not read:
                raise TransientFailure("the chat completion stream ended before its first chunk")
            return ended(plain_completion(stream.current_completion_snapshot))
    except _CUT_SHORT as exc:
        return ended(plain_completion(exc.completion))


def _parse_checked(kwargs: Mapping[str, Any]) -> None:
    # .parse() refuses tools it cannot parse before sending: so does the bound client, before
    # any step (a mistake in the call, not a reply to record)
    validate_input_tools(kwargs.get("tools", omit))


# -- the bound resources ---------------------------------------------------------------------


class Completions:
    """``gpt.chat.completions`` of a bound ``OpenAI`` client: each call is one model step."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> ReplayedStream[ChatCompletionChunk]: ...
    @overload
    def create(self, *, stream: Literal[False] = False, **kwargs: Any) -> ChatCompletion: ...
    def create(self, *, stream: bool = False, **kwargs: Any) -> Any:
        """``client.chat.completions.create(...)`` as a model step: a ``ChatCompletion``, or
        with ``stream=True`` the chunks of the recorded completion."""
        if stream:
            recorded = self._binding.record("chat", "create", kwargs, _create_streamed)
            return ReplayedStream(completion_chunks(recorded))
        return rebuild(self._binding.record("chat", "create", kwargs, _create))

    def parse(self, **kwargs: Any) -> ParsedChatCompletion[Any]:
        """``client.chat.completions.parse(...)`` as a model step; the ``parsed`` output is
        rebuilt from the recorded completion on every replay."""
        kwargs = materialized("chat", kwargs)
        _parse_checked(kwargs)
        return rebuild_parsed(self._binding.record("chat", "parse", kwargs, _parse), kwargs)

    def stream(self, **kwargs: Any) -> StreamManager[ChatCompletionReplay]:
        """``with client.chat.completions.stream(...) as stream`` as a model step, recorded as
        its final completion: entering it records (or replays) the step."""
        kwargs = materialized("chat", kwargs)

        def opened() -> ChatCompletionReplay:
            recorded = self._binding.record("chat", "stream", kwargs, _stream)
            return ChatCompletionReplay(
                recorded, _stream_state(kwargs), lambda: rebuild_parsed(recorded, kwargs)
            )

        return StreamManager(opened)


class AsyncCompletions:
    """``gpt.chat.completions`` of a bound ``AsyncOpenAI`` client: each call is one model step."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> ReplayedStream[ChatCompletionChunk]: ...
    @overload
    async def create(self, *, stream: Literal[False] = False, **kwargs: Any) -> ChatCompletion: ...
    async def create(self, *, stream: bool = False, **kwargs: Any) -> Any:
        """``Completions.create``, awaited."""
        if stream:
            recorded = await self._binding.record_async("chat", "create", kwargs, _create_streamed_async)
            return ReplayedStream(completion_chunks(recorded))
        return rebuild(await self._binding.record_async("chat", "create", kwargs, _create_async))

    async def parse(self, **kwargs: Any) -> ParsedChatCompletion[Any]:
        """``Completions.parse``, awaited."""
        kwargs = materialized("chat", kwargs)
        _parse_checked(kwargs)
        return rebuild_parsed(await self._binding.record_async("chat", "parse", kwargs, _parse_async), kwargs)

    def stream(self, **kwargs: Any) -> AsyncStreamManager[AsyncChatCompletionReplay]:
        """``async with gpt.chat.completions.stream(...) as stream``: ``Completions.stream``."""
        kwargs = materialized("chat", kwargs)

        async def opened() -> AsyncChatCompletionReplay:
            recorded = await self._binding.record_async("chat", "stream", kwargs, _stream_async)
            return AsyncChatCompletionReplay(
                recorded, _stream_state(kwargs), lambda: rebuild_parsed(recorded, kwargs)
            )

        return AsyncStreamManager(opened)
