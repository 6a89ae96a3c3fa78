"""A support agent on the Anthropic SDK, made durable by safepoint — runnable with no key and no
network: the model is the fake model server, scripted turn by turn, and the refund and the e-mail
go to the local effect owner, which counts what it applied.

    python examples/anthropic_support.py            # or: make examples

The agent looks the order up (a read), refunds it (an effect that waits for a person's
approval) and e-mails the customer (an effect); its tools are declared in ``shop.py``. The demo
crashes the run at the worst moment — the owner sent the e-mail, the ledger never heard back —
and resumes it as a new worker would: nothing is asked of the model twice, nothing is sent
twice, and no tool call goes back to the model without its result.
"""

from __future__ import annotations

import sys

import anthropic
from shop import SYSTEM, demo, tools

import safepoint as sp
from safepoint.integrations import anthropic as spa


@sp.workflow("support-anthropic", version="1")
def support(run: sp.Run, ticket: str) -> str:
    client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
    result = spa.tool_loop(
        run,
        client,
        model="claude-sonnet-4-5",
        max_tokens=1024,
        system=SYSTEM,
        messages=[{"role": "user", "content": ticket}],
        tools=tools,
        max_turns=10,
    )
    return result.text


if __name__ == "__main__":
    sys.exit(
        demo(support, lambda fake: {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "sk-test-not-real"})
    )
