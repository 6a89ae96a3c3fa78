"""A support agent on Pydantic AI, made durable by safepoint's durability capability — runnable
with no key and no network: the model is the fake model server, scripted turn by turn.

    python examples/pydantic_ai_support.py

The agent looks the order up (a read) and refunds it (an effect: the refund desk takes the
run's idempotency key from ``safepoint.current_effect_key()``). The demo crashes the run at the
worst moment — the desk refunded, the ledger never heard back — and resumes it as a new worker
would: the refund is reconciled with the desk, not sent again, and no model request is asked
twice.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import safepoint as sp
from safepoint.integrations import pydantic_ai as sppa
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn, crash_at

DAY = timedelta(hours=23)  # how long the desk keeps idempotency keys
refunds: dict[str, dict[str, Any]] = {}  # the refund desk: refunds by idempotency key


def find_refund(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    found = refunds.get(str(key))
    return sp.Applied(found) if found else sp.NotApplied()


def support_agent(base_url: str) -> Agent[None, str]:
    client = AsyncOpenAI(api_key="sk-test-fake", base_url=base_url, max_retries=0)
    model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, name="support", capabilities=[sppa.SafepointDurability()])

    @agent.tool_plain
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order by its id."""
        return {"id": order_id, "total_cents": 4200, "shipped": False}

    @agent.tool_plain(
        metadata=sppa.effect(
            key_fields=["order_id"], reconcile=find_refund, dedup_retention=timedelta(hours=23)
        )
    )
    def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order to the customer."""
        key = str(sp.current_effect_key())
        return refunds.setdefault(key, {"id": f"re_{len(refunds) + 1}", "order_id": order_id})

    return agent


SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("refund", {"order_id": "A1", "amount_cents": 4200})),
    Turn.text("Refunded order A1."),
]


def main() -> None:
    with FakeModelServer(SCRIPT) as fake, tempfile.TemporaryDirectory() as tmp:

        @sp.workflow("support-pydantic-ai", version="1")
        async def support(run: sp.AsyncRun, ticket: str) -> str:
            return (await support_agent(fake.openai_url).run(ticket)).output

        store = sp.open_store(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        with crash_at("effect.after_receiver_commit:tool"):  # the desk refunded; the answer is lost
            try:
                sp.start(store, support, "Order A1 never arrived.", run_id="ticket-1", lease_ms=0)
            except SimulatedCrash:
                print("crashed after the refund desk committed")
        print("answer:", sp.resume(store, "ticket-1"))  # a new worker, after the crash
        print(f"refunds at the desk: {len(refunds)}")
        print(f"model requests after the crash: {len(fake.repeated())} asked again")
        print("steps:", ", ".join(store.load_ledger("ticket-1").steps))
        store.close()


if __name__ == "__main__":
    main()
