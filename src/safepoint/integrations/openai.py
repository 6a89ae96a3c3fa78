"""OpenAI on the ledger: a client bound to a run, whose Chat Completions and Responses calls are
model steps, and ready tool loops for both APIs (``pip install 'safepoint[openai]'``).

    from safepoint.integrations import openai as spo

    gpt = spo.bind(run, OpenAI())                 # or AsyncOpenAI() in an async workflow
    completion = gpt.chat.completions.create(model=..., messages=..., tools=...)
    response = gpt.responses.create(model=..., input=..., tools=...)

``tools=`` takes a ``safepoint.integrations.tools.Tools`` registry too, sent and hashed as its
``openai_chat()`` or ``openai_responses()`` definitions (the same step as passing those).

Each call of ``gpt.chat.completions.create`` / ``parse`` / ``stream`` and
``gpt.responses.create`` / ``parse`` / ``stream`` is one model step (ids ``model``, ``model#2``,
…; names ``openai.chat.completions.create`` …): recorded as the API's JSON the first time,
replayed from the ledger on every resume — no request is sent twice. The workflow gets the
SDK's own objects rebuilt from the record (``ChatCompletion.construct`` /
``Response.construct``: unknown fields kept, a function call's ``async`` too), on the first run
as on replay; a credential the reply quotes is recorded redacted, and the workflow sees the
redacted reply both times.

The fingerprint (the step's input hash: a replay that meets a different one stops with
``StaleCheckpoint``) covers what the request asks:

- Chat Completions: ``model``, ``messages``, ``tools``, ``tool_choice``,
  ``parallel_tool_calls``, ``response_format`` (a class as the JSON schema it sends), ``seed``,
  ``temperature``, ``top_p``, ``n``, ``stop``, ``max_tokens``, ``max_completion_tokens``,
  ``reasoning_effort``, ``logprobs``, ``top_logprobs``, ``frequency_penalty``,
  ``presence_penalty``, ``logit_bias``, ``modalities``, ``audio``, ``prediction``,
  ``verbosity``, ``web_search_options``;
- Responses: ``model``, ``input``, ``instructions``, ``tools``, ``tool_choice``,
  ``parallel_tool_calls``, ``max_output_tokens``, ``max_tool_calls``, ``reasoning``, ``text``
  (with a ``text_format`` class as the JSON schema it sends), ``include``, ``truncation``,
  ``temperature``, ``top_p``, ``top_logprobs``, ``prompt``; with ``server_state=True`` also
  ``previous_response_id``, ``conversation`` and ``background``;
- and any other argument not listed below (a new API parameter is part of the request until
  it is known not to be).

It leaves out what only carries the request: ``stream``, ``stream_options``, ``timeout``,
``extra_headers``, ``extra_query``, ``extra_body``, ``metadata``, ``user``,
``safety_identifier``, ``service_tier``, ``store``, ``prompt_cache_key``,
``prompt_cache_retention``, ``prompt_cache_options``, ``background_options``, ``moderation``
(and ``parse_as``, which is never sent). They reach the SDK unchanged.

Retries are the ledger's: the bound client is ``client.with_options(max_retries=0)``, and a
failure another attempt may cure — 408, 409, 429 and 5xx (or what ``x-should-retry`` says), a
connection error or timeout, a stream cut mid-body — is a recorded failed attempt
(``TransientFailure``, waiting at least what ``retry-after`` asks), tried again up to ``retry``
attempts (default 6, backing off from 1 s to 60 s); then the run stops, resumably
(``sp.extend_limits(..., step_attempts=N)`` and ``sp.resume`` carry it on). Any other error —
a 400 — is the step's recorded failure, raised as ``StepFailed`` now and on every replay.

A stream is recorded as the completion or response it added up to, and replayed as an object
with what callers use (``get_final_completion()`` / ``get_final_response()``, ``until_done()``,
iteration over the SDK's events synthesized from the record, ``async with`` / ``async for``);
``create(stream=True)`` gives the recorded reply's chunks or events.

What the server would hold is refused unless ``bind(..., server_state=True)``:
``conversation=``, ``previous_response_id=``, ``background=True`` (and re-attaching with
``responses.stream(response_id=...)``) — send the whole input each turn instead, as
``responses_tool_loop`` does.
"""

