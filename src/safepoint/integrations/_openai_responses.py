"""Responses as model steps: ``create``, ``parse`` and ``stream`` of a bound client.

Each records the response as the API's JSON (``to_dict(mode="json")``: wire names, so a
function call's ``async`` survives, which ``model_dump`` would write as ``async_``) and hands back
``Response.construct`` of the record — or, for ``parse`` and ``stream``, the record parsed as the
SDK parses it (``ParsedResponse``). A stream is recorded as the response its terminal event
carries — ``completed``, ``incomplete`` or ``failed`` alike; one that ends without such an event
is a failed attempt, tried again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from openai import omit
from openai.lib._parsing._responses import parse_response  # what .parse() itself runs
from openai.lib._response_resources import _make_tools  # .parse()'s own reading of tools=
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import ParsedResponse, Response
from openai.types.responses import ResponseStreamEvent as RawResponseEvent

from safepoint.errors import TransientFailure, UsageError

from ._openai_requests import Binding, materialized, wire
from ._openai_streams import (
    AsyncResponseReplay,
    AsyncStreamManager,
    ReplayedStream,
    ResponseReplay,
    StreamManager,
    response_events,
)

_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})

# A failed response whose error says another attempt may succeed.
_TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded"})


def plain_response(response: Any) -> dict[str, Any]:
    """A response as the API's JSON, without the SDK's parsing (``parsed``,
    ``parsed_arguments``), and refused when it failed in a way another attempt may not."""
    recorded: dict[str, Any] = wire(response)
    for item in recorded.get("output") or []:
        item.pop("parsed_arguments", None)
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict):
                part.pop("parsed", None)
    error = recorded.get("error")
    if (
        recorded.get("status") == "failed"
        and isinstance(error, dict)
        and error.get("code") in _TRANSIENT_CODES
    ):
        raise TransientFailure(f"the response failed ({error.get('code')}): {error.get('message')}")
    return recorded


def rebuild(recorded: dict[str, Any]) -> Response:
    """The SDK's object of a recorded response (lenient: unknown item types and fields kept)."""
    return Response.construct(**recorded)


def _text_format(kwargs: Mapping[str, Any]) -> Any:
    parse_as = kwargs.get("parse_as", omit)
    if parse_as is None:
        return omit
    return parse_as if parse_as is not omit else kwargs.get("text_format", omit)


def rebuild_parsed(recorded: dict[str, Any], kwargs: Mapping[str, Any]) -> ParsedResponse[Any]:
    """A recorded response parsed as ``.parse()`` / ``.stream()`` parse it: its final text into
    the ``text_format`` class, strict tools' arguments into theirs."""
    return parse_response(
        text_format=_text_format(kwargs),
        input_tools=_make_tools(kwargs.get("tools", omit)),
        response=rebuild(recorded),
    )


def _stream_state(kwargs: Mapping[str, Any]) -> ResponseStreamState[Any]:
    return ResponseStreamState(
        input_tools=_make_tools(kwargs.get("tools", omit)), text_format=_text_format(kwargs)
    )


def _last(event: Any, final: Any) -> Any:
    return event.response if getattr(event, "type", None) in _TERMINAL_EVENTS else final


def _ended(final: Any) -> dict[str, Any]:
    if final is None:
        raise TransientFailure("the response stream ended before the response did")
    return plain_response(final)


# -- the calls a step makes (the client has its retries off) -----------------------------------


def _create(client: Any, kwargs: dict[str, Any]) -> Any:
    return plain_response(client.responses.create(**kwargs))


def _create_streamed(client: Any, kwargs: dict[str, Any]) -> Any:
    final = None
    with client.responses.create(**kwargs, stream=True) as events:
        for event in events:
            final = _last(event, final)
    return _ended(final)


def _parse(client: Any, kwargs: dict[str, Any]) -> Any:
    return plain_response(client.responses.parse(**kwargs))


def _stream(client: Any, kwargs: dict[str, Any]) -> Any:
    final = None
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            final = _last(event, final)
    return _ended(final)


async def _create_async(client: Any, kwargs: dict[str, Any]) -> Any:
    return plain_response(await client.responses.create(**kwargs))


