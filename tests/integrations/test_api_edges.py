"""The SDK integrations at the edges of what the APIs send: a `retry-after` that is no number and
no date, a server error inside a 200 stream, a stream that stops before the message did,
encrypted reasoning that happens to look like a key, and a user's `Retry` that must not turn a
400 into a retry loop."""

from __future__ import annotations

import base64
import contextlib
import json
import random
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import openai

import safepoint as sp
from safepoint.errors import StepAttemptsExhausted, StepFailed, TransientFailure
from safepoint.integrations import anthropic as spa
from safepoint.integrations import openai as spo
from safepoint.integrations.tools import Tools

KEY = "sk-test-fake"
FAST = sp.Retry(attempts=3, backoff=0.01, max_backoff=0.05)
# Only what the integration says is transient: the default policy's retry_on.
TRANSIENT_ONLY = sp.Retry(attempts=3, backoff=0.01, max_backoff=0.05, retry_on=(TransientFailure,))


class Scripted:
    """An HTTP transport answering each request with the next scripted response (a function
    of the request's JSON body), recording the bodies it was sent."""

    def __init__(self, *answers: Callable[[dict[str, Any]], httpx2.Response]) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content or b"{}")
        self.bodies.append(body)
        answer = self.answers[min(len(self.bodies), len(self.answers)) - 1]
        return answer(body)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            api_key=KEY,
            base_url="http://mock.invalid",
            http_client=httpx2.Client(transport=httpx2.MockTransport(self)),
        )

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=KEY,
            base_url="http://mock.invalid/v1",
            http_client=httpx2.Client(transport=httpx2.MockTransport(self)),
        )


def anthropic_message(text: str = "done", **extra: Any) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
        **extra,
    }


def json_reply(payload: Any, status: int = 200, headers: dict[str, str] | None = None):
    return lambda body: httpx2.Response(status, json=payload, headers=headers or {})


# -- 1. a bad Retry-After header makes a retryable failure permanent ------------------------------


