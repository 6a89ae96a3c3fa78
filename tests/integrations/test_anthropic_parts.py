"""The I/O-free parts of the Anthropic integration, with the real anthropic SDK's types: the
fingerprint a model step is hashed by, which failures are worth another attempt, a recorded
reply rebuilt, the events a recorded stream is made of, and where the tool loop goes next.
"""

from __future__ import annotations

import inspect
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.lib.streaming import BetaMessageStream, MessageStream

import safepoint as sp
from safepoint.errors import TransientFailure
from safepoint.integrations._anthropic_loop import _next, assistant_turn, tool_calls
from safepoint.integrations._anthropic_request import (
    HASHED,
    UNHASHED,
    fingerprint,
    rebuild,
    refuse_server_state,
    sdk_arguments,
    transient_failure,
    usage_tokens,
)
from safepoint.integrations._anthropic_stream import (
    RecordedBetaMessageStream,
    RecordedEvents,
    RecordedMessageStream,
    event_dicts,
    raw_events,
)
from safepoint.integrations.tools import Tools

EPHEMERAL = {"type": "ephemeral"}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "cache_control": "a property, kept"}}}


def request(**overrides: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        **overrides,
    }


# -- the fingerprint ---------------------------------------------------------------------------


def test_cache_breakpoints_are_left_out_of_the_fingerprint_wherever_they_are() -> None:
    cached = fingerprint(
        request(
            cache_control=EPHEMERAL,
            system=[{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}],
            tools=[{"name": "search", "input_schema": SCHEMA, "cache_control": EPHEMERAL}],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "found", "cache_control": EPHEMERAL}],
                            "cache_control": EPHEMERAL,
                        }
                    ],
                },
            ],
        )
    )
    assert "cache_control" not in str(cached.messages)
    assert cached.params["system"] == [{"type": "text", "text": "Be brief."}]
    assert cached.tools == [{"name": "search", "input_schema": SCHEMA}]  # the schema's own key stays
    assert "cache_control" not in cached.params


def test_how_a_request_is_sent_is_not_hashed_and_what_it_asks_is() -> None:
    how = {
        "stream": True,
        "timeout": 30,
        "extra_headers": {"x": "1"},
        "extra_query": {"q": "1"},
        "extra_body": {"something": 1},
        "metadata": {"user_id": "u"},
        "service_tier": "auto",
        "speed": "fast",
        "inference_geo": "eu",
        "user_profile_id": "p",
        "workspace_id": "w",
        "diagnostics": {"x": 1},
        "billing_policy": {"x": 1},
        "fallback_credit_token": "tok",
        "betas": anthropic.NOT_GIVEN,
    }
    assert fingerprint(request(**how)).params == {"max_tokens": 64}
    what = {
        "stop_sequences": ["END"],
        "thinking": {"type": "adaptive"},
        "tool_choice": {"type": "auto"},
        "container": "c1",
        "betas": ["b1"],
        "context_management": {"edits": []},
        "mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}],
        "compaction": {"x": 1},
        "fallbacks": [{"model": "y"}],
        "a_parameter_of_a_newer_sdk": 1,  # unknown to this code: hashed, so a change refuses to replay
    }
    assert fingerprint(request(**what)).params == {"max_tokens": 64, **what}


def test_sampling_is_hashed_and_sent_in_the_body_however_it_is_given() -> None:
    given = request(temperature=0.2, extra_body={"top_k": 5, "other": 1})
    assert fingerprint(given).params == {"max_tokens": 64, "temperature": 0.2, "top_k": 5}
    sent = sdk_arguments(given)
    assert "temperature" not in sent
    assert sent["extra_body"] == {"temperature": 0.2, "top_k": 5, "other": 1}


class Answer(pydantic.BaseModel):
    city: str


def test_an_output_format_is_hashed_as_its_json_schema() -> None:
    schema = fingerprint(request(output_format=Answer)).params["output_format"]
    assert schema["properties"] == {"city": {"title": "City", "type": "string"}}
    assert fingerprint(request(output_format=None)).params["output_format"] is None
    with pytest.raises(sp.UsageError, match="JSON schema"):
        fingerprint(request(output_format=object()))


