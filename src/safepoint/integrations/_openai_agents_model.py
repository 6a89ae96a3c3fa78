"""The OpenAI Agents SDK's model calls as model steps: what identifies a request (the projection
its fingerprint is taken over), the record of a ``ModelResponse`` and the object rebuilt from it,
and the ``Model`` / ``ModelProvider`` that put each call on the ledger.

The SDK hands a model SDK objects (input items, ``ModelSettings``, tools, handoffs, an output
schema); the step is fingerprinted over their JSON, without what varies between identical
requests (the generated prompt-cache key, metadata, headers, timeouts, retry settings), so that a
resume in another process meets the same fingerprint and replays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import openai
from agents import (
    AgentOutputSchemaBase,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Tool,
)
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.usage import deserialize_usage, serialize_usage
from openai.types.responses import Response
from openai.types.responses.response_prompt_param import ResponsePromptParam

import safepoint as sp
from safepoint.errors import TransientFailure, UsageError

from ._common import model_retry, price_usage, to_json
from ._openai_requests import failure
from ._openai_responses import plain_response
from ._openai_streams import response_events

# What only carries a request, or varies between identical ones, and so is left out of the
# fingerprint: the SDK's generated prompt-cache key (new per run), transport settings, retry
# settings (retries are the ledger's), and what the provider stores about the caller.
_UNHASHED_SETTINGS = frozenset(
    {
        "metadata",
        "store",
        "prompt_cache_retention",
        "prompt_cache_options",
        "include_usage",
        "extra_query",
        "extra_headers",
        "timeout",
        "retry",
        "preserve_raw_usage",
    }
)
_UNHASHED_EXTRAS = frozenset(
    {"prompt_cache_key", "user", "safety_identifier", "service_tier", "metadata", "store"}
)

Api = str  # "responses" or "chat"


def settings_projection(settings: ModelSettings) -> dict[str, Any]:
    """The model settings that shape the answer, as JSON: ``to_json_dict()`` without what only
    carries the request (``_UNHASHED_SETTINGS``), the extras' noise dropped too, and unset
    (``None``) settings left out, so that a new optional setting in the SDK does not move it."""
    found: dict[str, Any] = {}
    for name, given in settings.to_json_dict().items():
        value = given
        if name in ("extra_args", "extra_body") and isinstance(given, Mapping):
            value = {k: v for k, v in given.items() if k not in _UNHASHED_EXTRAS} or None
        if name not in _UNHASHED_SETTINGS and value is not None:
            found[name] = to_json(value)
    return found


def tool_projection(tool: Tool) -> dict[str, Any]:
    """A tool as the model is told of it: a function tool's name, description, schema and
    strictness; any other tool (hosted search, computer use, MCP) its type and its JSON."""
    if isinstance(tool, FunctionTool):
        return {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
            "strict": tool.strict_json_schema,
        }
    fields: Any = {}
    if dataclasses.is_dataclass(tool):
        fields = {
            f.name: to_json(getattr(tool, f.name))
            for f in dataclasses.fields(tool)
            if not f.name.startswith("_") and _plain(getattr(tool, f.name))
        }
    return {"type": type(tool).__name__, "name": getattr(tool, "name", None), "fields": fields}


def _plain(value: Any) -> bool:
    """Whether a tool's field is data (kept in the fingerprint) rather than code (a callable)."""
    return not callable(value) or hasattr(type(value), "model_fields")


def handoff_projection(handoff: Handoff[Any, Any]) -> dict[str, Any]:
    """A handoff as the model sees it: a tool by its name, description and schema."""
    return {
        "name": handoff.tool_name,
        "description": handoff.tool_description,
        "parameters": handoff.input_json_schema,
        "strict": handoff.strict_json_schema,
    }


def output_projection(schema: AgentOutputSchemaBase | None) -> dict[str, Any] | None:
    """The agent's output type as the model is asked for it: none for plain text."""
    if schema is None or schema.is_plain_text():
        return None
    return {"name": schema.name(), "schema": schema.json_schema(), "strict": schema.is_strict_json_schema()}


