"""The Anthropic client bound to a run: Messages calls as model steps, with the real anthropic
SDK over HTTP to the fake model server on loopback, on real SQLite files — recorded once,
replayed on a resume without a request, retried by the ledger, refused when they would hold
state the ledger cannot replay.

The tool loop is in test_anthropic_loop.py; the pure parts (fingerprint, rebuild, events,
failures) in test_anthropic_parts.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import pydantic
import pytest

import safepoint as sp
from safepoint.errors import StaleCheckpoint, StepAttemptsExhausted
from safepoint.integrations import anthropic as spa
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn
from safepoint.types import RunStatus, StepKind

MODEL = "claude-sonnet-4-5"
HELLO = [{"role": "user", "content": "Say hello."}]


def sync_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-test-fake", base_url=url)  # its own 2 retries: bind turns them off


def async_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(api_key="sk-test-fake", base_url=url)


def crash_then_resume(store: sp.Store, wf: sp.Workflow, crash_at: Any, *args: Any) -> Any:
    """Run ``wf`` until just before it completes, crash, and resume it as a new worker would."""
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id="r", lease_ms=0)
    crash_at(None)
    return sp.resume(store, "r")


# -- recorded once, replayed without a request -------------------------------------------------


def test_create_is_one_model_step_replayed_without_a_request(file_store: sp.Store, crash_at: Any) -> None:
    seen: list[Any] = []
    with FakeModelServer([Turn.text("Hello there.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-create")
        def agent(run: sp.Run) -> str:
            reply = spa.bind(run, client).messages.create(model=MODEL, max_tokens=64, messages=HELLO)
            seen.append(reply)
            return reply.content[0].text

        assert crash_then_resume(file_store, agent, crash_at) == "Hello there."
        assert len(fake.requests) == 1  # the resume asked nothing
    first, replayed = seen
    assert type(first) is type(replayed) is anthropic.types.Message
    assert first.to_dict() == replayed.to_dict()
    step = file_store.load_ledger("r").steps["model"]
    assert (step.kind, step.name, step.model_id) == (StepKind.MODEL, "anthropic.messages.create", MODEL)
    assert step.result == first.to_dict(mode="json")
    assert step.tokens == first.usage.input_tokens + first.usage.output_tokens


class Trip(pydantic.BaseModel):
    city: str
    days: int


def test_parse_returns_its_parsed_output_on_replay_too(file_store: sp.Store, crash_at: Any) -> None:
    seen: list[Any] = []
    with FakeModelServer([Turn.text('{"city": "Lyon", "days": 3}')]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-parse")
        def agent(run: sp.Run) -> str:
            reply = spa.bind(run, client).messages.parse(
                model=MODEL, max_tokens=64, messages=HELLO, output_format=Trip
            )
            seen.append(reply.parsed_output)
            return reply.content[0].text

        crash_then_resume(file_store, agent, crash_at)
        assert len(fake.requests) == 1
        schema = fake.requests[0].body["output_config"]["format"]
    assert seen == [Trip(city="Lyon", days=3), Trip(city="Lyon", days=3)]
    assert schema["type"] == "json_schema"  # the SDK's own request: parse is the SDK's
    assert file_store.load_ledger("r").steps["model"].name == "anthropic.messages.parse"


def read_stream(stream: Any) -> dict[str, Any]:
    events = [event.type for event in stream]
    return {"events": events, "text": stream.get_final_text(), "final": stream.get_final_message().to_dict()}


def test_a_stream_is_recorded_as_its_final_message_and_replayed_as_the_sdks_stream(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[Any] = []
    with FakeModelServer([Turn.text("Hello there, traveller.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-stream")
        def agent(run: sp.Run) -> str:
            claude = spa.bind(run, client)
            with claude.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
                assert isinstance(stream, anthropic.lib.streaming.MessageStream)
                texts = list(stream.text_stream)
                stream.until_done()
                seen.append({"texts": texts, **read_stream(stream)})
            with claude.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
                seen.append(read_stream(stream))
            return "".join(texts)

        assert crash_then_resume(file_store, agent, crash_at) == "Hello there, traveller."
        assert [r.stream for r in fake.requests] == [True, True]  # none on the resume
    first_run, replay = seen[:2], seen[2:]
    assert first_run == replay
    assert first_run[0]["texts"] == ["Hello there, traveller."]  # one delta: the record's text
    assert first_run[1]["events"] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "text",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    steps = file_store.load_ledger("r").steps
    assert [(sid, s.name) for sid, s in steps.items()] == [
        ("model", "anthropic.messages.stream"),
        ("model#2", "anthropic.messages.stream"),
    ]
    assert steps["model"].result == first_run[1]["final"] | {"stop_details": None}


def test_create_with_stream_true_gives_the_events_of_the_recorded_message(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[Any] = []
    with FakeModelServer([Turn.tool_calls(("get_order", {"order_id": "A1"}), text="Looking.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-create-stream")
        def agent(run: sp.Run) -> None:
            events = spa.bind(run, client).messages.create(
                model=MODEL, max_tokens=64, messages=HELLO, stream=True
            )
            with events:
                seen.append([e.to_dict() for e in events])

        crash_then_resume(file_store, agent, crash_at)
        assert len(fake.requests) == 1
    first, replayed = seen
    assert first == replayed
    assert [e["type"] for e in first][:4] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    tool_delta = next(e for e in first if e.get("delta", {}).get("type") == "input_json_delta")
    assert json.loads(tool_delta["delta"]["partial_json"]) == {"order_id": "A1"}
    assert first[-2]["delta"]["stop_reason"] == "tool_use"
    assert file_store.load_ledger("r").steps["model"].name == "anthropic.messages.create"


def test_the_async_client_records_create_parse_and_stream_and_replays_them(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[Any] = []
    with FakeModelServer(lambda request: Turn.text('{"city": "Oslo", "days": 2}')) as fake:
        client = async_client(fake.url)

        @sp.workflow("anthropic-async")
        async def agent(run: sp.AsyncRun) -> str:
            claude = spa.bind(None, client)  # the current run, at each call
            created = await claude.messages.create(model=MODEL, max_tokens=64, messages=HELLO)
            parsed = await claude.messages.parse(
                model=MODEL, max_tokens=64, messages=HELLO, output_format=Trip
            )
            async with claude.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
                assert isinstance(stream, anthropic.lib.streaming.AsyncMessageStream)
                texts = [t async for t in stream.text_stream]
                final = await stream.get_final_message()
            events = await claude.messages.create(model=MODEL, max_tokens=64, messages=HELLO, stream=True)
            async with events:
                kinds = [e.type async for e in events]
            async with claude.beta.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as beta:
                text = await beta.get_final_text()
            seen.append((created.to_dict(), parsed.parsed_output, texts, final.to_dict(), kinds))
            return text

        assert crash_then_resume(file_store, agent, crash_at) == '{"city": "Oslo", "days": 2}'
        assert len(fake.requests) == 5  # none on the resume
    assert seen[0] == seen[1]
    assert seen[0][1] == Trip(city="Oslo", days=2)
    assert seen[0][4][0] == "message_start"
    names = [s.name for s in file_store.load_ledger("r").steps.values()]
    assert names == [
        "anthropic.messages.create",
        "anthropic.messages.parse",
        "anthropic.messages.stream",
        "anthropic.messages.create",
        "anthropic.beta.messages.stream",
    ]


def test_beta_messages_are_steps_of_their_own_name_and_send_their_betas(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[Any] = []
    with FakeModelServer(lambda request: Turn.text('{"city": "Rome", "days": 4}')) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-beta")
        def agent(run: sp.Run) -> None:
            claude = spa.bind(run, client)
            created = claude.beta.messages.create(
                model=MODEL, max_tokens=64, messages=HELLO, betas=["context-1m-2025-08-07"]
            )
            parsed = claude.beta.messages.parse(
                model=MODEL, max_tokens=64, messages=HELLO, output_format=Trip
            )
            with claude.beta.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
                assert isinstance(stream, anthropic.lib.streaming.BetaMessageStream)
                final = stream.get_final_message()
            seen.append((type(created).__name__, parsed.parsed_output, type(final).__name__))

        crash_then_resume(file_store, agent, crash_at)
        requests = fake.requests
    assert seen == [("BetaMessage", Trip(city="Rome", days=4), "ParsedBetaMessage")] * 2
    assert [(r.path, r.stream) for r in requests] == [("/v1/messages", False)] * 2 + [("/v1/messages", True)]
    assert requests[0].headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert [s.name for s in file_store.load_ledger("r").steps.values()] == [
        "anthropic.beta.messages.create",
        "anthropic.beta.messages.parse",
        "anthropic.beta.messages.stream",
    ]


# -- the fingerprint ---------------------------------------------------------------------------


TOOL = {
    "name": "get_order",
    "description": "Look up an order.",
    "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
}


def asked(fake_url: str, options: dict[str, Any]) -> sp.Workflow:
    client = sync_client(fake_url)

    @sp.workflow(f"anthropic-fingerprint-{len(options)}-{id(options)}")
    def agent(run: sp.Run) -> str:
        reply = spa.bind(run, client).messages.create(model=MODEL, max_tokens=64, messages=HELLO, **options)
        return str(reply.content[0].text)

    return agent


BASE = {"system": [{"type": "text", "text": "Be brief."}], "tools": [TOOL]}


@pytest.mark.parametrize(
    "change",
    [
        {"metadata": {"user_id": "someone-else"}},
        {"timeout": 12.5},
        {"extra_headers": {"x-trace": "another"}},
        {"service_tier": "standard_only"},
        {"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]},
    ],
    ids=["metadata", "timeout", "extra_headers", "service_tier", "cache_control"],
)
def test_how_a_request_is_sent_does_not_move_its_hash(
    file_store: sp.Store, crash_at: Any, change: dict[str, Any]
) -> None:
    options = {**BASE, "metadata": {"user_id": "someone"}, "service_tier": "auto"}
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        agent = asked(fake.url, options)
        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(file_store, agent, run_id="r", lease_ms=0)
        crash_at(None)
        options.update(change)
        assert sp.resume(file_store, "r") == "Hi."
        assert len(fake.requests) == 1  # replayed: the same question


@pytest.mark.parametrize(
    "change",
    [
        {"system": [{"type": "text", "text": "Be thorough."}]},
        {"tools": [{**TOOL, "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}]},
        {"temperature": 0.2},
    ],
    ids=["system", "tool schema", "temperature"],
)
def test_what_a_request_asks_moves_its_hash(
    file_store: sp.Store, crash_at: Any, change: dict[str, Any]
) -> None:
    options = dict(BASE)
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        agent = asked(fake.url, options)
        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(file_store, agent, run_id="r", lease_ms=0)
        crash_at(None)
        options.update(change)
        with pytest.raises(StaleCheckpoint) as stale:
            sp.resume(file_store, "r")
        assert len(fake.requests) == 1
    assert stale.value.step_id == "model"
    assert file_store.get_run("r").status is RunStatus.BLOCKED


def test_sampling_parameters_are_sent_in_the_body(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        agent = asked(fake.url, {"temperature": 0.3, "top_k": 5})
        sp.start(file_store, agent, run_id="r")
        body = fake.requests[0].body
    assert (body["temperature"], body["top_k"]) == (0.3, 5)


# -- an unknown content block ------------------------------------------------------------------

NEWER = {
    "id": "msg_newer",
    "type": "message",
    "role": "assistant",
    "model": MODEL,
    "content": [
        {"type": "text", "text": "Here is a chart.", "citations": None},
        {"type": "chart_2027", "chart_id": "ch_1", "series": [1, 2, 3]},
    ],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 7},
}


@pytest.fixture
def newer_api() -> Iterator[Callable[[], int]]:
    """A server that answers with a content block type this SDK has never heard of."""
    hits: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            hits.append(1)
            body = json.dumps(NEWER).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield server  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()


def test_a_content_block_of_an_unknown_type_survives_record_and_replay(
    file_store: sp.Store, crash_at: Any, newer_api: Any
) -> None:
    seen: list[Any] = []
    client = sync_client(newer_api.url)

    @sp.workflow("anthropic-unknown-block")
    def agent(run: sp.Run) -> dict[str, Any]:
        reply = spa.bind(run, client).messages.create(model=MODEL, max_tokens=64, messages=HELLO)
        seen.append(reply.content[1])
        return spa.assistant_turn(reply)

    turn = crash_then_resume(file_store, agent, crash_at)
    assert turn["content"][1] == {"type": "chart_2027", "chart_id": "ch_1", "series": [1, 2, 3]}
    assert turn["content"][0] == {"type": "text", "text": "Here is a chart."}  # no null to send back
    assert [block.type for block in seen] == ["chart_2027", "chart_2027"]
    assert file_store.load_ledger("r").steps["model"].result == NEWER


# -- retries -----------------------------------------------------------------------------------

QUICK = sp.Retry(attempts=3, backoff=0.01, max_backoff=0.05)


def test_a_429_then_a_reply_is_one_step_with_one_failed_attempt(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        fake.fail(429, retry_after=0.05)
        client = sync_client(fake.url)

        @sp.workflow("anthropic-429")
        def agent(run: sp.Run) -> str:
            reply = spa.bind(run, client, retry=QUICK).messages.create(
                model=MODEL, max_tokens=64, messages=HELLO
            )
            return str(reply.content[0].text)

        assert sp.start(file_store, agent, run_id="r") == "Hi."
        retry_counts = [r.headers.get("x-stainless-retry-count") for r in fake.requests]
    assert retry_counts == ["0", "0"]  # two requests, each the ledger's attempt: the SDK retried none
    ledger = file_store.load_ledger("r")
    assert list(ledger.steps) == ["model"]
    (failed,) = ledger.attempts["model"]
    assert failed.error["type"] == "TransientFailure"
    assert "429" in failed.error["message"]


def test_overloaded_until_the_attempts_run_out_stops_the_run_and_more_attempts_carry_it_on(
    file_store: sp.Store,
) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        fake.fail(529, retry_after=None, times=None)
        client = sync_client(fake.url)

        @sp.workflow("anthropic-529")
        def agent(run: sp.Run) -> str:
            claude = spa.bind(run, client, retry=sp.Retry(attempts=2, backoff=0.01))
            reply = claude.messages.create(model=MODEL, max_tokens=64, messages=HELLO)
            return str(reply.content[0].text)

        with pytest.raises(StepAttemptsExhausted):
            sp.start(file_store, agent, run_id="r", lease_ms=0)
        assert file_store.get_run("r").status is RunStatus.STOPPED
        assert len(fake.requests) == 2
        fake.reset()  # the overload is over
        sp.extend_limits(file_store, "r", step_attempts=3, by="test", reason="overload over")
        assert sp.resume(file_store, "r") == "Hi."
        assert len(fake.requests) == 1
    assert len(file_store.load_ledger("r").attempts["model"]) == 2


def test_a_stream_cut_mid_body_is_tried_again(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("A long answer, cut the first time.")]) as fake:
        fake.cut_stream(after_events=3)
        client = sync_client(fake.url)

        @sp.workflow("anthropic-cut")
        def agent(run: sp.Run) -> str:
            with spa.bind(run, client, retry=QUICK).messages.stream(
                model=MODEL, max_tokens=64, messages=HELLO
            ) as stream:
                return stream.get_final_text()

        assert sp.start(file_store, agent, run_id="r") == "A long answer, cut the first time."
        assert len(fake.requests) == 2
    (failed,) = file_store.load_ledger("r").attempts["model"]
    assert failed.error["type"] == "TransientFailure"
    # the body ended mid-way: the SDK's APIConnectionError from anthropic 2.17 on, the transport's
    # RemoteProtocolError before; both are a connection failure that another attempt may get past
    assert "peer closed connection without sending complete message body" in failed.error["message"]


def test_a_400_is_the_steps_recorded_failure_replayed_identically(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[Any] = []
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        fake.fail(400, retry_after=None, message="max_tokens: too large for this model")
        client = sync_client(fake.url)

        @sp.workflow("anthropic-400")
        def agent(run: sp.Run) -> str:
            try:
                spa.bind(run, client).messages.create(model=MODEL, max_tokens=64, messages=HELLO)
            except sp.StepFailed as failed:
                seen.append((failed.step_id, failed.error_type, failed.attempts, failed.message))
            return "handled"

        assert crash_then_resume(file_store, agent, crash_at) == "handled"
        assert len(fake.requests) == 1  # tried once: a 400 is a 400 on every attempt
    first, replayed = seen
    assert first == replayed
    assert first[:3] == ("model", "BadRequestError", 1)
    assert "too large for this model" in first[3]


# -- credentials -------------------------------------------------------------------------------

KEY = "sk-ant-api03-" + "Zx9" * 12


def test_a_reply_quoting_a_key_is_redacted_and_the_next_request_hashes_the_same_on_replay(
    file_store: sp.Store, crash_at: Any
) -> None:
    seen: list[str] = []
    with FakeModelServer([Turn.text(f"Your key is {KEY}, keep it safe."), Turn.text("Done.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-redact")
        def agent(run: sp.Run) -> str:
            claude = spa.bind(run, client)
            messages = sp.Transcript(HELLO)
            first = claude.messages.create(model=MODEL, max_tokens=64, messages=messages)
            seen.append(first.content[0].text)
            messages.append(spa.assistant_turn(first))
            messages.append({"role": "user", "content": "Thanks."})
            return str(claude.messages.create(model=MODEL, max_tokens=64, messages=messages).content[0].text)

        assert crash_then_resume(file_store, agent, crash_at) == "Done."
        assert len(fake.requests) == 2
        sent_back = json.dumps(fake.requests[1].body["messages"][1])
    assert seen[0] == seen[1]
    assert KEY not in seen[0]
    assert "sp_redacted:sha256:" in seen[0]
    assert KEY not in sent_back  # the model was sent back what the ledger holds
    assert "sp_redacted:sha256:" in sent_back


# -- refused -----------------------------------------------------------------------------------


def test_a_thread_held_by_the_server_is_refused_unless_allowed(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-thread")
        def agent(run: sp.Run, allowed: bool) -> str:
            claude = spa.bind(run, client, server_state=allowed)
            reply = claude.beta.messages.create(
                model=MODEL, max_tokens=64, messages=HELLO, thread={"type": "create"}
            )
            return str(reply.content[0].text)

        with pytest.raises(sp.UsageError, match="server_state=True"):
            sp.start(file_store, agent, False, run_id="refused")
        assert fake.requests == []
        assert sp.start(file_store, agent, True, run_id="allowed") == "Hi."
        assert fake.requests[0].body["thread"] == {"type": "create"}

        @sp.workflow("anthropic-no-thread")
        def whole(run: sp.Run) -> str:  # thread=False: the whole history every turn, replayable
            reply = spa.bind(run, client).beta.messages.create(
                model=MODEL, max_tokens=64, messages=HELLO, thread=False
            )
            return str(reply.content[0].text)

        assert sp.start(file_store, whole, run_id="whole") == "Hi."


def test_a_client_and_a_run_must_match(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        sync, asynchronous = sync_client(fake.url), async_client(fake.url)

        @sp.workflow("anthropic-mismatch")
        async def agent(run: sp.AsyncRun) -> None:
            spa.bind(run, sync)

        with pytest.raises(sp.UsageError, match="plain def workflow"):
            sp.start(file_store, agent, run_id="r")
        unbound = spa.bind(None, asynchronous)  # the run is found at each call…
        with pytest.raises(sp.UsageError, match="outside a workflow"):
            asyncio.run(unbound.messages.create(model=MODEL, max_tokens=9, messages=HELLO))
        with pytest.raises(sp.UsageError, match=r"Anthropic or anthropic\.AsyncAnthropic"):
            spa.bind(None, object())
        assert fake.requests == []


def test_an_argument_the_sdk_does_not_take_is_refused_before_any_step(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hi.")]) as fake:
        client = sync_client(fake.url)

        @sp.workflow("anthropic-bad-argument")
        def agent(run: sp.Run) -> None:
            spa.bind(run, client).messages.create(model=MODEL, max_tokens=64, messages=HELLO, colour="red")

        with pytest.raises(sp.UsageError, match="colour"):
            sp.start(file_store, agent, run_id="r")
        assert fake.requests == []
    assert file_store.load_ledger("r").steps == {}