def test_a_transcript_is_hashed_by_its_reference_and_a_registry_by_its_definitions() -> None:
    transcript = sp.Transcript([{"role": "user", "content": "hi"}])
    tools = Tools()

    @tools.pure
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    found = fingerprint(request(messages=transcript, tools=tools))
    assert found.messages is transcript  # run.model hashes its length and chain: a constant cost
    assert found.tools == tools.anthropic()
    assert sdk_arguments(request(tools=tools))["tools"] == tools.anthropic()


def test_the_sdks_function_tools_are_hashed_as_their_definition() -> None:
    @anthropic.beta_tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return order_id

    (definition,) = fingerprint(request(tools=[lookup])).tools
    assert definition["name"] == "lookup"
    assert definition["input_schema"]["properties"] == {"order_id": {"title": "Order Id", "type": "string"}}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"model": None}, "model's id"),
        ({"messages": None}, "messages= is required"),
        ({"tools": "search"}, "list of tool definitions"),
    ],
)
def test_a_request_that_cannot_be_fingerprinted_is_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(sp.UsageError, match=message):
        fingerprint(request(**given))


def test_a_thread_is_refused_unless_server_state_is_allowed() -> None:
    with pytest.raises(sp.UsageError, match="server_state=True"):
        refuse_server_state({"thread": {"type": "create"}}, False, "beta.messages.create")
    refuse_server_state({"thread": {"type": "create"}}, True, "beta.messages.create")
    refuse_server_state({"thread": None}, False, "beta.messages.create")
    refuse_server_state({"thread": anthropic.omit}, False, "beta.messages.create")
    assert fingerprint(request(thread={"type": "create"})).params["thread"] == {"type": "create"}


# -- failures ----------------------------------------------------------------------------------

REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/messages")


ERRORS = {429: anthropic.RateLimitError, 529: anthropic.OverloadedError, 400: anthropic.BadRequestError}


def status_error(
    status: int, headers: dict[str, str] | None = None, body: Any = None
) -> anthropic.APIStatusError:
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    return ERRORS.get(status, anthropic.APIStatusError)("failed", response=response, body=body)


@pytest.mark.parametrize(
    ("error", "wait"),
    [
        (status_error(408), None),
        (status_error(409), None),
        (status_error(429, {"retry-after": "2"}), 2.0),
        (status_error(429, {"retry-after-ms": "250"}), 0.25),
        (status_error(500), None),
        (status_error(503), None),
        (status_error(529, {"retry-after": "1"}), 1.0),
        (status_error(400, {"x-should-retry": "true"}), None),
        (anthropic.APIConnectionError(request=REQUEST), None),
        (anthropic.APITimeoutError(request=REQUEST), None),
        (httpx2.RemoteProtocolError("peer closed connection without sending complete message body"), None),
        (status_error(200, body={"type": "error", "error": {"type": "overloaded_error"}}), None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else repr(v),
)
def test_failures_another_attempt_may_get_past_are_transient(
    error: BaseException, wait: float | None
) -> None:
    failure = transient_failure(error)
    assert isinstance(failure, TransientFailure)
    assert failure.retry_after == wait


@pytest.mark.parametrize(
    "error",
    [
        status_error(400),
        status_error(401),
        status_error(404),
        status_error(413),
        status_error(500, {"x-should-retry": "false"}),
        status_error(200, body={"type": "error", "error": {"type": "invalid_request_error"}}),
        ValueError("not a model failure"),
    ],
)
def test_failures_that_would_repeat_are_not_transient(error: BaseException) -> None:
    assert transient_failure(error) is None


# -- replies -----------------------------------------------------------------------------------

REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "thinking", "thinking": "Let me see.", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "opaque"},
        {
            "type": "text",
            "text": '{"city": "Lyon"}',
            "citations": [
                {
                    "type": "char_location",
                    "cited_text": "Lyon",
                    "document_index": 0,
                    "start_char_index": 0,
                    "end_char_index": 4,
                }
            ],
        },
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "Lyon"}},
        {"type": "hologram_2027", "frames": [1, 2]},
        {"type": "tool_use", "id": "toolu_1", "name": "get_order", "input": {"order_id": "A1", "n": 1.5}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 5},
}


