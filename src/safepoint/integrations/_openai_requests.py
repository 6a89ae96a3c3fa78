"""How one call of the OpenAI SDK becomes a model step.

Which of the call's arguments identify the request (hashed: a change is a different request,
and a replay that meets one stops with ``StaleCheckpoint``) and which only carry it (passed to
the SDK through a closure, never hashed); what the ledger refuses because the server would hold
it; how the SDK's failures become recorded attempts; and the binding of a client to a run that
carries the call out as ``run.model``. Nothing here knows Chat Completions from Responses
beyond the name of the argument that holds the conversation and the definitions a ``Tools``
registry gives each.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import httpx2
import openai
from openai.lib._parsing import type_to_response_format_param  # what .parse() itself sends
from openai.lib._parsing._responses import type_to_text_format_param

import safepoint as sp
from safepoint.errors import TransientFailure, UsageError
from safepoint.integrations.tools import Tools

from ._common import model_retry, price_usage, to_json, transient

Api = Literal["chat", "responses"]

# Arguments that carry a request without changing what it asks: how it travels (stream,
# timeout, headers, query, extra body), who it is billed or attributed to, where the server keeps
# it and how it caches it. They reach the SDK, never the input hash.
UNHASHED = frozenset(
    {
        "stream",
        "stream_options",
        "timeout",
        "extra_headers",
        "extra_query",
        "extra_body",
        "metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "store",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "background_options",
        "moderation",
        # read by the SDK to parse the reply, never sent: the reply is parsed again on replay
        "parse_as",
    }
)

# What a Responses request may ask the server to hold, and what to do instead.
_SERVER_STATE = {
    "conversation": "conversation= appends this turn to a conversation the server keeps",
    "previous_response_id": "previous_response_id= continues from a response the server keeps",
    "background": "background=True leaves the generation running on the server after the call",
    "response_id": "response_id= attaches to a response the server is generating",
    "starting_after": "starting_after= attaches to a response the server is generating",
}

# The conversation's argument in each API, passed to ``run.model`` as its ``messages``.
_CONVERSATION: dict[Api, str] = {"chat": "messages", "responses": "input"}


def _given(value: Any) -> bool:
    # openai marks an argument left out with Omit / NotGiven instances
    return not isinstance(value, openai.Omit | openai.NotGiven)


def refuse_server_state(api: Api, kwargs: Mapping[str, Any], server_state: bool) -> None:
    """Refuse what makes the server hold the conversation, unless the binding opted in: a resume
    replays the ledger, and the ledger cannot replay what only the server has."""
    if api != "responses" or server_state:
        return
    for name, what in _SERVER_STATE.items():
        value = kwargs.get(name)
        if value is None or value is False or not _given(value):
            continue
        raise UsageError(
            f"{what}, which a resume cannot replay from the ledger. Send the whole input each"
            " turn instead (append response_items(response) and the tool results to it, as"
            " responses_tool_loop does), or opt in with bind(..., server_state=True): the"
            " argument is then hashed, and the run relies on the server keeping that state"
        )


@dataclass(frozen=True)
class Prepared:
    """One SDK call split for ``run.model``: what is hashed (``model``, ``messages``,
    ``tools``, ``params``) and what the SDK is called with (``live``, all but the conversation,
    which the step function receives from the engine: a ``Transcript`` arrives as a list)."""

    model: str
    messages: Any
    tools: Any
    params: dict[str, Any]
    live: dict[str, Any]
    conversation: str | None

    def call_kwargs(self, messages: Any) -> dict[str, Any]:
        """The SDK's arguments, with the conversation as the engine handed it to the step."""
        if self.conversation is None:
            return dict(self.live)
        return {**self.live, self.conversation: messages}


