"""The I/O-free parts of the OpenAI integration: how a call splits into what is hashed and what
is passed through, which failures are tried again, the events a recorded reply is replayed as
(checked against the SDK's own accumulators), and the turns sent back."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pydantic
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

import safepoint as sp
from safepoint.errors import TransientFailure, UsageError
from safepoint.integrations import openai as spo
from safepoint.integrations._openai_chat import ended, plain_completion
from safepoint.integrations._openai_requests import UNHASHED, failure, prepare, refuse_server_state
from safepoint.integrations._openai_responses import plain_response
from safepoint.integrations._openai_streams import completion_chunks, response_events

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": "Looking it up.",
                "refusal": None,
                "annotations": [],
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"a":1}'},
                    },
                    {"id": "call_2", "type": "function", "function": {"name": "refund", "arguments": "{}"}},
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}
RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-test",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking it up.", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_order",
            "arguments": '{"a":1}',
            "status": "completed",
            "async": True,
        },
    ],
    "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
}


class Order(pydantic.BaseModel):
    order_id: str


# -- the fingerprint ---------------------------------------------------------------------------


def test_a_chat_call_hashes_what_it_asks_and_passes_the_rest_through() -> None:
    asked = {"temperature": 0.2, "seed": 7, "tool_choice": "auto", "max_completion_tokens": 99, "n": 1}
    carried = {name: f"{name}-value" for name in UNHASHED - {"parse_as"}}
    prepared = prepare(
        "chat", {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], **asked, **carried}
    )
    assert prepared.params == asked
    assert prepared.messages == [{"role": "user", "content": "hi"}]
    assert set(prepared.live) == {"model", *asked, *carried}  # the conversation arrives from the engine
    assert prepared.call_kwargs(["the", "list"])["messages"] == ["the", "list"]


def test_a_format_class_is_hashed_as_the_schema_it_sends() -> None:
    chat = prepare("chat", {"model": "m", "messages": [], "response_format": Order})
    assert chat.params["response_format"]["type"] == "json_schema"
    assert chat.params["response_format"]["json_schema"]["name"] == "Order"
    assert chat.live["response_format"] is Order  # the SDK gets the class, to parse with
    responses = prepare(
        "responses", {"model": "m", "input": "hi", "text": {"verbosity": "low"}, "text_format": Order}
    )
    assert responses.params["text"]["verbosity"] == "low"
    assert responses.params["text"]["format"]["schema"]["properties"] == {
        "order_id": {"title": "Order Id", "type": "string"}
    }
    assert "text_format" not in responses.params


def test_sdk_objects_and_iterators_become_json_once() -> None:
    message = ChatCompletion.construct(**COMPLETION).choices[0].message
    tools = iter([{"type": "function", "function": {"name": "f", "parameters": {}}}])
    prepared = prepare("chat", {"model": "m", "messages": [message], "tools": tools})
    assert prepared.messages[0]["tool_calls"][0]["id"] == "call_1"
    assert prepared.tools == [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert prepared.live["tools"] == prepared.tools
    transcript = sp.Transcript([{"role": "user", "content": "hi"}])
    assert prepare("chat", {"model": "m", "messages": transcript}).messages is transcript


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": []},
        {"model": 4, "messages": []},
        {"model": "m", "messages": "hi"},
        {"model": "m", "messages": [], "tools": {}},
    ],
)
def test_a_malformed_call_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        prepare("chat", kwargs)


def test_server_state_is_refused_unless_opted_in() -> None:
    for held in (
        {"conversation": {"id": "conv_1"}},
        {"previous_response_id": "resp_1"},
        {"background": True},
    ):
        with pytest.raises(UsageError) as refused:
            refuse_server_state("responses", held, server_state=False)
        assert "responses_tool_loop" in refused.value.message
        refuse_server_state("responses", held, server_state=True)
    refuse_server_state("responses", {"background": False, "previous_response_id": None}, server_state=False)
    refuse_server_state("chat", {"store": True}, server_state=False)


# -- failures ------------------------------------------------------------------------------------


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(
        status, headers=headers or {}, request=request, json={"error": {"message": "no"}}
    )
    return openai.APIStatusError("no", response=response, body=None)


@pytest.mark.parametrize(
    ("error", "retried", "after"),
    [
        (status_error(429, {"retry-after": "2"}), True, 2.0),
        (status_error(500), True, None),
        (status_error(529, {"retry-after-ms": "1500"}), True, 1.5),
        (status_error(408), True, None),
        (status_error(400), False, None),
        (status_error(400, {"x-should-retry": "true"}), True, None),
        (status_error(503, {"x-should-retry": "false"}), False, None),
        (openai.APIConnectionError(request=httpx2.Request("POST", "http://127.0.0.1")), True, None),
        (openai.APITimeoutError(request=httpx2.Request("POST", "http://127.0.0.1")), True, None),
        (httpx2.RemoteProtocolError("peer closed connection"), True, None),
        (ValueError("not the SDK's"), False, None),
    ],
)
def test_which_failures_are_tried_again(error: Exception, retried: bool, after: float | None) -> None:
    found = failure(error)
    assert isinstance(found, TransientFailure) is retried
    if retried:
        assert isinstance(found, TransientFailure)
        assert found.retry_after == after
    else:
        assert found is error


def test_a_stream_that_stopped_before_its_end_is_a_failed_attempt() -> None:
    unfinished = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": None}]}
    with pytest.raises(TransientFailure):
        ended(unfinished)
    with pytest.raises(TransientFailure):
        ended({**COMPLETION, "choices": []})
    assert ended(COMPLETION) is COMPLETION
    failed = {**RESPONSE, "status": "failed", "error": {"code": "server_error", "message": "boom"}}
    with pytest.raises(TransientFailure):
        plain_response(Response.construct(**failed))
    refused = {**RESPONSE, "status": "failed", "error": {"code": "invalid_prompt", "message": "no"}}
    assert plain_response(Response.construct(**refused))["status"] == "failed"


# -- the record and the events replayed from it --------------------------------------------------


def test_a_completion_round_trips_through_its_record() -> None:
    rebuilt = ChatCompletion.construct(**COMPLETION)
    assert rebuilt.to_dict(mode="json") == COMPLETION
    parsed = openai.lib._parsing.parse_chat_completion(
        response_format=openai.omit, input_tools=openai.omit, chat_completion=rebuilt
    )
    recorded = plain_completion(parsed)
    assert "parsed" not in recorded["choices"][0]["message"]
    assert all(
        "parsed_arguments" not in c["function"] for c in recorded["choices"][0]["message"]["tool_calls"]
    )


def test_the_chunks_of_a_completion_add_up_to_it_through_the_sdk() -> None:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    kinds = [event.type for chunk in completion_chunks(COMPLETION) for event in state.handle_chunk(chunk)]
    added_up = plain_completion(state.current_completion_snapshot)
    (choice,) = added_up["choices"]
    expected = COMPLETION["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", "Looking it up.")
    assert choice["message"]["tool_calls"] == expected["message"]["tool_calls"]
    assert {k: added_up[k] for k in ("id", "created", "model", "usage")} == {
        k: COMPLETION[k] for k in ("id", "created", "model", "usage")
    }
    assert kinds.count("content.delta") == 1
    assert kinds.count("content.done") == 1
    assert kinds.count("tool_calls.function.arguments.done") == 2


def test_the_events_of_a_response_add_up_to_it_through_the_sdk() -> None:
    events = response_events(RESPONSE)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (events[0].type, events[-1].type) == ("response.created", "response.completed")
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    seen = [event for raw in events for event in state.handle_event(raw)]
    deltas = [
        e.delta
        for e in seen
        if e.type in ("response.output_text.delta", "response.function_call_arguments.delta")
    ]
    assert deltas == ["Looking it up.", '{"a":1}']
    completed = seen[-1].response  # type: ignore[union-attr]
    assert plain_response(completed) == RESPONSE
    incomplete = {**RESPONSE, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert response_events(incomplete)[-1].type == "response.incomplete"


# -- the turns sent back ---------------------------------------------------------------------------


def test_a_chat_turn_is_the_assistant_message_an_input_takes() -> None:
    turn = spo.chat_turn(ChatCompletion.construct(**COMPLETION))
    assert turn == {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": COMPLETION["choices"][0]["message"]["tool_calls"],
    }
    audio = {
        **COMPLETION["choices"][0]["message"],
        "content": None,
        "tool_calls": None,
        "audio": {"id": "au_1", "data": "…"},
    }
    spoken = ChatCompletion.construct(
        **{**COMPLETION, "choices": [{**COMPLETION["choices"][0], "message": audio}]}
    )
    assert spo.chat_turn(spoken) == {"role": "assistant", "audio": {"id": "au_1"}}
    with pytest.raises(UsageError):
        spo.chat_turn(ChatCompletion.construct(**{**COMPLETION, "choices": []}))


def test_response_items_keep_the_wire_names() -> None:
    items = spo.response_items(Response.construct(**RESPONSE))
    assert items == RESPONSE["output"]
    assert items[1]["async"] is True
    calls = spo.response_tool_calls(Response.construct(**RESPONSE))
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [("call_1", "get_order", '{"a":1}')]
