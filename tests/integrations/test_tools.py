"""The tool registry: definitions generated from one declaration, and each kind of tool answered
through its step, recorded on the first run and replayed on a resume, on a real SQLite ledger.

Effects (keys, reconciliation, approval) are in test_tools_effects.py.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pydantic
import pytest

import safepoint as sp
from safepoint.errors import StepAttemptsExhausted
from safepoint.integrations.tools import ToolCall, ToolOutcome, Tools
from safepoint.testing import SimulatedCrash
from safepoint.types import StepKind, StepStatus


class Address(pydantic.BaseModel):
    """Where a parcel goes."""

    street: str
    city: str = "Lyon"


def declared() -> Tools:
    tools = Tools()

    @tools.read
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order by its id.

        The second paragraph is for people reading the code, not for the model."""
        return {"id": order_id}

    @tools.pure(name="add_numbers", description="Add two numbers.")
    def add(a: int, b: Annotated[int, pydantic.Field(description="the second")] = 2) -> int:
        return a + b

    @tools.effect(key_fields=("order_id",))
    def ship(order_id: str, to: Address, key: sp.EffectKey, title: str = "") -> dict[str, Any]:
        """Ship an order."""
        return {"shipped": order_id}

    return tools


ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def test_a_schema_comes_from_the_signature_without_titles_and_without_the_key() -> None:
    tools = declared()
    assert tools.names() == ["get_order", "add_numbers", "ship"]
    assert "ship" in tools
    assert "refund" not in tools
    assert len(tools) == 3
    get_order, add, ship = tools.anthropic()
    assert get_order == {
        "name": "get_order",
        "description": "Look up an order by its id.",
        "input_schema": ORDER,
    }
    assert add["description"] == "Add two numbers."
    assert add["input_schema"] == {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "integer", "default": 2, "description": "the second"},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    schema = ship["input_schema"]
    assert list(schema["properties"]) == ["order_id", "to", "title"]  # no "key": the engine gives it
    assert schema["properties"]["title"] == {"type": "string", "default": ""}  # a property named title stays
    assert schema["required"] == ["order_id", "to"]
    assert schema["$defs"]["Address"] == {
        "type": "object",
        "description": "Where a parcel goes.",
        "properties": {"street": {"type": "string"}, "city": {"type": "string", "default": "Lyon"}},
        "required": ["street"],
    }
    assert "title" not in str({k: v for k, v in schema.items() if k != "properties"})


def test_the_three_definition_formats_come_from_one_declaration() -> None:
    tools = declared()
    anthropic, chat, responses = tools.anthropic(), tools.openai_chat(), tools.openai_responses()
    for a, c, r in zip(anthropic, chat, responses, strict=True):
        assert c == {
            "type": "function",
            "function": {"name": a["name"], "description": a["description"], "parameters": a["input_schema"]},
        }
        assert r == {
            "type": "function",
            "name": a["name"],
            "description": a["description"],
            "parameters": a["input_schema"],
            "strict": False,
        }
    anthropic[0]["input_schema"]["properties"].clear()  # each list is the caller's own
    assert tools.anthropic()[0]["input_schema"] == ORDER