async def _create_streamed_async(client: Any, kwargs: dict[str, Any]) -> Any:
    final = None
    async with await client.responses.create(**kwargs, stream=True) as events:
        async for event in events:
            final = _last(event, final)
    return _ended(final)


async def _parse_async(client: Any, kwargs: dict[str, Any]) -> Any:
    return plain_response(await client.responses.parse(**kwargs))


async def _stream_async(client: Any, kwargs: dict[str, Any]) -> Any:
    final = None
    async with client.responses.stream(**kwargs) as stream:
        async for event in stream:
            final = _last(event, final)
    return _ended(final)


def _checked(kwargs: Mapping[str, Any], method: str) -> dict[str, Any]:
    found = materialized("responses", kwargs)
    # .parse() / .stream() refuse tools they cannot read before sending: so does the bound
    # client, before any step (a mistake in the call, not a reply to record)
    _make_tools(found.get("tools", omit))
    if found.get("stream") is True:
        raise UsageError(f"responses.{method}(stream=True): call responses.stream(...) for a stream")
    return found


# -- the bound resources ---------------------------------------------------------------------


class Responses:
    """``gpt.responses`` of a bound ``OpenAI`` client: each call is one model step."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> ReplayedStream[RawResponseEvent]: ...
    @overload
    def create(self, *, stream: Literal[False] = False, **kwargs: Any) -> Response: ...
    def create(self, *, stream: bool = False, **kwargs: Any) -> Any:
        """``client.responses.create(...)`` as a model step: a ``Response``, or with
        ``stream=True`` the events of the recorded response."""
        if stream:
            recorded = self._binding.record("responses", "create", kwargs, _create_streamed)
            return ReplayedStream(response_events(recorded))
        return rebuild(self._binding.record("responses", "create", kwargs, _create))

    def parse(self, **kwargs: Any) -> ParsedResponse[Any]:
        """``client.responses.parse(...)`` as a model step; the parsed output is rebuilt from
        the recorded response on every replay."""
        kwargs = _checked(kwargs, "parse")
        return rebuild_parsed(self._binding.record("responses", "parse", kwargs, _parse), kwargs)

    def stream(self, **kwargs: Any) -> StreamManager[ResponseReplay]:
        """``with client.responses.stream(...) as stream`` as a model step, recorded as its
        final response: entering it records (or replays) the step."""
        kwargs = _checked(kwargs, "stream")

        def opened() -> ResponseReplay:
            recorded = self._binding.record("responses", "stream", kwargs, _stream)
            return ResponseReplay(recorded, _stream_state(kwargs), lambda: rebuild_parsed(recorded, kwargs))

        return StreamManager(opened)


class AsyncResponses:
    """``gpt.responses`` of a bound ``AsyncOpenAI`` client: each call is one model step."""

    def __init__(self, binding: Binding) -> None:
        self._binding = binding

    @overload
    async def create(self, *, stream: Literal[True], **kwargs: Any) -> ReplayedStream[RawResponseEvent]: ...
    @overload
    async def create(self, *, stream: Literal[False] = False, **kwargs: Any) -> Response: ...
    async def create(self, *, stream: bool = False, **kwargs: Any) -> Any:
        """``Responses.create``, awaited."""
        if stream:
            recorded = await self._binding.record_async("responses", "create", kwargs, _create_streamed_async)
            return ReplayedStream(response_events(recorded))
        return rebuild(await self._binding.record_async("responses", "create", kwargs, _create_async))

    async def parse(self, **kwargs: Any) -> ParsedResponse[Any]:
        """``Responses.parse``, awaited."""
        kwargs = _checked(kwargs, "parse")
        return rebuild_parsed(
            await self._binding.record_async("responses", "parse", kwargs, _parse_async), kwargs
        )

    def stream(self, **kwargs: Any) -> AsyncStreamManager[AsyncResponseReplay]:
        """``async with gpt.responses.stream(...) as stream``: ``Responses.stream``."""
        kwargs = _checked(kwargs, "stream")

        async def opened() -> AsyncResponseReplay:
            recorded = await self._binding.record_async("responses", "stream", kwargs, _stream_async)
            return AsyncResponseReplay(
                recorded, _stream_state(kwargs), lambda: rebuild_parsed(recorded, kwargs)
            )

        return AsyncStreamManager(opened)
