"""What the two support examples share: the shop's tools, the conversation the fake model plays,
and the demo itself — start the run, approve the refund, crash it after the owner sent the
e-mail, resume it as a new worker would, and count what happened."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import safepoint as sp
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, OwnerService, SimulatedCrash, Turn, crash_at, owner_effect

SYSTEM = "You are a support agent. Refund orders that never arrived, then tell the customer."
TICKET = "Order A1 never arrived. Please refund it."
ORDERS = {"A1": {"order_id": "A1", "customer": "ada@example.com", "total_cents": 4200, "shipped": False}}

tools = Tools()


@tools.read
def get_order(order_id: str) -> dict:
    """Look up an order by its id: the customer, the total and whether it shipped."""
    return ORDERS[order_id]


# Both effects go to the local owner at $SAFEPOINT_OWNER_URL, with the operation's idempotency key;
# after a crash, each is looked up there by its key before anything is sent again.
tools.add(
    "refund",
    "effect",
    effect=owner_effect("refunds", name="refund"),
    key_fields=("order_id",),  # one refund per order, whatever call id the model mints
    approval=True,  # a person approves this very payload before it goes out
    description="Refund an order in full.",
    schema={
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
        "required": ["order_id", "amount_cents"],
    },
)
tools.add(
    "send_email",
    "effect",
    effect=owner_effect("tickets", name="send_email"),  # the owner files e-mails as tickets
    key_fields=("to", "subject"),
    description="Send an e-mail to a customer.",
    schema={
        "type": "object",
        "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
        "required": ["to", "subject", "body"],
    },
)


SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("refund", {"order_id": "A1", "amount_cents": 4200})),
    Turn.tool_calls(
        ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": "Refunded 42.00."})
    ),
    Turn.text("I refunded order A1 and e-mailed Ada."),
]


def demo(support: sp.Workflow, environment: Callable[[FakeModelServer], dict[str, str]]) -> int:
    """Run ``support`` through the story above against a fake model server and the local owner
    (``environment(fake)``: the variables that point the SDK at the fake); 0 if all went once."""
    workdir = Path(tempfile.mkdtemp(prefix="safepoint-example-"))
    store = sp.open_store(f"sqlite:///{workdir / 'ledger.db'}")
    with FakeModelServer(SCRIPT) as fake, OwnerService() as owner:
        os.environ.update(environment(fake), SAFEPOINT_OWNER_URL=owner.url)
        try:
            sp.start(store, support, TICKET, run_id="ticket-1")
        except sp.AwaitingApproval as waiting:
            print(f"waiting for approval: {waiting.operation_id} (payload {waiting.payload_digest[:19]}…)")
            sp.approve(store, "ticket-1", waiting.step_id, by="ana", payload_digest=waiting.payload_digest)
            print("approved by ana")
        # the second effect reached (the e-mail, after the approved refund): the owner sends it, we crash
        with crash_at("effect.after_receiver_commit:tool@2"):
            try:
                sp.resume(store, "ticket-1", lease_ms=0)
            except SimulatedCrash:
                print("crashed: the e-mail went out, its receipt was never recorded")
        answer = sp.resume(store, "ticket-1")  # a new worker: reconciles, replays, finishes
        print(f"answer: {answer}")
        stats = owner.client.stats()["by_resource"]
        print(
            f"model requests per turn: {fake.requests_per_turn()}, repeated: {len(fake.repeated())},"
            f" orphaned tool calls: {len(fake.orphans)}"
        )
        print(f"refunds applied: {stats['refunds']}, e-mails sent: {stats['tickets']}")
        ok = stats["refunds"] == 1 and stats["tickets"] == 1 and not fake.repeated() and not fake.orphans
    store.close()
    return 0 if ok else 1
