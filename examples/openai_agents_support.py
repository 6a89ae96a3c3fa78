"""A support agent on the OpenAI Agents SDK, made durable by safepoint — runnable with no key
and no network: the model is the fake model server (the Responses API), scripted turn by turn,
and the refund and the e-mail go to the local effect owner, which counts what it applied.

    python examples/openai_agents_support.py

The agent looks the order up (a read), refunds it (an effect that waits for a person's
approval) and e-mails the customer (an effect); its tools are declared in ``shop.py``. The demo
crashes the run at the worst moment — the owner sent the e-mail, the ledger never heard back —
and resumes it as a new worker would: ``Runner.run`` runs again from the top, the model's
answers and the tools' results come from the ledger, the e-mail is reconciled with its owner,
and nothing is asked of the model or sent twice.
"""

from __future__ import annotations

import sys

from agents import Agent, Runner
from shop import SYSTEM, demo, tools

import safepoint as sp
from safepoint.integrations import openai_agents as spoa

agent = spoa.durable(Agent(name="support", instructions=SYSTEM, model="gpt-5"), tools)


@sp.workflow("support-openai-agents", version="1")
async def support(run: sp.AsyncRun, ticket: str) -> str:
    # the client: AsyncOpenAI() with OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    result = await Runner.run(agent, ticket, run_config=spoa.run_config(), max_turns=10)
    return str(result.final_output)


if __name__ == "__main__":
    sys.exit(
        demo(
            support,
            lambda fake: {
                "OPENAI_BASE_URL": fake.openai_url,
                "OPENAI_API_KEY": "sk-test-not-real",
                "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the demo exports no traces
            },
        )
    )