@dataclass(frozen=True)
class _Request:
    """One model call as the SDK makes it: its arguments, to pass on to the inner model, and
    the step params (all hashed) that identify it besides model, messages and tools."""

    system_instructions: str | None
    input: str | list[TResponseInputItem]
    model_settings: ModelSettings
    tools: list[Tool]
    output_schema: AgentOutputSchemaBase | None
    handoffs: list[Handoff[Any, Any]]
    tracing: ModelTracing
    previous_response_id: str | None
    conversation_id: str | None
    prompt: ResponsePromptParam | None

    @property
    def positional(self) -> tuple[Any, ...]:
        return (
            self.system_instructions, self.input, self.model_settings, self.tools,
            self.output_schema, self.handoffs, self.tracing,
        )  # fmt: skip

    @property
    def named(self) -> dict[str, Any]:
        return {
            "previous_response_id": self.previous_response_id,
            "conversation_id": self.conversation_id,
            "prompt": self.prompt,
        }

    def params(self) -> dict[str, Any]:
        return {
            "instructions": self.system_instructions,
            "settings": settings_projection(self.model_settings),
            "output": output_projection(self.output_schema),
            "handoffs": [handoff_projection(h) for h in self.handoffs],
            "previous_response_id": self.previous_response_id,
            "conversation_id": self.conversation_id,
            "prompt": to_json(self.prompt),
        }


