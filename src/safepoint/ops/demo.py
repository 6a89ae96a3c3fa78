"""``safepoint demo``: a support agent killed at the worst moment, resumed without a double refund.

The agent works through three support tickets. For each it reads the ticket, asks a (scripted,
offline) model for a reply, decides a route, and makes changes in another system — a refund and
a ticket comment at the local effect owner, a separate HTTP service that outlives the agent.

The demo SIGKILLs the agent just after the owner committed the second ticket's refund and before
the ledger recorded it: the refund happened, but the only process that knew is gone. A fresh
process resumes the run, asks the owner about the refund by its idempotency key instead of
sending it again, and finishes. The owner's own count of effects and duplicates is the proof.

The workflow is importable (``safepoint.ops.demo:support_agent``) so child processes can run it.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safepoint

from ..testing.effects import owner_effect

if TYPE_CHECKING:
    from rich.console import Console

    from ..testing.owner import OwnerService

WORKFLOW = "safepoint.ops.demo:support_agent"
RUN_ID = "support-demo"
MODEL = "scripted-support-1"

# A stand-in for the helpdesk database the agent reads from.
TICKETS: dict[str, dict[str, Any]] = {
    "T-1001": {
        "customer": "Ada",
        "order": "ord_5521",
        "amount_cents": 4900,
        "body": "I was charged twice for order ord_5521. Please refund the duplicate.",
    },
    "T-1002": {
        "customer": "Grace",
        "order": "ord_5530",
        "amount_cents": 12900,
        "body": "The lamp from order ord_5530 arrived broken. I would like a refund.",
    },
    "T-1003": {
        "customer": "Alan",
        "order": "ord_5542",
        "amount_cents": 2500,
        "body": "When will order ord_5542 arrive? I need it by Friday.",
    },
}
TICKET_IDS = list(TICKETS)

# The nastiest moment: the owner has committed the refund, the ledger does not know yet.
CRASH_AT = f"effect.after_receiver_commit:{TICKET_IDS[1]}.refund"
OPERATION = f"refund:{TICKET_IDS[1]}"

refunds = owner_effect("refunds", name="refund.create")
comments = owner_effect("tickets", name="ticket.comment", verify=True)


# -- the agent's tools ---------------------------------------------------------------------------


def fetch_ticket(ticket_id: str) -> dict[str, Any]:
    """Read one ticket from the helpdesk."""
    return {"id": ticket_id, **TICKETS[ticket_id]}


def scripted_model(
    *, model: str, messages: list[dict[str, str]], tools: Any = None, **params: Any
) -> dict[str, Any]:
    """A model without a network: its reply is a pure function of the messages."""
    ticket = messages[-1]["content"]
    name = ticket.split(" wrote: ", 1)[0].rsplit(" ", 1)[-1]
    if "refund" in ticket.lower():
        intent = "refund"
        content = f"Hi {name}, I am sorry about that. I have refunded your order in full."
    else:
        intent = "answer"
        content = f"Hi {name}, your order is on its way and should arrive within two days."
    usage = {
        "input_tokens": sum(len(m["content"].split()) for m in messages),
        "output_tokens": len(content.split()),
    }
    return {
        "reply": {"role": "assistant", "intent": intent, "content": content},
        "usage": usage,
        "model": model,
    }


def choose_route(ticket_id: str, answer: dict[str, Any]) -> dict[str, str]:
    """The planner's decision: refund the order, or just reply."""
    route = "refund" if answer["reply"]["intent"] == "refund" else "reply"
    step = "refund" if route == "refund" else "comment"
    return {"next_step_id": f"{ticket_id}.{step}", "route": route}


def _messages(ticket: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a support agent. Refund when asked; be brief."},
        {
            "role": "user",
            "content": f"Ticket {ticket['id']} about {ticket['order']}, customer"
            f" {ticket['customer']} wrote: {ticket['body']}",
        },
    ]


@safepoint.workflow("support-agent", version="1")
def support_agent(run: safepoint.Run, ticket_ids: list[str]) -> dict[str, Any]:
    """Answer each ticket; refund the ones that ask for it. Every step is in the ledger."""
    handled = []
    tokens = 0
    for tid in ticket_ids:
        ticket = run.read(f"{tid}.fetch", fetch_ticket, tid)
        answer = run.model(
            f"{tid}.draft", scripted_model, model=MODEL, messages=_messages(ticket), temperature=0
        )
        tokens += answer["usage"]["input_tokens"] + answer["usage"]["output_tokens"]
        route = run.decide(f"{tid}.route", choose_route, tid, answer)["route"]
        refund = None
        if route == "refund":
            refund = run.effect(
                f"{tid}.refund",
                refunds,
                operation_id=f"refund:{tid}",
                payload={"ticket": tid, "order": ticket["order"], "amount_cents": ticket["amount_cents"]},
            )
        comment = run.effect(
            f"{tid}.comment",
            comments,
            operation_id=f"comment:{tid}",
            payload={
                "ticket": tid,
                "body": answer["reply"]["content"],
                "refund": refund["id"] if refund else None,
            },
        )
        handled.append(
            {
                "ticket": tid,
                "route": route,
                "comment": comment["id"],
                "refund": refund["id"] if refund else None,
            }
        )
    refunded = sum(TICKETS[h["ticket"]]["amount_cents"] for h in handled if h["refund"])
    return {"tickets": handled, "refunded_cents": refunded, "model_tokens": tokens}