def test_a_reply_is_rebuilt_leniently_and_an_unknown_block_survives() -> None:
    for beta in (False, True):
        message = rebuild(REPLY, beta=beta, parsed=False)
        assert type(message) is (anthropic.types.beta.BetaMessage if beta else anthropic.types.Message)
        assert message.to_dict(mode="json", warnings=False) == REPLY
        assert message.content[4].type == "hologram_2027"
    turn = assistant_turn(rebuild(REPLY, beta=False, parsed=False))
    assert turn["content"][4] == {"type": "hologram_2027", "frames": [1, 2]}
    assert [c.call_id for c in tool_calls(REPLY)] == ["toolu_1"]  # the server's tool is not ours
    assert usage_tokens(REPLY) == 35


def test_a_parsed_reply_gets_its_parsed_output_again() -> None:
    parsed = rebuild(REPLY, beta=False, parsed=True, output_format=Answer)
    assert parsed.parsed_output == Answer(city="Lyon")
    assert "parsed_output" not in str(parsed.to_dict(warnings=False))  # never recorded: derived from the text
    beta = rebuild(REPLY, beta=True, parsed=True, output_format=Answer)
    assert type(beta).__name__ == "ParsedBetaMessage"
    assert beta.parsed_output == Answer(city="Lyon")
    assert rebuild(REPLY, beta=False, parsed=True).parsed_output is None


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("beta", [False, True])
def test_the_events_of_a_recorded_stream_add_up_to_the_recorded_message(beta: bool) -> None:
    message = rebuild(REPLY, beta=beta, parsed=True)
    kind = RecordedBetaMessageStream if beta else RecordedMessageStream
    stream = kind(RecordedEvents(raw_events(REPLY, beta=beta), message), anthropic.NOT_GIVEN)
    assert isinstance(stream, BetaMessageStream if beta else MessageStream)
    seen = [event.type for event in stream]
    accumulated = stream.current_message_snapshot.to_dict(mode="json", warnings=False)
    assert without_nulls(accumulated) == without_nulls(REPLY)  # the SDK's own accumulation agrees
    assert stream.get_final_message() is message  # the record itself, not the accumulation
    assert stream.get_final_text() == '{"city": "Lyon"}'
    assert seen.count("content_block_start") == seen.count("content_block_stop") == 6
    assert {"thinking", "signature", "text", "citation", "input_json"} <= set(seen)
    assert seen[0] == "message_start"
    assert seen[-2:] == ["message_delta", "message_stop"]


def test_a_block_opens_empty_and_its_deltas_fill_it() -> None:
    events = event_dicts(REPLY, beta=False)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[2] == {"type": "text", "text": ""}
    assert starts[4] == {"type": "hologram_2027", "frames": [1, 2]}  # unknown: opened whole
    assert starts[5]["input"] == {}
    assert events[0]["message"]["content"] == []
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {"output_tokens": 20}


# -- the loop's next move ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "with_tools", "then"),
    [
        ("tool_use", True, "tools"),
        ("tool_use", False, None),
        ("pause_turn", True, "again"),
        ("pause_turn", False, "again"),
        ("end_turn", True, None),
        ("stop_sequence", True, None),
        ("max_tokens", True, None),
        ("refusal", True, None),
        ("model_context_window_exceeded", True, None),
        ("a_reason_of_2027", True, None),
    ],
)
def test_the_loop_answers_tools_continues_a_pause_and_stops_on_anything_else(
    reason: str, with_tools: bool, then: str | None
) -> None:
    message = rebuild({**REPLY, "stop_reason": reason}, beta=False, parsed=False)
    assert _next(message, Tools() if with_tools else None) == then


@pytest.mark.parametrize(
    "create",
    [anthropic.resources.messages.Messages.create, anthropic.resources.beta.messages.Messages.create],
)
def test_every_parameter_of_the_sdk_is_either_hashed_or_said_not_to_be(create: Any) -> None:
    """A parameter a newer SDK adds is hashed until someone decides (a replay can only refuse
    then, never answer a different question): this names it, so that the decision is made —
    ``make test-latest`` runs it on the newest release."""
    given = set(inspect.signature(create).parameters) - {"self"}
    assert given - set(HASHED) - UNHASHED == set()
