"""The fake model server, driven by the real ``anthropic`` and ``openai`` clients over HTTP on
127.0.0.1: the objects the SDKs build from its JSON and its streams, the faults, the request log
and the orphan check."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
import pytest
from anthropic import Anthropic, AsyncAnthropic
from openai import AsyncOpenAI, OpenAI

from safepoint.errors import UsageError
from safepoint.integrations._anthropic_request import transient_failure
from safepoint.testing import FakeModelServer, FakeRequest, Turn

KEY = "sk-test-fake"
ASK = [{"role": "user", "content": "Refund order A1"}]
TWO_CALLS = Turn.tool_calls(("get_order", {"order_id": "A1"}), ("refund", {"order_id": "A1", "cents": 500}))
SCRIPT = [TWO_CALLS, Turn.text("Refunded the order.")]
# A stream cut mid-body: anthropic's public APIConnectionError from 2.17 on; before, the transport's
# own error came through the SDK as it was.
ANTHROPIC_CUT = (anthropic.APIConnectionError, httpx2.TransportError)


def claude(fake: FakeModelServer, retries: int = 0) -> Anthropic:
    return Anthropic(api_key=KEY, base_url=fake.url, max_retries=retries)


def gpt(fake: FakeModelServer, retries: int = 0) -> OpenAI:
    return OpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=retries)


def claude_history(msg: anthropic.types.Message) -> list[dict[str, Any]]:
    """The Anthropic conversation after ``msg``: its tool calls answered."""
    results = [
        {"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
        for b in msg.content
        if b.type == "tool_use"
    ]
    return [
        *ASK,
        {"role": "assistant", "content": msg.to_dict()["content"]},
        {"role": "user", "content": results},
    ]


def chat_history(completion: Any) -> list[dict[str, Any]]:
    message = completion.choices[0].message
    tools = [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls or []]
    return [*ASK, message.to_dict(exclude_none=True), *tools]


def responses_history(response: Any) -> list[dict[str, Any]]:
    outputs = [
        {"type": "function_call_output", "call_id": i.call_id, "output": "ok"}
        for i in response.output
        if i.type == "function_call"
    ]
    return [*ASK, *(i.to_dict(exclude_none=True) for i in response.output), *outputs]


class Order(pydantic.BaseModel):
    order_id: str
    refunded: bool


ORDER_JSON = '{"order_id": "A1", "refunded": true}'


# ---- Anthropic Messages ----


def test_anthropic_create_answers_the_turn_with_ids_usage_and_stop_reason() -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = claude(fake)
        first = client.messages.create(model="claude-test", max_tokens=100, messages=ASK)
        second = client.messages.create(model="claude-test", max_tokens=100, messages=claude_history(first))
    assert first.stop_reason == "tool_use"
    assert first.model == "claude-test"
    assert first.id.startswith("msg_01")
    assert len(first.id) == 28
    calls = [b for b in first.content if b.type == "tool_use"]
    assert [(c.name, c.input) for c in calls] == [
        ("get_order", {"order_id": "A1"}),
        ("refund", {"order_id": "A1", "cents": 500}),
    ]
    assert all(c.id.startswith("toolu_01") for c in calls)
    assert calls[0].id != calls[1].id
    assert first.usage.input_tokens > 0
    assert first.usage.output_tokens > 0
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == ["Refunded the order."]
    assert second.usage.input_tokens > first.usage.input_tokens  # a longer history, more tokens
    assert [(r.api, r.path, r.turn, r.stream) for r in fake.requests] == [
        ("anthropic", "/v1/messages", 0, False),
        ("anthropic", "/v1/messages", 1, False),
    ]
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert "anthropic-version" in fake.requests[0].headers
    assert fake.requests[1].body["messages"][1]["content"][1]["id"] == calls[1].id


def test_anthropic_stream_accumulates_into_the_message_create_answers() -> None:
    script = [
        Turn.tool_calls(("get_order", {"order_id": "A1", "note": "x" * 40}), text="Let me look that up.")
    ]
    with FakeModelServer(script) as fake:
        client = claude(fake)
        created = client.messages.create(model="m", max_tokens=100, messages=ASK)
        with client.messages.stream(model="m", max_tokens=100, messages=ASK) as stream:
            pieces = list(stream.text_stream)
            streamed = stream.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces) == "Let me look that up."
    assert fake.requests[1].stream
    assert fake.requests[1].digest != fake.requests[0].digest

    def without_ids(message: anthropic.types.Message) -> dict[str, Any]:
        data = message.to_dict()
        data.pop("id")
        for block in data["content"]:
            block.pop("id", None)
        return data

    assert without_ids(streamed) == without_ids(created)
    assert streamed.content[1].input == {"order_id": "A1", "note": "x" * 40}


def test_anthropic_async_stream_and_create() -> None:
    async def talk(fake: FakeModelServer) -> tuple[Any, Any]:
        client = AsyncAnthropic(api_key=KEY, base_url=fake.url, max_retries=0)
        async with client.messages.stream(model="m", max_tokens=50, messages=ASK) as stream:
            streamed = await stream.get_final_message()
        created = await client.messages.create(model="m", max_tokens=50, messages=claude_history(streamed))
        return streamed, created

    with FakeModelServer(SCRIPT) as fake:
        streamed, created = asyncio.run(talk(fake))
    assert [b.name for b in streamed.content if b.type == "tool_use"] == ["get_order", "refund"]
    assert streamed.stop_reason == "tool_use"
    assert streamed.usage.output_tokens > 1
    assert created.content[0].text == "Refunded the order."
    assert fake.requests_per_turn() == {0: 1, 1: 1}


def test_anthropic_parse_and_the_beta_path() -> None:
    with FakeModelServer(lambda request: Turn.text(ORDER_JSON)) as fake:
        client = claude(fake)
        parsed = client.messages.parse(model="m", max_tokens=50, messages=ASK, output_format=Order)
        with client.messages.stream(model="m", max_tokens=50, messages=ASK, output_format=Order) as stream:
            streamed = stream.get_final_message()
        beta = client.beta.messages.create(
            model="m", max_tokens=50, messages=ASK, betas=["files-api-2025-04-14"]
        )
        # the Claude Code CLI asks with ?beta=true
        cli = client.beta.messages.create(
            model="m", max_tokens=50, messages=ASK, extra_query={"beta": "true"}
        )
    assert parsed.parsed_output == streamed.parsed_output == Order(order_id="A1", refunded=True)
    assert fake.requests[0].body["output_config"]["format"]["type"] == "json_schema"
    assert beta.content[0].text == cli.content[0].text == ORDER_JSON
    assert [r.path for r in fake.requests[2:]] == ["/v1/messages", "/v1/messages?beta=true"]
    assert fake.requests[2].headers["anthropic-beta"] == "files-api-2025-04-14"
    assert {r.api for r in fake.requests} == {"anthropic"}


@pytest.mark.parametrize(
    ("turn", "stop_reason"),
    [
        (Turn.stop("pause_turn"), "pause_turn"),
        (Turn.stop("max_tokens", "Half an ans"), "max_tokens"),
        (Turn.stop("length"), "max_tokens"),
        (Turn.stop("refusal"), "refusal"),
        (Turn.stop("model_context_window_exceeded"), "model_context_window_exceeded"),
        (Turn.stop("brand_new_reason"), "brand_new_reason"),
    ],
)
def test_anthropic_special_stops(turn: Turn, stop_reason: str) -> None:
    with FakeModelServer([turn]) as fake:
        client = claude(fake)
        message = client.messages.create(model="m", max_tokens=5, messages=ASK)
        with client.messages.stream(model="m", max_tokens=5, messages=ASK) as stream:
            streamed = stream.get_final_message()
    for reply in (message, streamed):
        assert reply.stop_reason == stop_reason
        assert [b.text for b in reply.content if b.type == "text"] == ([turn.content] if turn.content else [])
    assert (message.stop_details is not None) == (stop_reason == "refusal")


def test_pause_turn_sent_back_is_the_next_turn() -> None:
    with FakeModelServer([Turn.stop("pause_turn"), Turn.text("Done.")]) as fake:
        client = claude(fake)
        paused = client.messages.create(model="m", max_tokens=5, messages=ASK)
        again = [*ASK, {"role": "assistant", "content": paused.to_dict()["content"]}]
        done = client.messages.create(model="m", max_tokens=5, messages=again)
    assert (paused.stop_reason, paused.content) == ("pause_turn", [])
    assert done.content[0].text == "Done."
    assert fake.requests[1].turn == 1


def test_anthropic_orphan_tool_use_is_answered_400_as_the_api_does() -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = claude(fake)
        first = client.messages.create(model="m", max_tokens=5, messages=ASK)
        history = claude_history(first)
        history[2]["content"] = history[2]["content"][:1]  # the refund's result went missing
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="m", max_tokens=5, messages=history)
        stray = [
            *ASK,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]},
        ]
        with pytest.raises(anthropic.BadRequestError) as unexpected:
            client.messages.create(model="m", max_tokens=5, messages=stray)
    assert refused.value.status_code == 400
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert "`tool_use` ids were found without `tool_result` blocks immediately after" in error["message"]
    assert first.content[1].id in error["message"]  # type: ignore[union-attr]
    assert "unexpected `tool_use_id`" in str(unexpected.value)
    assert fake.orphans == fake.requests[1:]


# ---- OpenAI Chat Completions ----


def test_chat_create_answers_tool_calls_then_text() -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = gpt(fake)
        first = client.chat.completions.create(model="gpt-test", messages=ASK)
        second = client.chat.completions.create(model="gpt-test", messages=chat_history(first))
    assert first.id.startswith("chatcmpl-")
    assert first.object == "chat.completion"
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("get_order", {"order_id": "A1"}),
        ("refund", {"order_id": "A1", "cents": 500}),
    ]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    assert first.usage is not None
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "Refunded the order."
    assert [(r.api, r.turn) for r in fake.requests] == [("chat", 0), ("chat", 1)]
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_chat_stream_accumulates_into_the_completion_with_usage_when_asked() -> None:
    script = [
        Turn.tool_calls(("get_order", {"order_id": "A1", "why": "a long reason " * 3}), text="Checking now.")
    ]
    with FakeModelServer(script) as fake:
        client = gpt(fake)
        created = client.chat.completions.create(model="m", messages=ASK)
        options: Any = {"include_usage": True}
        with client.chat.completions.stream(model="m", messages=ASK, stream_options=options) as stream:
            kinds = [event.type for event in stream]
            streamed = stream.get_final_completion()
        with client.chat.completions.stream(model="m", messages=ASK) as stream:
            unmetered = stream.get_final_completion()
    assert kinds.count("content.delta") > 1
    assert "tool_calls.function.arguments.done" in kinds
    message, expected = streamed.choices[0].message, created.choices[0].message
    assert message.content == expected.content == "Checking now."
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        (c.function.name, c.function.arguments)  # type: ignore[union-attr]
        for c in expected.tool_calls or []
    ]
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert streamed.usage is not None
    assert streamed.usage.completion_tokens == created.usage.completion_tokens
    assert unmetered.usage is None  # as the API: usage streams only with include_usage


def test_chat_async_stream_and_parse() -> None:
    async def talk(fake: FakeModelServer) -> tuple[Any, Any]:
        client = AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)
        async with client.chat.completions.stream(model="m", messages=ASK) as stream:
            streamed = await stream.get_final_completion()
        parsed = await client.chat.completions.parse(
            model="m", messages=chat_history(streamed), response_format=Order
        )
        return streamed, parsed

    with FakeModelServer([TWO_CALLS, Turn.text(ORDER_JSON)]) as fake:
        streamed, parsed = asyncio.run(talk(fake))
    assert [c.function.name for c in streamed.choices[0].message.tool_calls] == ["get_order", "refund"]
    assert parsed.choices[0].message.parsed == Order(order_id="A1", refunded=True)
    assert fake.requests[1].body["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize(
    ("turn", "finish_reason"),
    [
        (Turn.stop("length"), "length"),
        (Turn.stop("max_tokens"), "length"),
        (Turn.stop("refusal"), "content_filter"),
    ],
)
def test_chat_special_stops(turn: Turn, finish_reason: str) -> None:
    with FakeModelServer([turn]) as fake:
        client = gpt(fake)
        created = client.chat.completions.create(model="m", messages=ASK)
        # the SDK's stream helper raises on these endings, the completion in the error
        endings = (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)
        with (
            pytest.raises(endings) as ended,
            client.chat.completions.stream(model="m", messages=ASK) as stream,
        ):
            stream.get_final_completion()
    streamed = ended.value.completion
    assert created.choices[0].finish_reason == streamed.choices[0].finish_reason == finish_reason


def test_chat_orphan_tool_call_is_answered_400() -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = gpt(fake)
        first = client.chat.completions.create(model="m", messages=ASK)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="m", messages=chat_history(first)[:-1])
        stray = [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "?"}]
        with pytest.raises(openai.BadRequestError) as unexpected:
            client.chat.completions.create(model="m", messages=stray)  # type: ignore[arg-type]
    missing = first.choices[0].message.tool_calls[1].id  # type: ignore[index]
    assert refused.value.body["message"].endswith(f"did not have response messages: {missing}")  # type: ignore[index]
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert "must be a response to a preceeding message with 'tool_calls'" in unexpected.value.message
    assert len(fake.orphans) == 2


# ---- OpenAI Responses ----


def test_responses_create_answers_function_calls_then_text() -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = gpt(fake)
        first = client.responses.create(model="gpt-test", input=ASK)  # type: ignore[arg-type]
        second = client.responses.create(model="gpt-test", input=responses_history(first))  # type: ignore[arg-type]
    assert first.id.startswith("resp_")
    assert first.status == "completed"
    calls = [i for i in first.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_order", {"order_id": "A1"}),
        ("refund", {"order_id": "A1", "cents": 500}),
    ]
    assert all(c.id.startswith("fc_") and c.call_id.startswith("call_") for c in calls)  # type: ignore[union-attr]
    assert calls[0].to_dict()["async"] is False  # the wire name, kept by to_dict
    assert first.usage is not None
    assert first.usage.total_tokens > 0
    assert second.output_text == "Refunded the order."
    assert [(r.api, r.turn) for r in fake.requests] == [("responses", 0), ("responses", 1)]


def test_responses_stream_events_carry_sequence_numbers_and_accumulate() -> None:
    script = [Turn.tool_calls(("get_order", {"order_id": "A1"}), text="One moment please.")]
    with FakeModelServer(script) as fake:
        client = gpt(fake)
        created = client.responses.create(model="m", input="hi")
        with client.responses.stream(model="m", input="hi") as stream:
            events = list(stream)
            streamed = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert sum(e.type == "response.output_text.delta" for e in events) > 1
    assert streamed.output_text == created.output_text == "One moment please."
    [call] = [i for i in streamed.output if i.type == "function_call"]
    assert (call.name, call.arguments) == ("get_order", '{"order_id":"A1"}')
    assert streamed.usage == created.usage


def test_responses_async_stream_and_parse() -> None:
    async def talk(fake: FakeModelServer) -> tuple[Any, Any]:
        client = AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)
        async with client.responses.stream(model="m", input="hi") as stream:
            streamed = await stream.get_final_response()
        parsed = await client.responses.parse(model="m", input=responses_history(streamed), text_format=Order)
        return streamed, parsed

    with FakeModelServer([TWO_CALLS, Turn.text(ORDER_JSON)]) as fake:
        streamed, parsed = asyncio.run(talk(fake))
    assert [i.name for i in streamed.output if i.type == "function_call"] == ["get_order", "refund"]
    assert parsed.output_parsed == Order(order_id="A1", refunded=True)
    assert fake.requests_per_turn("responses") == {0: 1, 1: 1}


def test_responses_incomplete_ending() -> None:
    with FakeModelServer([Turn.stop("max_tokens", "Cut sh")]) as fake:
        client = gpt(fake)
        response = client.responses.create(model="m", input="hi")
        with client.responses.stream(model="m", input="hi") as stream:
            last = list(stream)[-1]
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # type: ignore[union-attr]
    assert response.output_text == "Cut sh"
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


def test_responses_orphans_and_previous_response_id() -> None:
    with FakeModelServer([TWO_CALLS, Turn.text("Done."), Turn.text("More.")]) as fake:
        client = gpt(fake)
        first = client.responses.create(model="m", input="hi")
        with pytest.raises(openai.BadRequestError) as missing:
            client.responses.create(model="m", input=responses_history(first)[:-1])  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as unasked:
            client.responses.create(model="m", previous_response_id=first.id, input="next")
        outputs = responses_history(first)[-2:]
        chained = client.responses.create(model="m", previous_response_id=first.id, input=outputs)  # type: ignore[arg-type]
        third = client.responses.create(model="m", previous_response_id=chained.id, input="and?")
        with pytest.raises(openai.BadRequestError) as unknown:
            client.responses.create(model="m", previous_response_id="resp_nope", input="x")
    last_call = [i for i in first.output if i.type == "function_call"][-1].call_id  # type: ignore[union-attr]
    assert missing.value.body["message"] == f"No tool output found for function call {last_call}."  # type: ignore[index]
    assert "No tool output found" in unasked.value.message
    assert (chained.output_text, third.output_text) == ("Done.", "More.")
    assert [r.turn for r in fake.requests[3:5]] == [1, 2]
    assert unknown.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert fake.orphans == fake.requests[1:3]


# ---- faults ----


def test_a_429_then_200_is_one_successful_call_with_retry_count_0_then_1() -> None:
    with FakeModelServer(lambda request: Turn.text("ok")) as fake:
        fake.fail(429, retry_after=0.01)
        message = claude(fake, retries=1).messages.create(model="m", max_tokens=5, messages=ASK)
        fake.fail(429, retry_after=0.01)
        completion = gpt(fake, retries=1).chat.completions.create(model="m", messages=ASK)
    assert message.content[0].text == completion.choices[0].message.content == "ok"  # type: ignore[union-attr]
    assert [(r.api, r.retry_count) for r in fake.requests] == [
        ("anthropic", 0),
        ("anthropic", 1),
        ("chat", 0),
        ("chat", 1),
    ]
    assert fake.repeated() == [fake.requests[1], fake.requests[3]]


@pytest.mark.parametrize(
    ("status", "error_class", "error_type"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_anthropic_error_answers_carry_the_api_error_body_and_retry_after(
    status: int, error_class: type[anthropic.APIStatusError], error_type: str
) -> None:
    with FakeModelServer([Turn.text("ok")]) as fake:
        fake.fail(status, retry_after=2.5)
        with pytest.raises(error_class) as failed:
            claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
    error = failed.value
    assert error.status_code == status
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == error_type
    assert error.response.headers["retry-after"] == "3"
    assert error.response.headers["retry-after-ms"] == "2500"
    assert error.request_id is not None
    assert error.request_id.startswith("req_")


@pytest.mark.parametrize(("status", "code"), [(429, "rate_limit_exceeded"), (500, None), (503, None)])
def test_openai_error_answers_carry_the_api_error_body(status: int, code: str | None) -> None:
    with FakeModelServer([Turn.text("ok")]) as fake:
        fake.fail(status, retry_after=None, api="responses")
        with pytest.raises(openai.APIStatusError) as failed:
            gpt(fake).responses.create(model="m", input="hi")
        unaffected = gpt(fake).chat.completions.create(model="m", messages=ASK)
    assert failed.value.status_code == status
    assert failed.value.code == code
    assert "retry-after" not in failed.value.response.headers
    assert unaffected.choices[0].message.content == "ok"


def test_faults_match_by_turn_and_count() -> None:
    with FakeModelServer(SCRIPT) as fake:
        fake.fail(500, retry_after=0.01, turn=1, times=2)
        client = claude(fake, retries=2)
        first = client.messages.create(model="m", max_tokens=5, messages=ASK)  # turn 0: no fault
        second = client.messages.create(model="m", max_tokens=5, messages=claude_history(first))
    assert second.content[0].text == "Refunded the order."  # type: ignore[union-attr]
    assert [(r.turn, r.retry_count) for r in fake.requests] == [(0, 0), (1, 0), (1, 1), (1, 2)]
    assert fake.requests_per_turn() == {0: 1, 1: 3}


def test_a_dropped_reply_is_generated_then_lost() -> None:
    with FakeModelServer(SCRIPT) as fake:
        fake.drop()
        with pytest.raises(anthropic.APIConnectionError):
            claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
        fake.drop(api="chat")
        retried = gpt(fake, retries=1).chat.completions.create(model="m", messages=ASK)
    assert retried.choices[0].finish_reason == "tool_calls"
    assert [r.api for r in fake.requests] == ["anthropic", "chat", "chat"]
    assert fake.repeated() == [fake.requests[2]]  # the same question, asked again


def test_a_cut_stream_raises_in_every_sdk() -> None:
    async def async_cuts(fake: FakeModelServer) -> list[BaseException]:
        raised: list[BaseException] = []
        for stream in (
            AsyncAnthropic(api_key=KEY, base_url=fake.url, max_retries=0).messages.stream(
                model="m", max_tokens=5, messages=ASK
            ),
            AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0).responses.stream(
                model="m", input="hi"
            ),
        ):
            fake.cut_stream(after_events=3)
            try:
                async with stream as events:
                    async for _ in events:
                        pass
            except Exception as exc:
                raised.append(exc)
        return raised

    with FakeModelServer(lambda request: TWO_CALLS) as fake:
        fake.cut_stream(after_events=4)
        with (
            pytest.raises(ANTHROPIC_CUT) as cut,
            claude(fake).messages.stream(model="m", max_tokens=5, messages=ASK) as stream,
        ):
            stream.get_final_message()
        assert transient_failure(cut.value) is not None  # what safepoint tries again
        fake.cut_stream(after_events=2, api="chat")
        with (
            pytest.raises(openai.APIConnectionError),
            gpt(fake).chat.completions.stream(model="m", messages=ASK) as chat,
        ):
            chat.get_final_completion()
        not_streamed = gpt(fake).responses.create(model="m", input="hi")  # a cut waits for a stream
        raised = asyncio.run(async_cuts(fake))
        fake.cut_stream(after_events=100)  # past the end: still no proper end of the body
        with (
            pytest.raises(openai.APIConnectionError),
            gpt(fake).responses.stream(model="m", input="hi") as whole,
        ):
            whole.get_final_response()
    assert not_streamed.status == "completed"
    assert len(raised) == 2, raised
    assert isinstance(raised[0], ANTHROPIC_CUT), raised
    assert isinstance(raised[1], openai.APIConnectionError), raised


def test_a_slow_answer_runs_into_the_client_timeout() -> None:
    with FakeModelServer(lambda request: Turn.text("late")) as fake:
        fake.slow(2.0, times=1)
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            gpt(fake).with_options(timeout=0.2).chat.completions.create(model="m", messages=ASK)
        assert time.monotonic() - started < 1.5
        fake.slow(0.2)
        started = time.monotonic()
        answered = claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
        waited = time.monotonic() - started
    assert answered.content[0].text == "late"
    assert waited >= 0.2


def test_on_request_sees_each_request_before_it_is_answered() -> None:
    seen: list[tuple[int, int]] = []
    with FakeModelServer(SCRIPT) as fake:

        @fake.on_request
        def note(request: FakeRequest) -> None:
            seen.append((request.turn, len(fake.requests)))

        first = claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
        claude(fake).messages.create(model="m", max_tokens=5, messages=claude_history(first))
    assert seen == [(0, 1), (1, 2)]


def test_a_callback_that_raises_has_the_request_answered_500() -> None:
    fake = FakeModelServer([Turn.text("never")])

    def broken(request: FakeRequest) -> None:
        raise RuntimeError("boom")

    def ask(fake: FakeModelServer) -> None:
        with pytest.raises(openai.InternalServerError, match="boom"):
            gpt(fake).responses.create(model="m", input="hi")

    fake.on_request(broken)
    with pytest.raises(UsageError, match="on_request callback raised RuntimeError"), fake:
        ask(fake)
    assert len(fake.requests) == 1


# ---- the script, ids and the log ----


def test_ids_are_derived_from_the_request_unless_fresh() -> None:
    with FakeModelServer(SCRIPT) as fake:
        one, two = (claude(fake).messages.create(model="m", max_tokens=5, messages=ASK) for _ in range(2))
        other = claude(fake).messages.create(model="m", max_tokens=6, messages=ASK)
    assert one.to_dict() == two.to_dict()
    assert other.id != one.id
    assert other.content[0].id != one.content[0].id
    assert len(fake.repeated()) == 1
    with FakeModelServer(SCRIPT, ids="fresh") as fake:
        first, second = (gpt(fake).responses.create(model="m", input="hi") for _ in range(2))
    assert first.id != second.id
    assert first.output[0].call_id != second.output[0].call_id  # type: ignore[union-attr]


def test_a_callable_script_sees_the_request() -> None:
    def script(request: FakeRequest) -> Turn:
        return Turn.text(f"{request.api} turn {request.turn} of {request.body['model']}")

    with FakeModelServer(script) as fake:
        text = gpt(fake).responses.create(model="gpt-x", input="hi").output_text
    assert text == "responses turn 0 of gpt-x"


def test_a_script_that_cannot_answer_is_a_500_and_an_error_on_leaving() -> None:
    def past_the_script(fake: FakeModelServer) -> None:
        with pytest.raises(openai.InternalServerError, match="Anthropic's alone"):
            gpt(fake, retries=2).chat.completions.create(model="m", messages=ASK)
        paused = claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
        assert paused.stop_reason == "pause_turn"
        resumed = [*ASK, {"role": "assistant", "content": "paused"}, {"role": "user", "content": "go on"}]
        with pytest.raises(anthropic.InternalServerError, match="no turn 1"):
            claude(fake).messages.create(model="m", max_tokens=5, messages=resumed)

    fake = FakeModelServer([Turn.stop("pause_turn")])
    with pytest.raises(UsageError, match=r"script could not answer.*no turn 1"), fake:
        past_the_script(fake)
    assert len(fake.requests) == 3  # x-should-retry: false, so no retries of a script problem
    assert fake.problems[1] == "the script has no turn 1 (it has 1) to answer this anthropic request"


def test_misuse_is_refused_with_a_usage_error() -> None:
    with pytest.raises(UsageError, match="at least one"):
        Turn.tool_calls()
    with pytest.raises(UsageError, match="pair"):
        Turn.tool_calls("get_order")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="list of Turn"):
        FakeModelServer("hello")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not 'hello'"):
        FakeModelServer(["hello"])  # type: ignore[list-item]
    fake = FakeModelServer([])
    with pytest.raises(UsageError, match="start the FakeModelServer"):
        _ = fake.url
    with pytest.raises(UsageError, match="api is one of"):
        fake.fail(429, api="gemini")
    with pytest.raises(UsageError, match="400-599"):
        fake.fail(200)


def test_reset_forgets_the_log_and_the_faults() -> None:
    with FakeModelServer([Turn.text("ok")]) as fake:
        fake.fail(500, times=None)
        with pytest.raises(anthropic.InternalServerError):
            claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
        fake.reset()
        answered = claude(fake).messages.create(model="m", max_tokens=5, messages=ASK)
    assert answered.content[0].text == "ok"  # type: ignore[union-attr]
    assert len(fake.requests) == 1


def test_unknown_paths_and_bad_bodies_answer_as_the_api_would() -> None:
    with FakeModelServer([Turn.text("ok")]) as fake:
        with pytest.raises(openai.NotFoundError):
            gpt(fake).embeddings.create(model="m", input="hi")
        body = {"model": "m", "messages": ASK}  # no max_tokens
        with pytest.raises(anthropic.BadRequestError, match="max_tokens: Field required"):
            claude(fake).post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert [r.api for r in fake.requests] == ["anthropic"]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/messages", {"anthropic-version": "2023-06-01"}),
        ("/v1/chat/completions", {}),
        ("/v1/responses", {}),
    ],
)
def test_a_body_nested_too_deeply_to_read_is_answered_400_as_the_api_would(
    path: str, headers: dict[str, str]
) -> None:
    """Python's decoder raises RecursionError, not ValueError, past its depth; at the edge, the
    body decodes and its digest (the body written again) may not. Whatever the depth an answer
    comes: the API's 400 for a body it cannot read, the turn for one it can."""
    with FakeModelServer([Turn.text("ok")]) as fake:
        host = fake.url.removeprefix("http://")
        for depth in (100_000, *range(960, 1001, 4)):
            nested = "[" * depth + "]" * depth
            body = f'{{"model": "m", "max_tokens": 5, "messages": {nested}}}'.encode()
            conn = http.client.HTTPConnection(host, timeout=10)
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
                response = conn.getresponse()
                status, text = response.status, response.read()
            finally:
                conn.close()
            assert status in (200, 400), (depth, text[:200])
            if status == 400 or depth >= 1000:
                assert status == 400
                assert json.loads(text)["error"]["message"] == "The request body is not a JSON object."
        assert fake.problems == []


def test_the_fake_imports_without_either_sdk() -> None:
    code = (
        "import sys; sys.modules.update(anthropic=None, openai=None, pydantic=None, httpx2=None)\n"
        "from safepoint.testing import FakeModelServer, Turn\n"
        "import urllib.request, json\n"
        "with FakeModelServer([Turn.text('hi')]) as fake:\n"
        "    body = json.dumps({'model': 'm', 'messages': []}).encode()\n"
        "    req = urllib.request.Request(fake.openai_url + '/chat/completions', body)\n"
        "    print(json.load(urllib.request.urlopen(req))['choices'][0]['message']['content'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30
    )
    assert (done.returncode, done.stdout.strip()) == (0, "hi"), done.stderr
