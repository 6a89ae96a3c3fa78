"""A support agent on the OpenAI SDK (the Responses API), made durable by safepoint — runnable
with no key and no network: the model is the fake model server, scripted turn by turn, and the
refund and the e-mail go to the local effect owner, which counts what it applied.

    python examples/openai_support.py               # or: make examples

The agent looks the order up (a read), refunds it (an effect that waits for a person's
approval) and e-mails the customer (an effect); its tools are declared in ``shop.py``. The demo
crashes the run at the worst moment — the owner sent the e-mail, the ledger never heard back —
and resumes it as a new worker would: nothing is asked of the model twice, nothing is sent
twice, and no function call goes back to the model without its output.
"""

from __future__ import annotations

import sys

import openai
from shop import SYSTEM, demo, tools

import safepoint as sp
from safepoint.integrations import openai as spo


@sp.workflow("support-openai", version="1")
def support(run: sp.Run, ticket: str) -> str:
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    result = spo.responses_tool_loop(
        run, client, model="gpt-5", instructions=SYSTEM, input=ticket, tools=tools, max_turns=10
    )
    return result.text


if __name__ == "__main__":
    sys.exit(
        demo(support, lambda fake: {"OPENAI_BASE_URL": fake.openai_url, "OPENAI_API_KEY": "sk-test-not-real"})
    )