from __future__ import annotations

try:
    import openai
except ImportError as exc:  # pragma: no cover - the extra is what provides it
    raise ImportError(
        "safepoint.integrations.openai needs the openai package: pip install 'safepoint[openai]'"
    ) from exc

from collections.abc import Callable
from typing import Any, overload

from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseFunctionToolCall

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations.tools import ToolCall, ToolOutcome, Tools

from ._common import LoopApi, LoopResult, as_transcript, check_turns, run_loop, run_loop_async, without_none
from ._openai_chat import AsyncCompletions, Completions
from ._openai_requests import Binding, wire
from ._openai_responses import AsyncResponses, Responses

__all__ = [
    "BoundAsyncOpenAI",
    "BoundOpenAI",
    "bind",
    "chat_tool_calls",
    "chat_tool_results",
    "chat_tool_results_async",
    "chat_turn",
    "response_items",
    "response_tool_calls",
    "response_tool_results",
    "response_tool_results_async",
    "responses_tool_loop",
    "responses_tool_loop_async",
    "tool_loop",
    "tool_loop_async",
]


class _Bound:
    def __getattr__(self, name: str) -> Any:
        # only the model calls are steps: say so, rather than send an unrecorded request
        raise AttributeError(
            f"{type(self).__name__} has no {name!r}: only chat.completions and responses calls are"
            " model steps. Call anything else on the client itself (inside run.read(...) to record it)"
        )


class BoundChat(_Bound):
    """``gpt.chat``: ``gpt.chat.completions.create`` / ``parse`` / ``stream``."""

    def __init__(self, completions: Completions | AsyncCompletions) -> None:
        self.completions = completions


class BoundOpenAI(_Bound):
    """An ``OpenAI`` client bound to a run (``bind``): ``chat.completions`` and ``responses``,
    whose ``create``, ``parse`` and ``stream`` are model steps of the run."""

    def __init__(self, binding: Binding) -> None:
        self.chat = BoundChat(Completions(binding))
        self.responses = Responses(binding)
        self._binding = binding


class BoundAsyncOpenAI(_Bound):
    """An ``AsyncOpenAI`` client bound to an ``AsyncRun``: ``BoundOpenAI``, awaited."""

    def __init__(self, binding: Binding) -> None:
        self.chat = BoundChat(AsyncCompletions(binding))
        self.responses = AsyncResponses(binding)
        self._binding = binding


@overload
def bind(
    run: sp.Run | None,
    client: openai.OpenAI,
    *,
    retry: sp.Retry | int | None = None,
    price: Callable[[Any], float] | None = None,
    step_id: str = "model",
    server_state: bool = False,
) -> BoundOpenAI: ...
@overload
def bind(
    run: sp.AsyncRun | None,
    client: openai.AsyncOpenAI,
    *,
    retry: sp.Retry | int | None = None,
    price: Callable[[Any], float] | None = None,
    step_id: str = "model",
    server_state: bool = False,
) -> BoundAsyncOpenAI: ...
def bind(
    run: sp.Run | sp.AsyncRun | None,
    client: openai.OpenAI | openai.AsyncOpenAI,
    *,
    retry: sp.Retry | int | None = None,
    price: Callable[[Any], float] | None = None,
    step_id: str = "model",
    server_state: bool = False,
) -> BoundOpenAI | BoundAsyncOpenAI:
    """``client`` bound to ``run``: its ``chat.completions`` and ``responses`` calls are model
    steps of the run, recorded once and replayed on every resume.

    ``OpenAI`` goes with a ``Run``, ``AsyncOpenAI`` with an ``AsyncRun``; ``run=None`` records
    on the run executing the workflow at each call (``safepoint.current_run()``). ``retry``: the
    attempts of each call (an int, or a ``safepoint.Retry``; the SDK's own retries are off).
    ``price(reply_json) -> float`` gives each reply's cost, counted against the run's budget
    with the tokens the reply reports. ``step_id`` names the steps (``model``, ``model#2``, …).
    ``server_state=True`` allows ``conversation=``, ``previous_response_id=`` and
    ``background=True``, which leave part of the run on OpenAI's servers.

    >>> gpt = spo.bind(run, OpenAI())
    >>> reply = gpt.responses.create(model="gpt-5", input="Hello")
    """
    if isinstance(client, openai.AsyncOpenAI):
        return BoundAsyncOpenAI(
            Binding(
                run,
                client,
                is_async=True,
                retry=retry,
                price=price,
                step_id=step_id,
                server_state=server_state,
            )
        )
    if isinstance(client, openai.OpenAI):
        return BoundOpenAI(
            Binding(
                run,
                client,
                is_async=False,
                retry=retry,
                price=price,
                step_id=step_id,
                server_state=server_state,
            )
        )
    raise UsageError(f"bind takes an openai.OpenAI or openai.AsyncOpenAI client, not {type(client).__name__}")


