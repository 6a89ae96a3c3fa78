"""One Anthropic Messages call as a model step: the plan of the call (its fingerprint, the
SDK arguments, the step's name), the function the step calls, and the SDK object the workflow
gets back from what the step returned.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import anthropic
from anthropic.resources import AsyncMessages, Messages

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations import _common
from safepoint.integrations._anthropic_request import (
    Fingerprint,
    fingerprint,
    rebuild,
    refuse_server_state,
    reply_json,
    sdk_arguments,
    transient_failure,
    usage_tokens,
)
from safepoint.integrations._anthropic_stream import AsyncRecordedEvents, RecordedEvents, raw_events

Method = Literal["create", "parse", "stream"]


@dataclass(frozen=True, slots=True)
class Binding:
    """What ``bind`` fixed: the run (``None``: the current one at each call), the SDK client
    with its own retries off, the model step's attempts and usage, its id and whether the
    server may hold state."""

    run: sp.Run | sp.AsyncRun | None
    client: Any  # anthropic.Anthropic / AsyncAnthropic, or a platform client of the same shape
    is_async: bool
    retry: sp.Retry
    usage: Callable[[Any], dict[str, Any]] | None
    step_id: str
    server_state: bool

    def current_run(self) -> Any:
        """The run to record in: the bound one, or the workflow's now executing."""
        run = self.run if self.run is not None else sp.current_run()
        wanted = sp.AsyncRun if self.is_async else sp.Run
        if not isinstance(run, wanted):
            raise UsageError(_mismatch(self.is_async))
        return run


def make_binding(
    run: Any, client: Any, *, retry: Any, price: Any, step_id: str, server_state: bool
) -> Binding:
    """A ``Binding`` of ``client`` to ``run``, checked."""
    messages = getattr(client, "messages", None)
    if not isinstance(messages, Messages | AsyncMessages) or not callable(
        getattr(client, "with_options", None)
    ):
        raise UsageError(
            "bind() takes an anthropic.Anthropic or anthropic.AsyncAnthropic client,"
            f" not {type(client).__name__}"
        )
    is_async = isinstance(messages, AsyncMessages)  # also the platforms' clients (Bedrock, Vertex)
    if run is not None and not isinstance(run, sp.AsyncRun if is_async else sp.Run):
        raise UsageError(_mismatch(is_async))
    if not isinstance(step_id, str) or not step_id:
        raise UsageError(
            f"step_id={step_id!r}: the model steps' id, a non-empty string (numbered model, model#2, …)"
        )
    return Binding(
        run=run,
        # Every attempt is the ledger's to count and wait for: a retry inside the SDK would be
        # invisible to it, and would not survive a restart.
        client=client.with_options(max_retries=0),
        is_async=is_async,
        retry=_common.model_retry(retry),
        usage=_common.price_usage(price, usage_tokens),
        step_id=step_id,
        server_state=bool(server_state),
    )