def test_an_unusable_retry_after_still_leaves_a_429_retryable(file_store: sp.Store) -> None:
    overloaded = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    server = Scripted(
        json_reply(overloaded, 429, {"retry-after": "soon"}),  # not a number, not an HTTP date
        json_reply(anthropic_message("hello")),
    )
    claude_client = server.anthropic()

    @sp.workflow("bad-retry-after")
    def ask(run: sp.Run) -> str:
        claude = spa.bind(run, claude_client, retry=TRANSIENT_ONLY)
        reply = claude.messages.create(
            model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        return reply.content[0].text

    # Expected: the 429 is a recorded attempt, the second attempt answers "hello".
    assert sp.start(file_store, ask, run_id="r", lease_ms=0) == "hello"


# -- 2. a user's Retry turns a 400 into a retry loop, then a "resumable" stop -----------------------


def test_a_retry_given_to_bind_still_records_a_400_as_the_steps_failure(file_store: sp.Store) -> None:
    bad = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long"}}
    server = Scripted(json_reply(bad, 400))
    claude_client = server.anthropic()

    @sp.workflow("retry-a-400")
    def ask(run: sp.Run) -> str:
        claude = spa.bind(run, claude_client, retry=sp.Retry(attempts=3, backoff=0.01))
        try:
            claude.messages.create(
                model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
        except StepFailed as failed:
            return f"failed: {failed.error_type}"
        return "answered"

    # Documented: "Any other failure (a 400) is the step's recorded failure: StepFailed".
    result = None
    with contextlib.suppress(StepAttemptsExhausted):  # what a retried 400 would end in
        result = sp.start(file_store, ask, run_id="r", lease_ms=0)
    assert len(server.bodies) == 1, f"a 400 was sent {len(server.bodies)} times"
    assert result == "failed: BadRequestError"


# -- 3. an error event in a Chat Completions stream is not retried -----------------------------


def _sse(*events: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def _chunk(**delta: Any) -> dict[str, Any]:
    finish = delta.pop("finish", None)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_a_server_error_event_mid_chat_stream_is_retried(file_store: sp.Store) -> None:
    # OpenAI sends {"error": {...}} mid-stream when the server fails after the 200 — the same
    # transient failure as a 500 before it; the SDK raises a bare openai.APIError for it.
    broken = _sse(
        _chunk(role="assistant", content="Hel"),
        {
            "error": {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
            }
        },
        done=False,
    )
    whole = _sse(_chunk(role="assistant", content="Hello"), _chunk(finish="stop"))
    sse = {"content-type": "text/event-stream"}
    server = Scripted(
        lambda body: httpx2.Response(200, headers=sse, content=broken),
        lambda body: httpx2.Response(200, headers=sse, content=whole),
    )
    gpt_client = server.openai()

    @sp.workflow("chat-stream-error-event")
    def ask(run: sp.Run) -> str:
        gpt = spo.bind(run, gpt_client, retry=TRANSIENT_ONLY)
        with gpt.chat.completions.stream(model="gpt-test", messages=[{"role": "user", "content": "hi"}]) as s:
            return str(s.get_final_completion().choices[0].message.content)

    assert sp.start(file_store, ask, run_id="r", lease_ms=0) == "Hello"


# -- 4. redaction rewrites opaque provider state that must go back verbatim ---------------------


def _encrypted_blob() -> str:
    """A reasoning item's encrypted_content as OpenAI sends it (a Fernet token: url-safe
    base64); the first of a seeded sequence that the credential scanner happens to match — about
    one 20 kB blob in 300 does."""
    from safepoint._rules.secrets import redact_json

    rng = random.Random(13)
    while True:
        blob = "gAAAAA" + base64.urlsafe_b64encode(rng.randbytes(15000)).decode()
        if redact_json(blob) != blob:
            return blob


def _response(output: list[dict[str, Any]], rid: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": 1,
        "model": "gpt-test",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10},
    }


def test_encrypted_reasoning_goes_back_as_it_came_though_it_looks_like_a_key(file_store: sp.Store) -> None:
    blob = _encrypted_blob()
    first = _response(
        [
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "add",
                "arguments": '{"a":1,"b":2}',
                "status": "completed",
            },
        ],
        "resp_1",
    )
    second = _response(
        [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "3", "annotations": []}],
            }
        ],
        "resp_2",
    )
    server = Scripted(json_reply(first), json_reply(second))
    gpt_client = server.openai()
    tools = Tools()

    @tools.pure
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @sp.workflow("encrypted-reasoning")
    def agent(run: sp.Run) -> str:
        result = spo.responses_tool_loop(
            run,
            gpt_client,
            model="gpt-test",
            input="1+2?",
            tools=tools,
            store=False,
            include=["reasoning.encrypted_content"],
        )
        return result.text

    assert sp.start(file_store, agent, run_id="r", lease_ms=0) == "3"
    sent_back = [i for i in server.bodies[1]["input"] if i.get("type") == "reasoning"]
    # The API decrypts what it gave; anything else is a 400 (invalid_encrypted_content).
    assert sent_back[0]["encrypted_content"] == blob


# -- 5. an Anthropic stream that ends before message_stop is recorded as the reply ------------


def _anthropic_sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_an_anthropic_stream_that_ended_early_is_retried_not_recorded(file_store: sp.Store) -> None:
    started = {**anthropic_message(), "content": [], "stop_reason": None}
    cut = _anthropic_sse(
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Refund"}},
    )  # the body ends here: a proxy's idle timeout, a server restart — no message_stop
    whole = _anthropic_sse(
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Refunded A1."}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 4},
        },
        {"type": "message_stop"},
    )
    sse = {"content-type": "text/event-stream"}
    server = Scripted(
        lambda body: httpx2.Response(200, headers=sse, content=cut),
        lambda body: httpx2.Response(200, headers=sse, content=whole),
    )
    claude_client = server.anthropic()

    @sp.workflow("anthropic-stream-ended-early")
    def ask(run: sp.Run) -> dict[str, Any]:
        claude = spa.bind(run, claude_client, retry=TRANSIENT_ONLY)
        with claude.messages.stream(
            model="claude-test", max_tokens=64, messages=[{"role": "user", "content": "refund A1"}]
        ) as stream:
            final = stream.get_final_message()
        return {"text": final.content[0].text, "stop": final.stop_reason}

    # Expected (as the OpenAI streams do): an unfinished stream is a failed attempt, tried again.
    assert sp.start(file_store, ask, run_id="r", lease_ms=0) == {"text": "Refunded A1.", "stop": "end_turn"}