def prepare(api: Api, kwargs: Mapping[str, Any]) -> Prepared:
    """Split the arguments of one call: the conversation and tools as JSON (SDK objects in them
    become their JSON; a ``Transcript`` is kept, so that its hash costs the same at any length),
    a response format or text format given as a class hashed as the JSON schema it sends, every
    other argument hashed unless it is in ``UNHASHED``."""
    key = _CONVERSATION[api]
    live = {k: v for k, v in kwargs.items() if _given(v)}
    model = live.get("model")
    if model is not None and not isinstance(model, str):
        raise UsageError(f"model={model!r}: the model's name, a str")
    if model is None and not (api == "responses" and ("prompt" in live or "response_id" in live)):
        raise UsageError(f"the OpenAI {api} call needs model= (the model's name)")
    messages: Any = None
    conversation: str | None = None
    if key in live:
        conversation = key
        messages = _conversation(live.pop(key), key, text_allowed=api == "responses")
    tools: Any = None
    if "tools" in live:
        live["tools"] = tool_list(api, live["tools"])
        tools = to_json(live["tools"])
    params: dict[str, Any] = {}
    for name, value in live.items():
        if name in ("model", "tools", "text_format") or name in UNHASHED:
            continue
        if name == "response_format" and inspect.isclass(value):
            params[name] = to_json(type_to_response_format_param(value))
        else:
            params[name] = to_json(value)
    text_format = live.get("text_format")
    if text_format is not None:
        # .parse() / .stream() send the class as text.format: hash what is sent
        params["text"] = {**params.get("text", {}), "format": to_json(type_to_text_format_param(text_format))}
    return Prepared(model or "", messages, tools, params, live, conversation)