def test_a_hand_written_schema_is_sent_as_written_and_needs_no_signature() -> None:
    tools = Tools()
    tools.add("echo", "pure", lambda **kw: kw, schema=ORDER, description="Echo the order id.")
    assert tools.anthropic() == [{"name": "echo", "description": "Echo the order id.", "input_schema": ORDER}]


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda t: t.add("bad name", "pure", lambda: 1), "1 to 64 letters"),
        (lambda t: t.add("x", "write", lambda: 1), "none of 'pure', 'read', 'effect'"),
        (lambda t: t.add("x", "pure", lambda: 1, max_age=3), "takes no max_age"),
        (lambda t: t.add("x", "read", lambda key: 1, schema={"type": "array"}), "schema of an object"),
        (lambda t: t.add("x", "effect"), "give the function"),
        (lambda t: t.add("x", "effect", effect=sp.Effect("x", execute=lambda p, k: 1)), "needs schema="),
        (lambda t: t.add("x", "effect", lambda: 1, key_fields=("id",)), "key_fields"),
        (lambda t: t.add("x", "pure", lambda *args: 1), "variadic positional"),
        (lambda t: t.add("x", "effect", lambda: 1, dedup_retention=5), "dedup_retention=5"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_at_once(declare: Any, message: str) -> None:
    with pytest.raises(sp.UsageError, match=message):
        declare(Tools())


def test_a_key_is_only_for_an_effect_and_a_name_only_for_one_tool() -> None:
    tools = Tools()

    def lookup(order_id: str, key: sp.EffectKey) -> str:
        return order_id

    with pytest.raises(sp.UsageError, match="only an effect tool receives an EffectKey"):
        tools.read(lookup)
    tools.effect(lookup)
    with pytest.raises(sp.UsageError, match="declared twice"):
        tools.pure(lookup)


# -- each kind, recorded and replayed ---------------------------------------------------------


class Counted:
    """Tools that count their calls, to show what a resume runs again."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.tools = Tools()

        @self.tools.pure
        def add(a: int, b: int) -> int:
            self.calls.append("add")
            return a + b

        @self.tools.read(max_age=None)
        def get_order(order_id: str) -> dict[str, Any]:
            self.calls.append("get_order")
            return {"id": order_id, "total_cents": 1200}

        @self.tools.effect(dedup_retention=None)
        def refund(order_id: str, amount_cents: int, key: sp.EffectKey) -> dict[str, Any]:
            self.calls.append("refund")
            return {"refund": f"re_{order_id}", "amount_cents": amount_cents, "key": str(key)}

        @self.tools.read
        def flaky(order_id: str) -> str:
            self.calls.append("flaky")
            raise ConnectionError(f"the order service did not answer for {order_id}")

        @self.tools.pure
        def divide(a: int, b: int) -> float:
            self.calls.append("divide")
            return a / b


CALLS = [
    ToolCall("toolu_1", "add", {"a": 2, "b": 3}),
    ToolCall("toolu_2", "get_order", {"order_id": "A1"}),
    ToolCall("call_3", "refund", '{"order_id": "A1", "amount_cents": 500}'),  # OpenAI's JSON text
]


def test_each_kind_is_recorded_under_its_call_id_and_replayed_without_calling_it(
    file_store: sp.Store, crash_at: Any
) -> None:
    counted = Counted()

    @sp.workflow("tools-each-kind")
    def agent(run: sp.Run) -> list[dict[str, Any]]:
        return [vars_of(o) for o in counted.tools.call_all(run, CALLS)]

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    assert counted.calls == ["add", "get_order", "refund"]
    first = file_store.load_ledger("r")
    assert {sid: (s.kind, s.name) for sid, s in first.steps.items()} == {
        "tool.toolu_1": (StepKind.PURE, "add"),
        "tool.toolu_2": (StepKind.READ, "get_order"),
        "tool.call_3": (StepKind.EFFECT, "refund"),
    }
    assert first.operations["tool.call_3"].dispatch_count == 1

    outcomes = sp.resume(file_store, "r")
    assert counted.calls == ["add", "get_order", "refund"]  # nothing ran again
    key = first.operations["tool.call_3"].effect_key
    assert outcomes == [
        {"call_id": "toolu_1", "name": "add", "content": "5", "is_error": False, "value": 5},
        {
            "call_id": "toolu_2",
            "name": "get_order",
            "content": '{"id":"A1","total_cents":1200}',
            "is_error": False,
            "value": {"id": "A1", "total_cents": 1200},
        },
        {
            "call_id": "call_3",
            "name": "refund",
            "content": f'{{"refund":"re_A1","amount_cents":500,"key":"{key}"}}',
            "is_error": False,
            "value": {"refund": "re_A1", "amount_cents": 500, "key": key},
        },
    ]


def vars_of(outcome: ToolOutcome) -> dict[str, Any]:
    return {
        "call_id": outcome.call_id,
        "name": outcome.name,
        "content": outcome.content,
        "is_error": outcome.is_error,
        "value": outcome.value,
    }


@pytest.mark.parametrize(
    ("call", "content"),
    [
        (
            ToolCall("toolu_1", "flaky", {"order_id": "A1"}),
            "ConnectionError: the order service did not answer for A1",
        ),
        (ToolCall("toolu_1", "divide", {"a": 1, "b": 0}), "ZeroDivisionError: division by zero"),
    ],
)
def test_a_tool_that_raises_is_an_error_outcome_on_the_first_run_and_on_replay(
    file_store: sp.Store, crash_at: Any, call: ToolCall, content: str
) -> None:
    counted = Counted()

    @sp.workflow(f"tools-raising-{call.name}")
    def agent(run: sp.Run) -> dict[str, Any]:
        return vars_of(counted.tools.call(run, call))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, agent, run_id="r", lease_ms=0)
    crash_at(None)
    assert counted.calls == [call.name]  # tried once: a failure is the model's to handle
    step = file_store.load_ledger("r").steps["tool.toolu_1"]
    assert step.status is StepStatus.FAILED
    outcome = sp.resume(file_store, "r")
    assert counted.calls == [call.name]  # the replay took the failure from the ledger
    assert outcome == {
        "call_id": "toolu_1",
        "name": call.name,
        "content": content,
        "is_error": True,
        "value": content,
    }


def test_a_read_that_declares_retries_stops_the_run_when_they_run_out(file_store: sp.Store) -> None:
    calls: list[int] = []
    tools = Tools()

    @tools.read(retry=sp.Retry(attempts=2, backoff=0.01, jitter=0))
    def status() -> str:
        calls.append(1)
        raise TimeoutError("no answer")

    @sp.workflow("tools-read-retries")
    def agent(run: sp.Run) -> Any:
        try:
            return tools.call(run, ToolCall("toolu_1", "status", {}))
        except Exception:  # agent code that catches everything still cannot keep it going
            return "caught"

    with pytest.raises(StepAttemptsExhausted):
        sp.start(file_store, agent, run_id="r")
    assert len(calls) == 2
    assert file_store.get_run("r").status.value == "stopped"


@pytest.mark.parametrize(
    ("call", "content"),
    [
        (
            ToolCall("toolu_9", "refund_all", {}),
            "unknown tool 'refund_all'; the tools are: add, get_order, refund, flaky, divide",
        ),
        (ToolCall("toolu_9", "add", {"a": 1}), "invalid arguments for tool 'add': b: Field required"),
        (
            ToolCall("toolu_9", "add", {"a": "one", "b": 2, "c": 3}),
            "invalid arguments for tool 'add': a: Input should be a valid integer, unable to parse"
            " string as an integer; c: Extra inputs are not permitted",
        ),
        (
            ToolCall("call_9", "add", '{"a": 1, '),
            "invalid arguments for tool 'add': the arguments are not valid JSON (Expecting property"
            " name enclosed in double quotes at position 9)",
        ),
        (
            ToolCall("call_9", "add", "[1, 2]"),
            "invalid arguments for tool 'add': the arguments are a JSON object, not list",
        ),
        (  # Python's decoder raises RecursionError here, not ValueError
            ToolCall("call_9", "add", "[" * 100_000 + "]" * 100_000),
            "invalid arguments for tool 'add': the arguments are not valid JSON (nested too deeply"
            " to be read)",
        ),
        (
            ToolCall("call_9", "refund", '{"order_id": "A1"}'),
            "invalid arguments for tool 'refund': amount_cents: Field required",
        ),
    ],
)
def test_what_the_model_asked_for_wrongly_is_an_error_outcome_and_no_step(
    file_store: sp.Store, call: ToolCall, content: str
) -> None:
    counted = Counted()

    @sp.workflow(f"tools-wrong-{call.call_id}-{len(content)}")
    def agent(run: sp.Run) -> dict[str, Any]:
        return vars_of(counted.tools.call(run, call))

    outcome = sp.start(file_store, agent, run_id="r")
    assert outcome == {
        "call_id": call.call_id,
        "name": call.name,
        "content": content,
        "is_error": True,
        "value": content,
    }
    assert counted.calls == []
    assert file_store.load_ledger("r").steps == {}  # decided from the model's reply alone


def test_arguments_are_coerced_by_the_signature_and_recorded_as_json(file_store: sp.Store) -> None:
    tools = Tools()
    seen: list[Any] = []

    @tools.pure
    def label(to: Address, copies: int = 1) -> str:
        seen.append((to, copies))
        return f"{copies} x {to.street}, {to.city}"

    @sp.workflow("tools-coerced")
    def agent(run: sp.Run) -> str:
        return tools.call(
            run, ToolCall("toolu_1", "label", {"to": {"street": "1 rue Neuve"}, "copies": "2"})
        ).content

    assert sp.start(file_store, agent, run_id="r") == "2 x 1 rue Neuve, Lyon"
    assert seen == [(Address(street="1 rue Neuve"), 2)]


def test_a_result_pydantic_can_describe_is_recorded_as_json(file_store: sp.Store) -> None:
    tools = Tools()

    @tools.read
    def where(order_id: str) -> Address:
        return Address(street="2 quai Est")

    @sp.workflow("tools-model-result")
    def agent(run: sp.Run) -> Any:
        return tools.call(run, ToolCall("toolu_1", "where", {"order_id": "A1"})).value

    assert sp.start(file_store, agent, run_id="r") == {"street": "2 quai Est", "city": "Lyon"}


def test_a_read_redacts_a_credential_it_returns(file_store: sp.Store) -> None:
    tools = Tools()
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"

    @tools.read
    def config() -> dict[str, str]:
        return {"region": "eu", "token": token}

    @sp.workflow("tools-read-redacts")
    def agent(run: sp.Run) -> Any:
        return tools.call(run, ToolCall("toolu_1", "config", {})).value

    value = sp.start(file_store, agent, run_id="r")
    assert value["region"] == "eu"
    assert value["token"].startswith("sp_redacted:sha256:")
    assert token not in str(file_store.load_ledger("r").steps)


def test_without_a_run_the_current_run_answers(file_store: sp.Store) -> None:
    counted = Counted()

    @sp.workflow("tools-current-run")
    def agent(run: sp.Run) -> Any:
        return counted.tools.call(None, CALLS[0]).value

    assert sp.start(file_store, agent, run_id="r") == 5
    assert "tool.toolu_1" in file_store.load_ledger("r").steps


# -- async ------------------------------------------------------------------------------------


def async_tools(calls: list[str]) -> Tools:
    tools = Tools()

    @tools.read
    async def get_order(order_id: str) -> dict[str, Any]:
        calls.append("get_order")
        await asyncio.sleep(0)
        return {"id": order_id}

    @tools.effect
    async def refund(order_id: str, key: sp.EffectKey) -> dict[str, Any]:
        calls.append("refund")
        await asyncio.sleep(0)
        return {"refund": order_id}

    @tools.pure
    def add(a: int, b: int) -> int:  # a plain tool works in an async workflow too
        calls.append("add")
        return a + b

    return tools


def test_async_tools_are_awaited_on_an_async_run_and_replayed(file_store: sp.Store, crash_at: Any) -> None:
    calls: list[str] = []
    tools = async_tools(calls)
    turn = [
        ToolCall("toolu_1", "get_order", {"order_id": "A1"}),
        ToolCall("toolu_2", "refund", {"order_id": "A1"}),
        ToolCall("toolu_3", "add", {"a": 1, "b": 2}),
    ]

    @sp.workflow("tools-async")
    async def agent(run: sp.AsyncRun) -> list[Any]:
        return [o.value for o in await tools.call_all_async(run, turn)]

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        asyncio.run(sp.start_async(file_store, agent, run_id="r", lease_ms=0))
    crash_at(None)
    assert asyncio.run(sp.resume_async(file_store, "r")) == [{"id": "A1"}, {"refund": "A1"}, 3]
    assert calls == ["get_order", "refund", "add"]


def test_a_plain_run_given_an_async_tool_says_what_to_do(file_store: sp.Store) -> None:
    tools = async_tools([])

    @sp.workflow("tools-async-on-sync")
    def agent(run: sp.Run) -> Any:
        return tools.call(run, ToolCall("toolu_1", "get_order", {"order_id": "A1"}))

    with pytest.raises(sp.UsageError, match=r"tool 'get_order' is async: .*await tools.call_async"):
        sp.start(file_store, agent, run_id="r")
    assert file_store.load_ledger("r").steps == {}


def test_the_wrong_call_for_the_run_says_which_to_use(file_store: sp.Store) -> None:
    tools = async_tools([])

    @sp.workflow("tools-sync-call-on-async")
    async def agent(run: sp.AsyncRun) -> Any:
        return tools.call(run, ToolCall("toolu_1", "add", {"a": 1, "b": 2}))  # type: ignore[arg-type]

    with pytest.raises(sp.UsageError, match=r"await tools.call_async\(run, call\)"):
        asyncio.run(sp.start_async(file_store, agent, run_id="r"))