# -- the demonstration ---------------------------------------------------------------------------


def run_demo(*, workdir: Path | None = None, keep: bool = False, console: Console | None = None) -> int:
    """Run the whole demonstration; return the process exit code (0 only if it proved its point).

    The ledger lives in ``workdir`` (kept) or in a temporary directory (deleted unless ``keep``).
    """
    from rich.console import Console

    from ..testing.owner import OwnerService

    console = console or Console(highlight=False)
    temporary = workdir is None
    root = Path(tempfile.mkdtemp(prefix="safepoint-demo-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    # A fresh file each time, so a kept work directory never makes the demo attach to an old run.
    store_url = f"sqlite:///{root / f'demo-{uuid.uuid4().hex[:8]}.db'}"
    kept = keep or not temporary
    try:
        with OwnerService() as service:
            return _story(console, service, store_url, kept=kept)
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)


def _story(console: Console, service: OwnerService, store_url: str, *, kept: bool) -> int:
    from ..testing.kill import run_child
    from .render import events_table, print_table, timeline_table

    console.rule("[bold]safepoint demo: a support agent killed mid-refund", align="left")
    console.print(
        f"[bold]1.[/] effect owner started at {service.url} (its own process:"
        " it outlives the agent); fresh SQLite ledger",
        soft_wrap=True,
    )
    if kept:
        console.print(f"   ledger kept: safepoint --store {store_url} show {RUN_ID}", soft_wrap=True)

    console.print(
        f"[bold]2.[/] agent working on {', '.join(TICKET_IDS)} in a child process,"
        f" crash armed at [bold]{CRASH_AT}[/]",
        soft_wrap=True,
    )
    first = run_child(
        WORKFLOW,
        store_url=store_url,
        run_id=RUN_ID,
        args=[TICKET_IDS],
        crash_at=CRASH_AT,
        owner_url=service.url,
    )
    if not first.killed:
        console.print(
            f"[red]the agent was not killed (exit code {first.returncode}):"
            f" {first.outcome or first.stderr[-2000:]}",
            soft_wrap=True,
        )
        return 1
    console.print(
        f"   [bold red]✗ agent process killed (SIGKILL, exit code {first.returncode})"
        "[/] right after the owner committed the refund",
        soft_wrap=True,
    )
    store = safepoint.open_store(store_url)
    try:
        op = store.load_ledger(RUN_ID).operations.get(OPERATION)
        if op is None:
            console.print(f"[red]the ledger has no {OPERATION}: the crash came too early")
            return 1
        found = service.client.find_by_key("refunds", op.effect_key)
        console.print(
            f"   ledger: {OPERATION} is [bold yellow]{op.state.value}[/] (it may have"
            f" happened); owner: refund {found['id'] if found else '(none)'} exists"
            f" under its key {op.effect_key}",
            soft_wrap=True,
        )

        console.print("[bold]3.[/] resuming the run in a fresh process")
        second = run_child(WORKFLOW, store_url=store_url, run_id=RUN_ID, resume=True, owner_url=service.url)
        outcome = second.outcome or {"status": "crashed", "stderr": second.stderr[-2000:]}
        completed = outcome.get("status") == "completed"
        if completed:
            console.print("   [bold green]✓ completed[/], result:")
            console.print_json(data=outcome["result"])
        else:
            console.print(f"   [bold red]✗ the resumed run did not complete:[/] {outcome}", soft_wrap=True)

        console.print("[bold]4.[/] the ledger, as `safepoint show` prints it")
        print_table(console, timeline_table(store.load_ledger(RUN_ID)))
        events = [e for e in store.events(RUN_ID) if e.operation_id == OPERATION or e.kind == "run.claimed"]
        console.print(f"what the ledger recorded about {OPERATION}:")
        print_table(console, events_table(events))
        dispatches = sum(e.kind == "effect.dispatching" for e in events)
        if dispatches == 1:
            console.print(
                f"{OPERATION} was dispatched once: the resumed worker asked the owner"
                " by its key instead of sending it again",
                soft_wrap=True,
            )
        else:
            console.print(f"[red]{OPERATION} was dispatched {dispatches} times", soft_wrap=True)
    finally:
        store.close()
    stats = service.client.stats()
    applied, duplicates = int(stats["applied"]), int(stats["duplicates"])
    console.print(f"effects applied: {applied}, duplicates: {duplicates}", highlight=False)
    return 0 if completed and duplicates == 0 else 1
