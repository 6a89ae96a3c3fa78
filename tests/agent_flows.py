"""Support agents on the real SDKs, for the kill tests (importable as ``agent_flows``).

One conversation, scripted at the fake model server (``SCRIPT``), runs through each SDK's tool
loop: the model looks the order up (a read), refunds it and e-mails the customer in one turn
(two effects, parallel tool use), e-mails the manager, then answers. The effects go to the local
effect owner (``$SAFEPOINT_OWNER_URL``), which counts what it applied; the model server is at
``$SAFEPOINT_FAKE_MODEL_URL``.

Step ids: the model steps are ``model``, ``model#2``, …; each tool call is ``tool.<call id>``,
so ``step.after_record:model#2`` or ``effect.after_dispatching:tool`` aim a kill.
"""

from __future__ import annotations

import os
from typing import Any

import safepoint as sp
from safepoint.integrations.tools import Tools
from safepoint.testing import Turn, owner_effect

FAKE_MODEL_URL_ENV = "SAFEPOINT_FAKE_MODEL_URL"
ORDERS = {"A1": {"order_id": "A1", "customer": "ada@example.com", "total_cents": 4200}}

SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(
        ("refund", {"order_id": "A1", "amount_cents": 4200}),
        ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": "Refunded 42.00."}),
    ),
    Turn.tool_calls(
        ("send_email", {"to": "manager@example.com", "subject": "Refund A1", "body": "Refunded A1 in full."})
    ),
    Turn.text("Refunded order A1 and told Ada and her manager."),
]
TICKET = "Order A1 never arrived; please refund it."
SYSTEM = "You are a support agent. Refund orders that did not arrive."

refunds = owner_effect("refunds", name="refunds")
emails = owner_effect("tickets", name="emails")  # the owner files e-mails as tickets (it can look them up)
tools = Tools()


@tools.read
def get_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    return ORDERS[order_id]


tools.add(
    "refund",
    "effect",
    effect=refunds,
    key_fields=("order_id",),
    description="Refund an order to the customer.",
    schema={
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
        "required": ["order_id", "amount_cents"],
    },
)
tools.add(
    "send_email",
    "effect",
    effect=emails,
    key_fields=("to", "subject"),
    description="Send an e-mail.",
    schema={
        "type": "object",
        "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
        "required": ["to", "subject", "body"],
    },
)


# Each request names the process that sent it, so that a kill test can SIGKILL that process from
# the fake server while its request is in flight (a header: never part of the request's hash).
PID_HEADER = "x-kill-test-pid"


def _url() -> str:
    return os.environ[FAKE_MODEL_URL_ENV]


def _headers() -> dict[str, str]:
    return {PID_HEADER: str(os.getpid())}


def _ending(result: Any) -> dict[str, Any]:
    return {
        "text": result.text,
        "stop": result.stop,
        "turns": result.turns,
        "messages": len(result.transcript),
    }


@sp.workflow("support-anthropic", version="1")
def support_anthropic(run: sp.Run, ticket: str) -> dict[str, Any]:
    import anthropic

    from safepoint.integrations import anthropic as spa

    client = anthropic.Anthropic(api_key="sk-test-not-real", base_url=_url(), default_headers=_headers())
    result = spa.tool_loop(
        run,
        client,
        model="claude-test",
        max_tokens=1024,
        system=SYSTEM,
        messages=[{"role": "user", "content": ticket}],
        tools=tools,
    )
    return _ending(result)


@sp.workflow("support-anthropic-async", version="1")
async def support_anthropic_async(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    import anthropic

    from safepoint.integrations import anthropic as spa

    client = anthropic.AsyncAnthropic(api_key="sk-test-not-real", base_url=_url(), default_headers=_headers())
    result = await spa.tool_loop_async(
        run,
        client,
        model="claude-test",
        max_tokens=1024,
        system=SYSTEM,
        messages=[{"role": "user", "content": ticket}],
        tools=tools,
    )
    return _ending(result)


@sp.workflow("support-openai-chat", version="1")
def support_openai_chat(run: sp.Run, ticket: str) -> dict[str, Any]:
    import openai

    from safepoint.integrations import openai as spo

    client = openai.OpenAI(api_key="sk-test-not-real", base_url=_url() + "/v1", default_headers=_headers())
    result = spo.tool_loop(
        run,
        client,
        model="gpt-test",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ticket}],
        tools=tools,
    )
    return _ending(result)


@sp.workflow("support-openai-responses", version="1")
def support_openai_responses(run: sp.Run, ticket: str) -> dict[str, Any]:
    import openai

    from safepoint.integrations import openai as spo

    client = openai.OpenAI(api_key="sk-test-not-real", base_url=_url() + "/v1", default_headers=_headers())
    result = spo.responses_tool_loop(
        run,
        client,
        model="gpt-test",
        instructions=SYSTEM,
        input=[{"role": "user", "content": ticket}],
        tools=tools,
    )
    return _ending(result)
