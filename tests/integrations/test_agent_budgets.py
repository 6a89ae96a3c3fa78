"""The tool loops count against the run's Budget: every turn is a model call, its tokens are what
the provider reported, its cost what the user's price function says. Once a limit is reached the
run stops before the next request — resumably — and a raised limit carries it on from the
ledger: no turn asked again, no tool run again, no tool call left without its result."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

import safepoint as sp
from safepoint.errors import BudgetExhausted
from safepoint.integrations import anthropic as spa
from safepoint.integrations import openai as spo
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, Turn
from safepoint.types import RunStatus

KEY = "sk-test-not-real"
tools = Tools()
looked_up: list[str] = []


@tools.read
def get_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    looked_up.append(order_id)
    return {"order_id": order_id, "shipped": False}


SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("get_order", {"order_id": "A2"})),
    Turn.tool_calls(("get_order", {"order_id": "A3"})),
    Turn.text("None of them shipped."),
]
QUESTION = "Did A1, A2 or A3 ship?"


def loop(api: str, run: sp.Run, fake: FakeModelServer, **options: Any) -> Any:
    if api == "anthropic":
        client = anthropic.Anthropic(api_key=KEY, base_url=fake.url)
        messages = [{"role": "user", "content": QUESTION}]
        return spa.tool_loop(run, client, model="m", messages=messages, tools=tools, **options)
    chat = openai.OpenAI(api_key=KEY, base_url=fake.openai_url)
    if api == "chat":
        messages = [{"role": "user", "content": QUESTION}]
        return spo.tool_loop(run, chat, model="m", messages=messages, tools=tools, **options)
    return spo.responses_tool_loop(run, chat, model="m", input=QUESTION, tools=tools, **options)


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
@pytest.mark.parametrize(
    ("budget", "limit", "raised"),
    [
        (sp.Budget(model_calls=2), "model_calls", {"model_calls": 10}),
        (sp.Budget(cost=0.5), "cost", {"cost": 5.0}),
    ],
    ids=["turns", "cost"],
)
def test_a_loop_stops_at_its_budget_and_carries_on_once_it_is_raised(
    file_store: sp.Store, api: str, budget: sp.Budget, limit: str, raised: dict[str, Any]
) -> None:
    with FakeModelServer(SCRIPT) as fake:

        @sp.workflow(f"budgeted-{api}-{limit}", budget=budget)
        def agent(run: sp.Run) -> list[Any]:
            result = loop(api, run, fake, price=lambda reply: 0.25)
            return [result.text, result.turns]

        looked_up.clear()
        with pytest.raises(BudgetExhausted) as stopped:
            sp.start(file_store, agent, run_id="r")
        assert stopped.value.kind == limit
        assert file_store.get_run("r").status is RunStatus.STOPPED
        assert len(fake.requests) == 2  # the third request was never sent
        assert looked_up == ["A1", "A2"]  # both turns' tool calls were answered before the stop
        sp.extend_limits(file_store, "r", **raised, by="ops", reason="a longer conversation")
        assert sp.resume(file_store, "r") == ["None of them shipped.", 4]
        assert len(fake.requests) == 4
        assert fake.repeated() == []
        assert fake.orphans == []
    assert looked_up == ["A1", "A2", "A3"]
    run = file_store.get_run("r")
    assert run.model_calls_spent == 4
    assert run.cost_spent == pytest.approx(1.0)
    assert run.tokens_spent > 0  # as each provider reported them
