"""A support agent on the Claude Agent SDK, made durable by safepoint — runnable with no key and
no network: the bundled Claude Code CLI talks to the fake model server on loopback, and the
ticket desk is a local file that counts what it created.

    python examples/claude_agent_support.py            # or: make examples

The CLI must reach nothing but the fake, so the example runs itself inside a network namespace
whose only interface is loopback (``unshare -n``, which needs root or CAP_SYS_ADMIN); where
that cannot be made it says so and exits 2.

The story is the case the plain SDK gets wrong: the run's budget runs out on the turn that
creates the ticket. The CLI runs the tool and stops before recording its result; resumed, the
plain SDK would tell the model the call's "outcome is unknown". Here the run stops
(``stopped``), a person raises its budget (``safepoint.extend_limits``), and the resumed session
gets the tool's receipt from the ledger: one ticket, and the model sees it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions

import safepoint as sp
from safepoint.integrations import claude_agent as spc
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, Turn

INSIDE = "SAFEPOINT_EXAMPLE_LOOPBACK_ONLY"  # set by the re-exec: do not try again
SCRIPT = [
    Turn.tool_calls(("mcp__tools__create_ticket", {"title": "Refund A1"})),
    Turn.text("I opened ticket T-1 for the refund of order A1."),  # had it not stopped
    Turn.text("I opened ticket T-1 for the refund of order A1."),  # resumed: "continue"
]


class Desk:
    """The tickets' owner: one line per ticket in a file, deduplicated by idempotency key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def tickets(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def create(self, title: str, idempotency_key: str) -> dict[str, Any]:
        for ticket in self.tickets():
            if ticket["key"] == idempotency_key:
                return ticket  # the same request again: the same ticket
        ticket = {"id": f"T-{len(self.tickets()) + 1}", "title": title, "key": idempotency_key}
        with self.path.open("a") as f:
            f.write(json.dumps(ticket) + "\n")
        return ticket


workdir = Path(tempfile.mkdtemp(prefix="safepoint-example-"))
desk = Desk(workdir / "tickets.jsonl")
tools = Tools()


@tools.effect(key_fields=("title",))
def create_ticket(title: str, key: sp.EffectKey) -> dict[str, Any]:
    """Create a support ticket."""
    return desk.create(title, idempotency_key=str(key))


@sp.workflow("support-claude", budget=sp.Budget(cost=0.01))  # too little for the whole query
async def support(run: sp.AsyncRun, ticket: str) -> str:
    result = await spc.query(run, ticket, tools=tools, base=ClaudeAgentOptions(env=cli_env, cwd=str(workdir)))
    return str(result["result"])


cli_env: dict[str, str] = {}


async def main() -> int:
    store = sp.open_store(f"sqlite:///{workdir / 'ledger.db'}")
    with FakeModelServer(SCRIPT) as fake:
        cli_env.update(
            ANTHROPIC_BASE_URL=fake.url,
            ANTHROPIC_API_KEY="sk-ant-not-real",
            CLAUDE_CONFIG_DIR=str(workdir / "claude"),  # the CLI's own files: none we rely on
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_TELEMETRY="1",
        )
        try:
            await sp.start_async(store, support, "Refund order A1", run_id="ticket-1")
        except sp.LimitReached as stop:
            print(f"stopped: {type(stop).__name__} (the CLI spent the run's budget on the ticket's turn)")
        print(f"run status: {store.get_run('ticket-1').status.value}, tickets so far: {len(desk.tickets())}")
        await sp.extend_limits_async(store, "ticket-1", cost=1.0, by="ana", reason="a longer answer")
        print("budget raised by ana")
        answer = await sp.resume_async(store, "ticket-1")  # the session resumes, from the ledger
        print(f"answer: {answer}")
        bodies = [json.dumps(r.body) for r in fake.requests]
        receipt = '\\"T-1\\"' in bodies[-1] or '"T-1"' in bodies[-1]
        unknown = any("outcome is unknown" in b for b in bodies)
        print(
            f"the resumed session saw the ticket's receipt: {receipt},"
            f" was told its outcome is unknown: {unknown}"
        )
        repeated, orphans = len(fake.repeated()), len(fake.orphans)
        print(f"model requests: {len(bodies)}, repeated: {repeated}, orphaned tool calls: {orphans}")
    tickets = len(desk.tickets())
    print(f"tickets created: {tickets}")
    store.close()
    return 0 if tickets == 1 and receipt and not unknown and not repeated and not orphans else 1


def loopback_only() -> bool:
    """Whether this process's only network interface is loopback (and it is up)."""
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        return False
    with socket.socket() as probe:  # lo exists in a fresh namespace, but down until set up
        try:
            probe.bind(("127.0.0.1", 0))
        except OSError:
            return False
    return True


def in_loopback_namespace() -> int:
    """Run this file again inside ``unshare -n`` with loopback up; its exit code, or 2 (with
    the reason) where no such namespace can be made."""
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing or os.environ.get(INSIDE):
        why = f"{' and '.join(missing)} not found" if missing else "the namespace has other interfaces"
        print(f"cannot run: the Claude Code CLI must reach only the fake model server, on loopback ({why})")
        return 2
    command = 'ip link set lo up && exec "$0" "$@"'
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", command, sys.executable, __file__],
        env={**os.environ, INSIDE: "1"},
        check=False,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0 and "unshare" in done.stderr:
        print(
            "cannot run: a network namespace with only loopback (unshare -n) needs root or"
            f" CAP_SYS_ADMIN, and the CLI must never reach the network: {done.stderr.strip()}"
        )
        return 2
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(asyncio.run(main()) if loopback_only() else in_loopback_namespace())
