"""A client bound to a run (``bind``): its Messages calls as model steps, sync and async,
stable and beta."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

import anthropic as _sdk

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations._anthropic_steps import Binding, Method, make_binding, plan
from safepoint.integrations._anthropic_stream import (
    AsyncRecordedBetaMessageStream,
    AsyncRecordedEvents,
    AsyncRecordedMessageStream,
    AsyncRecordedStreamManager,
    RecordedBetaMessageStream,
    RecordedEvents,
    RecordedMessageStream,
    RecordedStreamManager,
)

if TYPE_CHECKING:
    from anthropic.lib.streaming import (
        AsyncMessageStream,
        BetaAsyncMessageStream,
        BetaMessageStream,
        MessageStream,
    )
    from anthropic.types import Message, ParsedMessage
    from anthropic.types.beta import BetaMessage
    from anthropic.types.beta.parsed_beta_message import ParsedBetaMessage


@overload
def bind(
    run: sp.Run | None,
    client: _sdk.Anthropic,
    *,
    retry: sp.Retry | int | None = ...,
    price: Any = ...,
    step_id: str = ...,
    server_state: bool = ...,
) -> BoundAnthropic: ...
@overload
def bind(
    run: sp.AsyncRun | None,
    client: _sdk.AsyncAnthropic,
    *,
    retry: sp.Retry | int | None = ...,
    price: Any = ...,
    step_id: str = ...,
    server_state: bool = ...,
) -> AsyncBoundAnthropic: ...
@overload
def bind(
    run: sp.Run | sp.AsyncRun | None,
    client: Any,
    *,
    retry: sp.Retry | int | None = ...,
    price: Any = ...,
    step_id: str = ...,
    server_state: bool = ...,
) -> BoundAnthropic | AsyncBoundAnthropic: ...
def bind(
    run: sp.Run | sp.AsyncRun | None,
    client: Any,
    *,
    retry: sp.Retry | int | None = None,
    price: Any = None,
    step_id: str = "model",
    server_state: bool = False,
) -> BoundAnthropic | AsyncBoundAnthropic:
    """``client`` (``Anthropic`` or ``AsyncAnthropic``) with its Messages calls recorded as
    model steps of ``run`` (a ``Run`` for a sync client, an ``AsyncRun`` for an async one;
    ``None``: ``safepoint.current_run()`` at each call).

    ``retry`` is the steps' attempts (a ``Retry``, or a number; by default 6, backing off from
    1 s to 60 s); ``price(reply_json) -> cost`` adds each reply's cost to the run's budget;
    ``step_id`` names the steps (``model``, ``model#2``, …); ``server_state=True`` allows
    ``thread=`` (the conversation held by the server, which a resume cannot replay)."""
    binding = make_binding(run, client, retry=retry, price=price, step_id=step_id, server_state=server_state)
    return AsyncBoundAnthropic(binding) if binding.is_async else BoundAnthropic(binding)


class _Messages:
    def __init__(self, binding: Binding, beta: bool) -> None:
        self._binding = binding
        self._beta = beta

    def _take(self, method: Method, kwargs: dict[str, Any]) -> Any:
        b = self._binding
        planned = plan(method, kwargs, beta=self._beta, binding=b)
        recorded = b.current_run().model(b.step_id, planned.ask(b.client), **planned.step_options(b))
        return planned.result(recorded, is_async=False)

    async def _take_async(self, method: Method, kwargs: dict[str, Any]) -> Any:
        b = self._binding
        planned = plan(method, kwargs, beta=self._beta, binding=b)
        recorded = await b.current_run().model(
            b.step_id, planned.ask_async(b.client), **planned.step_options(b)
        )
        return planned.result(recorded, is_async=True)

    def _manager(self, kwargs: dict[str, Any], stream: Any) -> Any:
        plan("stream", kwargs, beta=self._beta, binding=self._binding)  # a mistake shows at the call
        return RecordedStreamManager(lambda: self._take("stream", kwargs), stream, _format(kwargs))

    def _async_manager(self, kwargs: dict[str, Any], stream: Any) -> Any:
        plan("stream", kwargs, beta=self._beta, binding=self._binding)
        return AsyncRecordedStreamManager(lambda: self._take_async("stream", kwargs), stream, _format(kwargs))


def _format(kwargs: dict[str, Any]) -> Any:
    # what the SDK's stream parses text blocks into; NOT_GIVEN (not None) when there is none
    found = kwargs.get("output_format")
    return _sdk.NOT_GIVEN if found is None else found


class Messages(_Messages):
    """``messages`` of a bound sync client: each call a model step."""

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> RecordedEvents: ...
    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Message: ...
    def create(self, **kwargs: Any) -> Message | RecordedEvents:
        """``client.messages.create(...)`` as a model step: the reply, a ``Message``
        (``stream=True``: the reply's events, synthesized from the recorded message)."""
        found: Message | RecordedEvents = self._take("create", kwargs)
        return found

    def parse(self, **kwargs: Any) -> ParsedMessage[Any]:
        """``client.messages.parse(...)`` as a model step: a ``ParsedMessage`` whose
        ``parsed_output`` is parsed again from the recorded text on a replay."""
        found: ParsedMessage[Any] = self._take("parse", kwargs)
        return found

    def stream(self, **kwargs: Any) -> RecordedStreamManager[MessageStream[Any]]:
        """``with client.messages.stream(...) as stream:`` as a model step, taken on entering:
        the SDK's ``MessageStream`` over the recorded final message."""
        found: RecordedStreamManager[MessageStream[Any]] = self._manager(kwargs, RecordedMessageStream)
        return found


class BetaMessages(_Messages):
    """``beta.messages`` of a bound sync client; ``thread=`` refused unless ``server_state``."""

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> RecordedEvents: ...
    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> BetaMessage: ...
    def create(self, **kwargs: Any) -> BetaMessage | RecordedEvents:
        """``client.beta.messages.create(...)`` as a model step: a ``BetaMessage``."""
        found: BetaMessage | RecordedEvents = self._take("create", kwargs)
        return found

    def parse(self, **kwargs: Any) -> ParsedBetaMessage[Any]:
        """``client.beta.messages.parse(...)`` as a model step: a ``ParsedBetaMessage``."""
        found: ParsedBetaMessage[Any] = self._take("parse", kwargs)
        return found

    def stream(self, **kwargs: Any) -> RecordedStreamManager[BetaMessageStream[Any]]:
        """``with client.beta.messages.stream(...) as stream:`` as a model step."""
        found: RecordedStreamManager[BetaMessageStream[Any]] = self._manager(
            kwargs, RecordedBetaMessageStream
        )
        return found


class AsyncMessages(_Messages):
    """``messages`` of a bound async client: each call an awaited model step."""

    @overload
    async def create(self, *, stream: Literal[True], **kwargs: Any) -> AsyncRecordedEvents: ...
    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Message: ...
    async def create(self, **kwargs: Any) -> Message | AsyncRecordedEvents:
        """``await client.messages.create(...)`` as a model step."""
        found: Message | AsyncRecordedEvents = await self._take_async("create", kwargs)
        return found

    async def parse(self, **kwargs: Any) -> ParsedMessage[Any]:
        """``await client.messages.parse(...)`` as a model step."""
        found: ParsedMessage[Any] = await self._take_async("parse", kwargs)
        return found

    def stream(self, **kwargs: Any) -> AsyncRecordedStreamManager[AsyncMessageStream[Any]]:
        """``async with client.messages.stream(...) as stream:`` as a model step."""
        found: AsyncRecordedStreamManager[AsyncMessageStream[Any]] = self._async_manager(
            kwargs, AsyncRecordedMessageStream
        )
        return found


class AsyncBetaMessages(_Messages):
    """``beta.messages`` of a bound async client."""

    @overload
    async def create(self, *, stream: Literal[True], **kwargs: Any) -> AsyncRecordedEvents: ...
    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> BetaMessage: ...
    async def create(self, **kwargs: Any) -> BetaMessage | AsyncRecordedEvents:
        """``await client.beta.messages.create(...)`` as a model step."""
        found: BetaMessage | AsyncRecordedEvents = await self._take_async("create", kwargs)
        return found

    async def parse(self, **kwargs: Any) -> ParsedBetaMessage[Any]:
        """``await client.beta.messages.parse(...)`` as a model step."""
        found: ParsedBetaMessage[Any] = await self._take_async("parse", kwargs)
        return found

    def stream(self, **kwargs: Any) -> AsyncRecordedStreamManager[BetaAsyncMessageStream[Any]]:
        """``async with client.beta.messages.stream(...) as stream:`` as a model step."""
        found: AsyncRecordedStreamManager[BetaAsyncMessageStream[Any]] = self._async_manager(
            kwargs, AsyncRecordedBetaMessageStream
        )
        return found


class BetaNamespace:
    """``beta`` of a bound sync client: its ``messages``."""

    def __init__(self, binding: Binding) -> None:
        self.messages = BetaMessages(binding, beta=True)


class AsyncBetaNamespace:
    """``beta`` of a bound async client: its ``messages``."""

    def __init__(self, binding: Binding) -> None:
        self.messages = AsyncBetaMessages(binding, beta=True)


class BoundAnthropic:
    """A sync ``Anthropic`` client bound to a run (``bind``): ``messages`` and
    ``beta.messages`` record each call as a model step; ``client`` is the SDK client, its
    retries off, for calls that are not model steps."""

    def __init__(self, binding: Binding) -> None:
        if binding.is_async:
            raise UsageError("an async client is bound as AsyncBoundAnthropic: use bind()")
        self._binding = binding
        self.client: Any = binding.client
        self.messages = Messages(binding, beta=False)
        self.beta = BetaNamespace(binding)


class AsyncBoundAnthropic:
    """An ``AsyncAnthropic`` client bound to a run: the calls of ``BoundAnthropic``, awaited."""

    def __init__(self, binding: Binding) -> None:
        if not binding.is_async:
            raise UsageError("a sync client is bound as BoundAnthropic: use bind()")
        self._binding = binding
        self.client: Any = binding.client
        self.messages = AsyncMessages(binding, beta=False)
        self.beta = AsyncBetaNamespace(binding)