def _mismatch(is_async: bool) -> str:
    if is_async:
        return (
            "an AsyncAnthropic client records its calls in an async def workflow (AsyncRun): bind it"
            " to the AsyncRun, or use anthropic.Anthropic in a plain def workflow"
        )
    return (
        "an Anthropic client records its calls in a plain def workflow (Run): bind it to the Run,"
        " or use anthropic.AsyncAnthropic in an async def workflow"
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """One call, planned before any step: what it is hashed by, what the SDK is called with,
    how the reply is read (``streamed``: through ``messages.stream``) and rebuilt."""

    name: str
    beta: bool
    method: Method
    streamed: bool
    fingerprint: Fingerprint
    arguments: dict[str, Any]
    output_format: Any

    def step_options(self, binding: Binding) -> dict[str, Any]:
        """``run.model``'s keyword arguments for this call."""
        fp = self.fingerprint
        return {
            "model": fp.model,
            "messages": fp.messages,
            "tools": fp.tools,
            "retry": binding.retry,
            "usage": binding.usage,
            "name": self.name,
            **fp.params,
        }

    def _sdk_arguments(self, messages: Any) -> dict[str, Any]:
        # A Transcript reaches the step's function as the list run.model made of it; a list
        # given is sent as given (its hashed form has its cache breakpoints taken out).
        if isinstance(self.fingerprint.messages, sp.Transcript):
            return {**self.arguments, "messages": messages}
        return self.arguments

    def ask(self, client: Any) -> Callable[..., Any]:
        """The step's function for a sync client: the call, its failures as attempts."""

        @sp.reads_messages_only  # the SDK builds its request from a copy (copy_tree)
        def ask(*, messages: Any, **_: Any) -> Any:
            resource = _resource(client, self.beta)
            arguments = self._sdk_arguments(messages)
            try:
                if self.streamed:
                    with resource.stream(**arguments) as stream:
                        return _finished(reply_json(stream.get_final_message()))
                return reply_json(getattr(resource, self.method)(**arguments))
            except Exception as exc:
                _raise_transient(exc)
                raise

        return ask

    def ask_async(self, client: Any) -> Callable[..., Any]:
        """The step's function for an async client."""

        @sp.reads_messages_only
        async def ask(*, messages: Any, **_: Any) -> Any:
            resource = _resource(client, self.beta)
            arguments = self._sdk_arguments(messages)
            try:
                if self.streamed:
                    async with resource.stream(**arguments) as stream:
                        return _finished(reply_json(await stream.get_final_message()))
                return reply_json(await getattr(resource, self.method)(**arguments))
            except Exception as exc:
                _raise_transient(exc)
                raise

        return ask

    def result(self, recorded: Any, *, is_async: bool) -> Any:
        """What the workflow gets: the SDK object rebuilt from what the step returned — the
        record, redacted — or, for a stream, its events over that object."""
        message = rebuild(
            recorded, beta=self.beta, parsed=self.method != "create", output_format=self.output_format
        )
        if not self.streamed:
            return message
        events = raw_events(recorded, beta=self.beta)
        return AsyncRecordedEvents(events, message) if is_async else RecordedEvents(events, message)


def plan(method: Method, kwargs: dict[str, Any], *, beta: bool, binding: Binding) -> Plan:
    """The plan of ``messages.<method>(**kwargs)``, every mistake in it a ``UsageError``
    raised before any step (a step would record it as the model's failure)."""
    where = f"{'beta.' if beta else ''}messages.{method}"
    refuse_server_state(kwargs, binding.server_state, where)
    request = dict(kwargs)
    streamed = method == "stream"
    if "stream" in request:
        if method != "create":
            raise UsageError(f"{where}() takes no stream=")
        streamed = bool(request.pop("stream"))
    messages = request.get("messages")
    if messages is not None and not isinstance(messages, sp.Transcript):
        if isinstance(messages, str | bytes | dict):
            raise UsageError(f"{where}(messages=...) is a list of messages, not {type(messages).__name__}")
        request["messages"] = list(messages)  # an iterator is read once: hashed and sent the same
    arguments = sdk_arguments(request)
    _check_signature(_sdk_method(binding.client, beta, "stream" if streamed else method), arguments, where)
    output_format = request.get("output_format")
    if output_format is not None and type(output_format).__name__ in ("NotGiven", "Omit"):
        output_format = None
    return Plan(
        name=f"anthropic.{where}",
        beta=beta,
        method=method,
        streamed=streamed,
        fingerprint=fingerprint(request),
        arguments=arguments,
        output_format=output_format,
    )


def _finished(recorded: dict[str, Any]) -> dict[str, Any]:
    """A streamed reply, refused unless the stream reached its end: a body that stopped before
    ``message_delta`` gave the stop reason (a proxy's timeout, a restart) is an attempt that
    failed, tried again — not a reply to record, cut, for good."""
    if recorded.get("stop_reason") is None:
        raise sp.errors.TransientFailure("the Anthropic stream ended before the message did (no stop_reason)")
    return recorded


def _raise_transient(exc: Exception) -> None:
    """An SDK failure another attempt may get past, raised as the ``TransientFailure`` the
    model step retries; any other failure is left to its caller to raise as it is."""
    failure = transient_failure(exc)
    if failure is not None:
        raise failure from exc


def _resource(client: Any, beta: bool) -> Any:
    return client.beta.messages if beta else client.messages


def _sdk_method(client: Any, beta: bool, method: str) -> Callable[..., Any]:
    found: Callable[..., Any] = getattr(_resource(client, beta), method)
    return found


def _check_signature(method: Callable[..., Any], arguments: dict[str, Any], where: str) -> None:
    """Refuse arguments the SDK would refuse (a ``TypeError``), before they become a step."""
    try:
        _signature(getattr(method, "__func__", method)).bind(None, **arguments)
    except TypeError as exc:
        raise UsageError(f"{where}(): {exc} (anthropic {anthropic.__version__})") from exc


@cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function)