def materialized(api: Api, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments with its tools read into a list (``tool_list``): they are hashed,
    sent and used to parse the reply, and an iterator can be read only once."""
    found = dict(kwargs)
    tools = found.get("tools")
    if tools is not None and _given(tools):
        found["tools"] = tool_list(api, tools)
    return found


def tool_list(api: Api, tools: Any) -> list[Any]:
    """``tools=`` as the list of definitions that is hashed and sent: a ``Tools`` registry's
    for this API (``openai_chat()`` / ``openai_responses()``, as the Anthropic client sends its
    ``anthropic()``), any other iterable read once."""
    if isinstance(tools, Tools):
        return tools.openai_chat() if api == "chat" else tools.openai_responses()
    if isinstance(tools, str | bytes | Mapping) or not hasattr(tools, "__iter__"):
        raise UsageError(
            "tools= is a safepoint.integrations.tools.Tools registry or a list of tool definitions"
            f" (tools.openai_chat() / tools.openai_responses()), not {type(tools).__name__}"
        )
    return list(tools)


def _conversation(value: Any, key: str, *, text_allowed: bool) -> Any:
    if isinstance(value, sp.Transcript) or (text_allowed and isinstance(value, str)):
        return value
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise UsageError(
            f"{key}= is a list of messages (or a safepoint.Transcript), not {type(value).__name__}"
        )
    return to_json(list(value))


def failure(exc: Exception) -> Exception:
    """What a failed attempt raises: a ``TransientFailure`` (chained) when another attempt may
    succeed — a status OpenAI's own client retries, a connection or timeout error, a stream cut
    mid-body — else the SDK's error itself, recorded as the step's failure."""
    found = transient(
        exc,
        "OpenAI",
        status_errors=(openai.APIStatusError,),
        connection_errors=(openai.APIConnectionError, httpx2.TransportError),
    )
    if found is None:
        found = _stream_error(exc)
    return exc if found is None else found


# The error types of an ``{"error": ...}`` event in a stream that another attempt may get past.
# It comes after a 200, so there is no status to read: the SDK raises a bare ``APIError``.
_TRANSIENT_STREAM_ERRORS = frozenset(
    {"server_error", "rate_limit_exceeded", "rate_limit_error", "overloaded_error", "service_unavailable"}
)


def _stream_error(exc: Exception) -> TransientFailure | None:
    """A stream that failed mid-body with a server-side error event (``server_error``, …)."""
    if type(exc) is not openai.APIError:  # not a status, connection or validation error
        return None
    body = exc.body if isinstance(exc.body, Mapping) else {}
    kinds = {body.get("type"), body.get("code")}
    if kinds & _TRANSIENT_STREAM_ERRORS:
        return TransientFailure(f"OpenAI's stream ended with {body.get('type') or body.get('code')}: {exc}")
    return None


def wire(value: Any) -> Any:
    """An SDK reply as the API's JSON (``to_dict``: wire names, fields the server set). The SDK's
    parsed replies declare their ``parsed`` fields loosely: pydantic's warning about them is
    noise here, as those fields are dropped from the record."""
    if isinstance(value, openai.BaseModel):
        return value.to_dict(mode="json", warnings=False)
    return to_json(value)


def tokens_of(reply: Any) -> int | None:
    """The tokens a reply used, as OpenAI counts them (both APIs report ``total_tokens``)."""
    usage = reply.get("usage") if isinstance(reply, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) else None


class Binding:
    """A client bound to a run: each call is one model step of that run (or of the run
    executing the workflow, when bound to ``None``), with the SDK's own retries off — a failed
    attempt is the step's, recorded before the next — and the user's price as its cost."""

    def __init__(
        self,
        run: sp.Run | sp.AsyncRun | None,
        client: Any,
        *,
        is_async: bool,
        retry: sp.Retry | int | None,
        price: Callable[[Any], float] | None,
        step_id: str,
        server_state: bool,
    ) -> None:
        if run is not None:
            _check_run(run, is_async)
        if not isinstance(step_id, str) or not step_id:
            raise UsageError(f"step_id={step_id!r}: the id of the model steps, a non-empty str")
        self._run = run
        self.client = client.with_options(max_retries=0)  # each attempt is the ledger's
        self.retry = model_retry(retry)
        self.usage = price_usage(price, tokens_of)
        self.step_id = step_id
        self.server_state = bool(server_state)
        self.is_async = is_async

    def run(self) -> Any:
        """The run a call records on: the bound one, else the one executing this workflow."""
        run = self._run if self._run is not None else sp.current_run()
        _check_run(run, self.is_async)
        return run

    def _step_args(self, api: Api, method: str, kwargs: Mapping[str, Any]) -> tuple[Any, Prepared, str]:
        resource = self.client.chat.completions if api == "chat" else self.client.responses
        name = f"openai.chat.completions.{method}" if api == "chat" else f"openai.responses.{method}"
        check_arguments(getattr(resource, method), kwargs, name)
        refuse_server_state(api, kwargs, self.server_state)
        return self.run(), prepare(api, kwargs), name

    def _model_args(self, prepared: Prepared, name: str) -> dict[str, Any]:
        return {
            "model": prepared.model,
            "messages": prepared.messages,
            "tools": prepared.tools,
            "retry": self.retry,
            "usage": self.usage,
            "name": name,
            **prepared.params,
        }

    def record(
        self, api: Api, method: str, kwargs: Mapping[str, Any], call: Callable[[Any, dict[str, Any]], Any]
    ) -> Any:
        """One model step (sync): ``call(client, sdk_kwargs)`` returns the reply as JSON; the
        step returns what the ledger holds (redacted), now and on every replay."""
        run, prepared, name = self._step_args(api, method, kwargs)

        @sp.reads_messages_only  # the SDK builds its request from a transformed copy
        def step(*, messages: Any = None, **_hashed: Any) -> Any:
            try:
                return call(self.client, prepared.call_kwargs(messages))
            except Exception as exc:
                raise_attempt_failed(exc)

        return run.model(self.step_id, step, **self._model_args(prepared, name))

    async def record_async(
        self,
        api: Api,
        method: str,
        kwargs: Mapping[str, Any],
        call: Callable[[Any, dict[str, Any]], Awaitable[Any]],
    ) -> Any:
        """``record`` for ``AsyncOpenAI`` on an ``AsyncRun``."""
        run, prepared, name = self._step_args(api, method, kwargs)

        @sp.reads_messages_only
        async def step(*, messages: Any = None, **_hashed: Any) -> Any:
            try:
                return await call(self.client, prepared.call_kwargs(messages))
            except Exception as exc:
                raise_attempt_failed(exc)

        return await run.model(self.step_id, step, **self._model_args(prepared, name))


def raise_attempt_failed(exc: Exception) -> NoReturn:
    """Raise what a failed attempt is (``failure``): the ``TransientFailure`` chained from the
    SDK's error, or the error itself."""
    found = failure(exc)
    if found is exc:
        raise exc
    raise found from exc


def check_arguments(method: Callable[..., Any], kwargs: Mapping[str, Any], name: str) -> None:
    """Refuse arguments the SDK method does not take before any step: a misspelt argument is a
    mistake in the code, not a failed model call to record."""
    try:
        inspect.signature(method).bind(**kwargs)
    except TypeError as exc:
        raise UsageError(f"{name}(): {exc}") from None


def _check_run(run: Any, is_async: bool) -> None:
    expected, client = (sp.AsyncRun, "AsyncOpenAI") if is_async else (sp.Run, "OpenAI")
    if not isinstance(run, expected):
        raise UsageError(
            f"an {client} client records on a safepoint.{expected.__name__}, not"
            f" {type(run).__name__}: bind OpenAI in a plain def workflow, AsyncOpenAI in an async one"
        )