# -- turns and tool results ------------------------------------------------------------------


def _message(completion: ChatCompletion) -> Any:
    if not completion.choices:
        raise UsageError("the completion has no choices: there is no assistant turn to send back")
    return completion.choices[0].message


def chat_turn(completion: ChatCompletion) -> dict[str, Any]:
    """The completion's assistant message as the next request's input: JSON, without the
    ``None`` fields and the fields an input message does not take (annotations, the SDK's
    parsing); an audio reply as the ``{"id"}`` the API takes back."""
    found = without_none(wire(_message(completion)))
    turn: dict[str, Any] = {"role": "assistant"}
    for key in ("content", "refusal", "name", "function_call"):
        if key in found:
            turn[key] = found[key]
    if isinstance(found.get("audio"), dict) and "id" in found["audio"]:
        turn["audio"] = {"id": found["audio"]["id"]}
    calls = []
    for call in found.get("tool_calls") or []:
        call.pop("index", None)
        if isinstance(call.get("function"), dict):
            call["function"].pop("parsed_arguments", None)
        calls.append(call)
    if calls:
        turn["tool_calls"] = calls
    if not any(key in turn for key in ("content", "tool_calls", "function_call", "audio")):
        turn["content"] = ""
    return turn


def chat_tool_calls(completion: ChatCompletion) -> list[ToolCall]:
    """The tool calls of the completion's assistant message, keyed by their ``id``."""
    calls = []
    for call in _message(completion).tool_calls or []:
        if call.type == "function":
            calls.append(ToolCall(call.id, call.function.name, call.function.arguments))
        else:  # a custom tool's free text: answered as the registry answers what it cannot read
            custom = getattr(call, "custom", None)
            calls.append(ToolCall(call.id, getattr(custom, "name", call.type), getattr(custom, "input", "")))
    return calls


def _tool_messages(outcomes: list[ToolOutcome]) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": o.call_id, "content": o.content} for o in outcomes]


def _registry(tools: Tools | None) -> Tools:
    if tools is None:
        return Tools()  # no tools: every call is answered as a call of an unknown tool
    if not isinstance(tools, Tools):
        raise UsageError(
            "tools= is a safepoint.integrations.tools.Tools registry (its definitions are sent"
            f" each turn, its tools answer the calls), not {type(tools).__name__}"
        )
    return tools


def chat_tool_results(run: sp.Run | None, completion: ChatCompletion, tools: Tools) -> list[dict[str, Any]]:
    """Each tool call of the completion run through its step (``tool.<call id>``, in the order
    the model gave them), answered as the ``role: "tool"`` messages to append; ``[]`` when it
    called none. ``run=None``: the run executing this workflow."""
    return _tool_messages(_registry(tools).call_all(run, chat_tool_calls(completion)))


async def chat_tool_results_async(
    run: sp.AsyncRun | None, completion: ChatCompletion, tools: Tools
) -> list[dict[str, Any]]:
    """``chat_tool_results`` in an async workflow."""
    return _tool_messages(await _registry(tools).call_all_async(run, chat_tool_calls(completion)))


