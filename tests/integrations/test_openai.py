"""The bound OpenAI client, driven through the real ``openai`` package over HTTP to the fake
model server on 127.0.0.1, on real SQLite files: each Chat Completions and Responses call is a
model step recorded once and replayed with no request on resume, sync and async; what the
fingerprint covers; retries as recorded attempts; streams; failures; redaction; server state."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from openai import AsyncOpenAI, OpenAI

import safepoint as sp
from safepoint.errors import StaleCheckpoint, StepAttemptsExhausted, StepFailed, UsageError
from safepoint.integrations import openai as spo
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn
from safepoint.types import RunStatus

KEY = "sk-test-fake"
ASK = [{"role": "user", "content": "Where is order A1?"}]
FAST = sp.Retry(attempts=3, backoff=0.01, max_backoff=0.05)


class Order(pydantic.BaseModel):
    order_id: str
    total: int


ORDER_JSON = '{"order_id":"A1","total":42}'


def client(fake: FakeModelServer) -> OpenAI:
    return OpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)


def async_client(fake: FakeModelServer) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)


def crashed_then_resumed(store: sp.Store, wf: sp.Workflow, crash_at: Any, *args: Any) -> Any:
    """Run ``wf`` to its end, lose the process before the run completes, resume it: every step
    replays from the ledger (the workflow function runs again from the top)."""
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id="r", lease_ms=0)
    crash_at(None)
    return sp.resume(store, "r")


def steps(store: sp.Store) -> dict[str, Any]:
    return store.load_ledger("r").steps


# -- recorded once, replayed with no request -----------------------------------------------------


def test_chat_create_parse_and_stream_replay_without_a_request(file_store: sp.Store, crash_at: Any) -> None:
    seen: list[dict[str, Any]] = []
    with FakeModelServer(lambda request: Turn.text(ORDER_JSON)) as fake:

        @sp.workflow("openai-chat-calls")
        def calls(run: sp.Run) -> int:
            gpt = spo.bind(run, client(fake))
            created = gpt.chat.completions.create(model="gpt-test", messages=ASK)
            parsed = gpt.chat.completions.parse(model="gpt-test", messages=ASK, response_format=Order)
            with gpt.chat.completions.stream(model="gpt-test", messages=ASK) as stream:
                deltas = [event.delta for event in stream if event.type == "content.delta"]
                final = stream.get_final_completion()
            chunks = list(gpt.chat.completions.create(model="gpt-test", messages=ASK, stream=True))
            seen.append(
                {
                    "created": created.to_dict(),
                    "parsed": parsed.choices[0].message.parsed,
                    "deltas": deltas,
                    "final": final.choices[0].message.content,
                    "chunks": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                }
            )
            return len(seen)

        assert crashed_then_resumed(file_store, calls, crash_at) == 2
        assert len(fake.requests) == 4  # the resume sent none
    assert seen[0] == seen[1]
    assert seen[0]["parsed"] == Order(order_id="A1", total=42)
    assert (seen[0]["deltas"], seen[0]["final"], seen[0]["chunks"]) == ([ORDER_JSON], ORDER_JSON, ORDER_JSON)
    assert [s.name for s in steps(file_store).values()] == [
        "openai.chat.completions.create",
        "openai.chat.completions.parse",
        "openai.chat.completions.stream",
        "openai.chat.completions.create",
    ]
    assert [r.stream for r in fake.requests] == [False, False, True, True]


def test_responses_create_parse_and_stream_replay_without_a_request(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[dict[str, Any]] = []
    with FakeModelServer(lambda request: Turn.text(ORDER_JSON)) as fake:

        @sp.workflow("openai-responses-calls")
        def calls(run: sp.Run) -> int:
            gpt = spo.bind(run, client(fake))
            created = gpt.responses.create(model="gpt-test", input="Where is A1?")
            parsed = gpt.responses.parse(model="gpt-test", input="Where is A1?", text_format=Order)
            with gpt.responses.stream(model="gpt-test", input="Where is A1?") as stream:
                kinds = [event.type for event in stream]
                final = stream.until_done().get_final_response()
            events = list(gpt.responses.create(model="gpt-test", input="Where is A1?", stream=True))
            seen.append(
                {
                    "created": created.to_dict(),
                    "parsed": parsed.output_parsed,
                    "kinds": kinds,
                    "final": final.output_text,
                    "last": events[-1].type,
                    "numbers": [e.sequence_number for e in events],
                }
            )
            return len(seen)

        assert crashed_then_resumed(file_store, calls, crash_at) == 2
        assert len(fake.requests) == 4
    assert seen[0] == seen[1]
    assert seen[0]["parsed"] == Order(order_id="A1", total=42)
    assert seen[0]["final"] == ORDER_JSON
    assert seen[0]["kinds"][0] == "response.created"
    assert "response.output_text.delta" in seen[0]["kinds"]
    assert seen[0]["kinds"][-1] == "response.completed"
    assert seen[0]["numbers"] == list(range(len(seen[0]["numbers"])))
    assert seen[0]["last"] == "response.completed"


def test_an_async_workflow_replays_every_call_without_a_request(file_store: sp.Store, crash_at: Any) -> None:
    seen: list[list[Any]] = []
    with FakeModelServer(lambda request: Turn.text(ORDER_JSON)) as fake:

        @sp.workflow("openai-async-calls")
        async def calls(run: sp.AsyncRun) -> int:
            gpt = spo.bind(None, async_client(fake))  # the run executing this workflow
            out: list[Any] = []
            out.append((await gpt.chat.completions.create(model="gpt-test", messages=ASK)).to_dict())
            parsed = await gpt.chat.completions.parse(model="gpt-test", messages=ASK, response_format=Order)
            out.append(parsed.choices[0].message.parsed)
            async with gpt.chat.completions.stream(model="gpt-test", messages=ASK) as stream:
                out.append([event.type async for event in stream])
                out.append((await stream.get_final_completion()).choices[0].message.content)
            out.append((await gpt.responses.create(model="gpt-test", input="A1?")).output_text)
            out.append(
                (await gpt.responses.parse(model="gpt-test", input="A1?", text_format=Order)).output_parsed
            )
            async with gpt.responses.stream(model="gpt-test", input="A1?") as events:
                out.append((await (await events.until_done()).get_final_response()).output_text)
            chunks = await gpt.chat.completions.create(model="gpt-test", messages=ASK, stream=True)
            out.append(len([chunk async for chunk in chunks]))
            events = await gpt.responses.create(model="gpt-test", input="A1?", stream=True)
            out.append([event.type async for event in events][-1])
            seen.append(out)
            return len(seen)

        assert crashed_then_resumed(file_store, calls, crash_at) == 2
        assert len(fake.requests) == 8
    assert seen[0] == seen[1]
    assert seen[0][1] == Order(order_id="A1", total=42)
    assert seen[0][3] == seen[0][4] == seen[0][6] == ORDER_JSON
    assert seen[0][8] == "response.completed"


# -- the fingerprint ---------------------------------------------------------------------------

TOOL = {"type": "function", "name": "get_order", "parameters": {"type": "object", "properties": {}}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}
CARRIERS = {
    "metadata": {"ticket": "T-2"},
    "user": "user-2",
    "timeout": 30.0,
    "extra_headers": {"x-trace": "2"},
    "service_tier": "flex",
    "prompt_cache_key": "cache-2",
    "store": False,
}
DESCRIBED = {"function": {**CHAT_TOOL["function"], "description": "Find an order."}}


@pytest.mark.parametrize(
    ("api", "changed", "stale"),
    [
        pytest.param("responses", CARRIERS, False, id="responses-what-carries-the-request"),
        pytest.param("responses", {"instructions": "Answer in French."}, True, id="responses-instructions"),
        pytest.param(
            "responses", {"tools": [{**TOOL, "description": "Find an order."}]}, True, id="responses-tool"
        ),
        pytest.param("chat", CARRIERS, False, id="chat-what-carries-the-request"),
        pytest.param("chat", {"tools": [{**CHAT_TOOL, **DESCRIBED}]}, True, id="chat-tool-schema"),
    ],
)
def test_what_the_fingerprint_covers(
    file_store: sp.Store, crash_at: Any, api: str, changed: dict[str, Any], stale: bool
) -> None:
    request: dict[str, Any] = {"metadata": {"ticket": "T-1"}, "user": "user-1", "store": True}
    if api == "responses":
        request.update(instructions="Be brief.", tools=[TOOL])
    else:
        request.update(tools=[CHAT_TOOL])
    with FakeModelServer(lambda r: Turn.text("It shipped.")) as fake:

        @sp.workflow(f"openai-fingerprint-{api}-{sorted(changed)}")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake))
            if api == "responses":
                return gpt.responses.create(model="gpt-test", input="Where is A1?", **request).output_text
            reply = gpt.chat.completions.create(model="gpt-test", messages=ASK, **request)
            return reply.choices[0].message.content or ""

        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(file_store, ask, run_id="r", lease_ms=0)
        crash_at(None)
        request.update(changed)
        if stale:
            with pytest.raises(StaleCheckpoint) as blocked:
                sp.resume(file_store, "r")
            assert blocked.value.step_id == "model"
        else:
            assert sp.resume(file_store, "r") == "It shipped."
        assert len(fake.requests) == 1  # never asked again, changed or not


# -- a function call's fields kept exactly -------------------------------------------------------


def test_a_responses_function_call_keeps_call_id_and_async_exactly(file_store: sp.Store) -> None:
    from safepoint.integrations.tools import Tools

    tools = Tools()

    @tools.pure
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    script = [Turn.tool_calls(("add", {"a": 1, "b": 2})), Turn.text("3")]
    with FakeModelServer(script) as fake:

        @sp.workflow("openai-function-call-fields")
        def agent(run: sp.Run) -> str:
            return spo.responses_tool_loop(
                run, client(fake), model="gpt-test", input="1+2?", tools=tools
            ).text

        assert sp.start(file_store, agent, run_id="r") == "3"
        first = fake.requests[0]
        wire = post_json(fake.openai_url + "/responses", dict(first.body))  # the fake answers alike
        sent_back = [item for item in fake.requests[1].body["input"] if item.get("type") == "function_call"]
    recorded = steps(file_store)["model"].result
    assert recorded["output"] == wire["output"]
    call = wire["output"][0]
    assert {"call_id", "async"} <= set(call)
    assert sent_back == [{k: v for k, v in call.items() if v is not None}]
    assert steps(file_store)[f"tool.{call['call_id']}"].result == 3


def post_json(url: str, body: dict[str, Any]) -> Any:
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers)) as reply:
        return json.loads(reply.read())


# -- retries: recorded attempts, then a stop --------------------------------------------------


def test_a_rate_limit_is_one_step_with_one_recorded_failed_attempt(file_store: sp.Store) -> None:
    with FakeModelServer(lambda r: Turn.text("Shipped.")) as fake:
        fake.fail(429, retry_after=0.05, times=1)

        @sp.workflow("openai-rate-limited")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake), retry=FAST)
            return (
                gpt.chat.completions.create(model="gpt-test", messages=ASK).choices[0].message.content or ""
            )

        assert sp.start(file_store, ask, run_id="r") == "Shipped."
        assert [r.retry_count for r in fake.requests] == [0, 0]  # the SDK retried nothing itself
    ledger = file_store.load_ledger("r")
    assert list(ledger.steps) == ["model"]
    (attempt,) = ledger.attempts["model"]
    assert attempt.error["type"] == "TransientFailure"
    assert "429" in attempt.error["message"]


def test_server_errors_until_the_attempts_run_out_stop_the_run_and_a_raised_limit_carries_it_on(
    file_store: sp.Store,
) -> None:
    with FakeModelServer(lambda r: Turn.text("Shipped.")) as fake:
        fake.fail(500, retry_after=None, times=3)

        @sp.workflow("openai-server-errors")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake), retry=FAST)
            return (
                gpt.chat.completions.create(model="gpt-test", messages=ASK).choices[0].message.content or ""
            )

        with pytest.raises(StepAttemptsExhausted):
            sp.start(file_store, ask, run_id="r")
        assert file_store.get_run("r").status is RunStatus.STOPPED
        assert len(fake.requests) == 3
        sp.extend_limits(file_store, "r", step_attempts=4, by="ops")
        assert sp.resume(file_store, "r") == "Shipped."
        assert len(fake.requests) == 4
    assert file_store.get_run("r").status is RunStatus.COMPLETED
    assert len(file_store.load_ledger("r").attempts["model"]) == 3


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_stream_cut_mid_body_is_tried_again(file_store: sp.Store, api: str) -> None:
    with FakeModelServer(lambda r: Turn.text("The order shipped on Monday.")) as fake:
        fake.cut_stream(after_events=2, times=1)

        @sp.workflow(f"openai-cut-stream-{api}")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake), retry=FAST)
            if api == "chat":
                with gpt.chat.completions.stream(model="gpt-test", messages=ASK) as stream:
                    return stream.get_final_completion().choices[0].message.content or ""
            with gpt.responses.stream(model="gpt-test", input="A1?") as events:
                return events.get_final_response().output_text

        assert sp.start(file_store, ask, run_id="r") == "The order shipped on Monday."
        assert len(fake.requests) == 2
    assert len(file_store.load_ledger("r").attempts["model"]) == 1


def test_a_bad_request_is_a_recorded_failure_replayed_identically(
    file_store: sp.Store, crash_at: Any
) -> None:
    failures: list[tuple[str, str]] = []
    with FakeModelServer(lambda r: Turn.text("unused")) as fake:
        fake.fail(400, retry_after=None, times=1, message="messages[0].content is too long")

        @sp.workflow("openai-bad-request")
        def ask(run: sp.Run) -> int:
            gpt = spo.bind(run, client(fake))
            try:
                gpt.chat.completions.create(model="gpt-test", messages=ASK)
            except StepFailed as failed:
                failures.append((failed.error_type, failed.message))
            return len(failures)

        assert crashed_then_resumed(file_store, ask, crash_at) == 2
        assert len(fake.requests) == 1  # a 400 is not asked again
    assert failures[0] == failures[1]
    assert failures[0][0] == "BadRequestError"
    assert "too long" in failures[0][1]


# -- a credential in a reply --------------------------------------------------------------------

LEAKED = "sk-proj-" + "Q7x9" * 8


def test_a_reply_quoting_an_api_key_is_redacted_and_the_next_request_replays(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[str] = []
    script = [Turn.text(f"Your key is {LEAKED}."), Turn.text("Rotate it.")]
    with FakeModelServer(script) as fake:

        @sp.workflow("openai-redacted")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake))
            messages = sp.Transcript(ASK)
            first = gpt.chat.completions.create(model="gpt-test", messages=messages)
            seen.append(first.choices[0].message.content or "")
            messages.append(spo.chat_turn(first))
            messages.append({"role": "user", "content": "What now?"})
            return (
                gpt.chat.completions.create(model="gpt-test", messages=messages).choices[0].message.content
                or ""
            )

        assert crashed_then_resumed(file_store, ask, crash_at) == "Rotate it."
        assert len(fake.requests) == 2  # the second request hashed the same on replay
        sent = fake.requests[1].body["messages"][1]["content"]
    assert seen[0] == seen[1] == sent
    assert LEAKED not in seen[0]
    assert "sp_redacted:sha256:" in seen[0]
    assert LEAKED not in json.dumps(steps(file_store)["model"].result)


# -- state the server would hold -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "named"),
    [
        ({"conversation": "conv_1"}, "conversation="),
        ({"previous_response_id": "resp_1"}, "previous_response_id="),
        ({"background": True}, "background=True"),
    ],
)
def test_server_held_state_is_refused_before_any_request(
    file_store: sp.Store, argument: dict[str, Any], named: str
) -> None:
    with FakeModelServer(lambda r: Turn.text("unused")) as fake:

        @sp.workflow(f"openai-server-state-{named}")
        def ask(run: sp.Run) -> str:
            return spo.bind(run, client(fake)).responses.create(model="gpt-test", input="A1?", **argument).id

        with pytest.raises(UsageError) as refused:
            sp.start(file_store, ask, run_id="r")
        assert fake.requests == []
    assert named in refused.value.message
    assert "server_state=True" in refused.value.message
    assert "whole input" in refused.value.message


def test_server_state_opted_in_is_sent_and_hashed(file_store: sp.Store, crash_at: Any) -> None:
    chained = {"to": "the first"}
    with FakeModelServer(lambda r: Turn.text("Shipped.")) as fake:

        @sp.workflow("openai-server-state-opted-in")
        def ask(run: sp.Run) -> str:
            gpt = spo.bind(run, client(fake), server_state=True)
            first = gpt.responses.create(model="gpt-test", input="A1?")
            previous = first.id if chained["to"] == "the first" else "resp_elsewhere"
            return gpt.responses.create(
                model="gpt-test", input="B2?", previous_response_id=previous
            ).output_text

        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(file_store, ask, run_id="r", lease_ms=0)
        crash_at(None)
        assert fake.requests[1].body["previous_response_id"] == steps(file_store)["model"].result["id"]
        chained["to"] = "another"
        with pytest.raises(StaleCheckpoint) as blocked:
            sp.resume(file_store, "r")
        assert blocked.value.step_id == "model#2"
        assert len(fake.requests) == 2


# -- mistakes in the call ----------------------------------------------------------------------


def test_mistakes_in_the_call_are_refused_before_any_step(file_store: sp.Store) -> None:
    problems: list[str] = []
    with FakeModelServer(lambda r: Turn.text("unused")) as fake:

        def attempt(call: Callable[[], Any]) -> None:
            try:
                call()
            except (UsageError, AttributeError) as refused:
                problems.append(f"{type(refused).__name__}: {refused}")

        @sp.workflow("openai-mistakes")
        def ask(run: sp.Run) -> int:
            gpt = spo.bind(run, client(fake))
            attempt(lambda: gpt.chat.completions.create(model="gpt-test", messages=ASK, temprature=0))
            attempt(lambda: gpt.responses.parse(model="gpt-test", input="A1?", stream=True))
            attempt(lambda: gpt.embeddings)
            return len(problems)

        assert sp.start(file_store, ask, run_id="r") == 3
        assert fake.requests == []
    assert problems[0].startswith("UsageError: openai.chat.completions.create(): ")
    assert "temprature" in problems[0]
    assert "responses.stream" in problems[1]
    assert problems[2].startswith("AttributeError: BoundOpenAI has no 'embeddings'")
    assert steps(file_store) == {}


def test_a_client_and_a_run_must_match(file_store: sp.Store) -> None:
    @sp.workflow("openai-mismatch")
    async def ask(run: sp.AsyncRun) -> str:
        spo.bind(run, OpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1"))
        return "unreachable"

    with pytest.raises(UsageError) as refused:
        sp.start(file_store, ask, run_id="r")
    assert "AsyncOpenAI in an async one" in refused.value.message
    with pytest.raises(UsageError):
        spo.bind(None, object())  # type: ignore[call-overload]
    assert asyncio.iscoroutinefunction(spo.tool_loop_async)