def recorded_response(response: ModelResponse) -> dict[str, Any]:
    """A ``ModelResponse`` as JSON: its output items as the API's JSON (wire names, unknown
    fields kept), its usage as the SDK serializes it (``total_tokens`` at the top: budgets count
    it), its response and request ids."""
    return {
        "output": [to_json(item) for item in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }


def rebuilt_response(recorded: Mapping[str, Any]) -> ModelResponse:
    """The ``ModelResponse`` of a record, its output items the SDK's own types (built leniently:
    an item type this SDK does not know is kept, not refused)."""
    output = Response.construct(output=list(recorded.get("output") or [])).output
    return ModelResponse(
        output=list(output),
        usage=deserialize_usage(recorded.get("usage") or {}),
        response_id=recorded.get("response_id"),
        request_id=recorded.get("request_id"),
    )


def _final_response(events: list[Any]) -> dict[str, Any]:
    """The response a stream of events ended with (its terminal event carries it whole)."""
    for event in reversed(events):
        if getattr(event, "type", None) in ("response.completed", "response.incomplete", "response.failed"):
            return plain_response(event.response)
    raise TransientFailure("the model's stream ended before its final response")


class LedgerModel(Model):
    """A ``Model`` whose ``get_response`` and ``stream_response`` are model steps of the run:
    recorded the first time (``inner`` asked, its retries off, the ledger's on), replayed from
    the ledger on every resume — the SDK gets the same ``ModelResponse`` and never asks again.

    ``run=None`` finds the run whose workflow is executing (``safepoint.current_run()``) at each
    call, so an agent may be built once, outside the workflow. A stream is recorded as the
    response it added up to, and given to the SDK as the events that response implies (on the
    first run as on a replay, so both see the same events)."""

    def __init__(
        self,
        inner: Model,
        *,
        name: str,
        run: sp.AsyncRun | None = None,
        retry: sp.Retry | int | None = None,
        price: Callable[[Any], float] | None = None,
    ) -> None:
        if not isinstance(inner, Model):
            raise UsageError(f"LedgerModel wraps an agents Model, not {type(inner).__name__}")
        self.inner = inner
        self.name = name
        self._run = run
        self._retry = model_retry(retry)
        self._price = price

    def _current(self) -> sp.AsyncRun:
        try:
            found = self._run if self._run is not None else sp.current_run()
        except UsageError:
            found = None
        if not isinstance(found, sp.AsyncRun):
            raise UsageError(
                "an agent's model calls are steps of an async def workflow: call"
                " `await Runner.run(agent, input, run_config=spoa.run_config())` inside one"
                " (Runner.run_sync starts an event loop of its own, outside the run)"
            )
        return found

    async def _record(
        self, name: str, request: _Request, ask: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """The record of the model step ``name`` answering ``request``: ``ask()`` the first time
        (a failure another attempt may cure raised as ``TransientFailure``), the ledger after."""
        run = self._current()

        async def attempt(**_: Any) -> dict[str, Any]:
            try:
                return await ask()
            except Exception as exc:
                raise failure(exc) from exc

        items = to_json(request.input)
        recorded: dict[str, Any] = await run.model(
            "model",
            attempt,
            name=name,
            model=self.name,
            messages=sp.Transcript(items) if isinstance(items, list) else items,
            tools=[tool_projection(t) for t in request.tools],
            retry=self._retry,
            usage=price_usage(self._price, lambda reply: (reply.get("usage") or {}).get("total_tokens")),
            **request.params(),
        )
        return recorded

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        """The model's response to the request: a model step (``openai_agents.get_response``)."""
        request = _Request(
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id, conversation_id, prompt,
        )  # fmt: skip

        async def ask() -> dict[str, Any]:
            return recorded_response(await self.inner.get_response(*request.positional, **request.named))

        return rebuilt_response(await self._record("openai_agents.get_response", request, ask))

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """The model's response as stream events: a model step
        (``openai_agents.stream_response``) that records the final response; the events are
        synthesized from that record (created, each item added with its deltas, completed)."""
        request = _Request(
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id, conversation_id, prompt,
        )  # fmt: skip

        async def ask() -> dict[str, Any]:
            streamed = self.inner.stream_response(*request.positional, **request.named)
            return _final_response([event async for event in streamed])

        for event in response_events(await self._record("openai_agents.stream_response", request, ask)):
            yield event

    async def close(self) -> None:
        """Close the inner model."""
        await self.inner.close()


class LedgerModelProvider(ModelProvider):
    """A ``ModelProvider`` whose models are ``LedgerModel``s over the SDK's own
    ``OpenAIResponsesModel`` (``api="chat"``: ``OpenAIChatCompletionsModel``), on ``client``
    (an ``AsyncOpenAI``; default: one from the environment) with its retries off — a failed
    attempt is the ledger's to retry (``retry``: a ``sp.Retry`` or a number of attempts)."""

    def __init__(
        self,
        run: sp.AsyncRun | None = None,
        *,
        client: openai.AsyncOpenAI | None = None,
        api: Api = "responses",
        default_model: str = "gpt-4.1",
        retry: sp.Retry | int | None = None,
        price: Callable[[Any], float] | None = None,
    ) -> None:
        if api not in ("responses", "chat"):
            raise UsageError(f"api={api!r}: 'responses' (the Responses API) or 'chat' (Chat Completions)")
        if client is not None and not isinstance(client, openai.AsyncOpenAI):
            raise UsageError(
                f"client= is an openai.AsyncOpenAI (the Agents SDK is async), not {type(client).__name__}"
            )
        self._run = run
        self._client = client
        self._api = api
        self._default = default_model
        self._retry = model_retry(retry)
        self._price = price

    def _openai(self) -> openai.AsyncOpenAI:
        if self._client is None:
            self._client = openai.AsyncOpenAI()
        return self._client.with_options(max_retries=0)

    def get_model(self, model_name: str | None) -> Model:
        """The ledger's model for ``model_name`` (the provider's default when None)."""
        name = model_name or self._default
        inner: Model
        if self._api == "chat":
            inner = OpenAIChatCompletionsModel(name, self._openai())
        else:
            inner = OpenAIResponsesModel(name, self._openai())
        return LedgerModel(inner, name=name, run=self._run, retry=self._retry, price=self._price)