def response_items(response: Response) -> list[dict[str, Any]]:
    """The response's output items as the next request's input: JSON by their wire names
    (``call_id``, ``async`` kept exactly), without ``None`` fields or the SDK's parsing."""
    items = []
    for item in [wire(item) for item in response.output or []]:
        item.pop("parsed_arguments", None)
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict):
                part.pop("parsed", None)
        items.append(without_none(item))
    return items


def response_tool_calls(response: Response) -> list[ToolCall]:
    """The response's function calls, keyed by their ``call_id``."""
    return [
        ToolCall(item.call_id, item.name, item.arguments)
        for item in response.output or []
        if isinstance(item, ResponseFunctionToolCall)
    ]


def _outputs(outcomes: list[ToolOutcome]) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": o.call_id, "output": o.content} for o in outcomes]


def response_tool_results(run: sp.Run | None, response: Response, tools: Tools) -> list[dict[str, Any]]:
    """Each function call of the response run through its step (``tool.<call_id>``, in output
    order), answered as the ``function_call_output`` items to append; ``[]`` when it made none."""
    return _outputs(_registry(tools).call_all(run, response_tool_calls(response)))


async def response_tool_results_async(
    run: sp.AsyncRun | None, response: Response, tools: Tools
) -> list[dict[str, Any]]:
    """``response_tool_results`` in an async workflow."""
    return _outputs(await _registry(tools).call_all_async(run, response_tool_calls(response)))


# -- the loops: an adapter per API, driven by the shared loop ---------------------------------


def _loop_params(params: dict[str, Any], tools: Tools | None, definitions: str) -> dict[str, Any]:
    for name in ("stream", "tools"):
        if name in params:
            raise UsageError(
                f"a tool loop sets {name}= itself (each turn is one recorded reply; tools come from"
                " the Tools registry): leave it out, or write the loop with bind()"
            )
    found = dict(params)
    registry = _registry(tools) if tools is not None else None
    if registry is not None and len(registry):
        found["tools"] = getattr(registry, definitions)()
    return found


def _loop_binding(run: Any, client: Any, *, is_async: bool, **options: Any) -> Any:
    if isinstance(client, openai.AsyncOpenAI) is not is_async:
        wanted = "an AsyncOpenAI client (the loop is async)" if is_async else "an OpenAI client"
        other = "the plain loop" if is_async else "its _async twin, awaited, in an async def workflow"
        raise UsageError(f"this tool loop takes {wanted}; for {type(client).__name__}, call {other}")
    return bind(run, client, **options)


def _chat_text(completion: ChatCompletion) -> str:
    return (completion.choices[0].message.content or "") if completion.choices else ""


def _chat_stop(completion: ChatCompletion, calls: list[ToolCall]) -> str | None:
    reason = completion.choices[0].finish_reason if completion.choices else None
    return None if reason == "tool_calls" or (reason == "stop" and calls) else str(reason)


def _responses_stop(response: Response, calls: list[ToolCall]) -> str | None:
    if response.status == "incomplete":
        return f"incomplete:{getattr(response.incomplete_details, 'reason', None) or 'unknown'}"
    return None if calls else str(response.status or "completed")


def _chat_inputs(
    model: str, params: dict[str, Any], tools: Tools | None, messages: Any, turns: int
) -> dict[str, Any]:
    request = {"model": model, **_loop_params(params, tools, "openai_chat")}
    check_turns(turns)
    return {**request, "messages": as_transcript(messages, "messages")}


# The two APIs' sides of the loop.
_CHAT = LoopApi("messages", lambda c: [chat_turn(c)], chat_tool_calls, _chat_stop, _tool_messages, _chat_text)
_RESPONSES = LoopApi(
    "input", response_items, response_tool_calls, _responses_stop, _outputs, lambda r: r.output_text
)


def tool_loop(
    run: sp.Run | None,
    client: openai.OpenAI,
    *,
    model: str,
    messages: Any,
    tools: Tools | None = None,
    max_turns: int = 20,
    price: Callable[[Any], float] | None = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[ChatCompletion]:
    """A Chat Completions tool-use loop, durable: each turn one model step, each tool call its
    step; a resume replays both and carries on where the run stopped.

    ``messages`` (a list, copied, or a ``safepoint.Transcript``, appended to in place) gets
    every assistant turn and tool message appended. The loop runs the tools while the model
    ends its turn with tool calls, and stops on any other finish (``stop``, ``length``,
    ``content_filter``: ``LoopResult.stop``), or after ``max_turns`` model calls (``"max_turns"``,
    the last turn's tool calls answered first, so the transcript is valid to carry on).
    ``params`` go to every ``chat.completions.create``; ``price``, ``retry``, ``step_id`` as
    for ``bind``."""
    gpt = _loop_binding(run, client, is_async=False, retry=retry, price=price, step_id=step_id)
    request = _chat_inputs(model, params, tools, messages, max_turns)
    return run_loop(_CHAT, request, max_turns, gpt.chat.completions.create, run, _registry(tools))


async def tool_loop_async(
    run: sp.AsyncRun | None,
    client: openai.AsyncOpenAI,
    *,
    model: str,
    messages: Any,
    tools: Tools | None = None,
    max_turns: int = 20,
    price: Callable[[Any], float] | None = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[ChatCompletion]:
    """``tool_loop`` in an async workflow, with an ``AsyncOpenAI`` client."""
    gpt = _loop_binding(run, client, is_async=True, retry=retry, price=price, step_id=step_id)
    request = _chat_inputs(model, params, tools, messages, max_turns)
    return await run_loop_async(_CHAT, request, max_turns, gpt.chat.completions.create, run, _registry(tools))


def _responses_inputs(
    model: str, instructions: str | None, params: dict[str, Any], tools: Tools | None, input: Any, turns: int
) -> dict[str, Any]:
    request = {"model": model, **_loop_params(params, tools, "openai_responses")}
    if instructions is not None:
        request["instructions"] = instructions
    check_turns(turns)
    conversation = [{"role": "user", "content": input}] if isinstance(input, str) else input
    return {**request, "input": as_transcript(conversation, "input")}


def responses_tool_loop(
    run: sp.Run | None,
    client: openai.OpenAI,
    *,
    model: str,
    input: Any,
    instructions: str | None = None,
    tools: Tools | None = None,
    max_turns: int = 20,
    price: Callable[[Any], float] | None = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[Response]:
    """A Responses tool-use loop, durable, sending the whole input each turn (no server-held
    state): each turn one model step, each function call its step.

    ``input`` (a str — the user's message —, a list of items, copied, or a
    ``safepoint.Transcript``, appended to in place) gets every output item and function call
    output appended. The loop runs the tools while the response holds function calls, and
    stops on a response without one (``LoopResult.stop`` is its status, ``"completed"``), on an
    incomplete one (``"incomplete:<reason>"``, e.g. ``incomplete:max_output_tokens``), or after
    ``max_turns`` model calls (``"max_turns"``, the last calls answered first)."""
    gpt = _loop_binding(run, client, is_async=False, retry=retry, price=price, step_id=step_id)
    request = _responses_inputs(model, instructions, params, tools, input, max_turns)
    return run_loop(_RESPONSES, request, max_turns, gpt.responses.create, run, _registry(tools))


async def responses_tool_loop_async(
    run: sp.AsyncRun | None,
    client: openai.AsyncOpenAI,
    *,
    model: str,
    input: Any,
    instructions: str | None = None,
    tools: Tools | None = None,
    max_turns: int = 20,
    price: Callable[[Any], float] | None = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[Response]:
    """``responses_tool_loop`` in an async workflow, with an ``AsyncOpenAI`` client."""
    gpt = _loop_binding(run, client, is_async=True, retry=retry, price=price, step_id=step_id)
    request = _responses_inputs(model, instructions, params, tools, input, max_turns)
    return await run_loop_async(_RESPONSES, request, max_turns, gpt.responses.create, run, _registry(tools))
