"""The Claude Agent SDK on the ledger, SIGKILLed: the workflow process (and with it the Claude
Code CLI it drives) is killed while the fake model server holds the first request and the one
after the tool's result, with the tool's intent recorded and the call not made, inside the
effect's dispatch right after the owner committed, after the CLI ended but before its segment
was recorded, and before the run completed. Each run is resumed in fresh processes, each with a
CLI config directory of its own (the CLI's session files are gone, as on another machine).

The case to beat, killed: a run whose budget (``max_budget_usd``) its first turn spends, so
the CLI runs the ticket's tool and stops (``error_max_budget_usd``) before recording its
result, killed with the tool's intent recorded, inside its effect after the owner committed,
after the stop but before it was recorded, or — once the budget was raised — while the fake
holds the resumed session's request. The ticket is made once and every request
after the tool's turn shows the model the ticket's receipt, never "outcome is unknown".

Which of the CLI's transcript batches reach the ledger before a kill is a matter of timing:
usually none before the tool runs, sometimes the prompt's. The "lost:" trials fix the second
timing (``claude_agent_flows.py``: the hook waits for the prompt's batch, and the batches
from the model's reply on die with the process): the resumed CLI finds the prompt
unanswered, and the call the hook let through must be put back in its transcript, with its
receipt, or the run ends with the effect dispatching and the model never told.

Each trial asserts the kill test's two assertions (the result of an uninterrupted run; the
ticket created once, counted by the owner), that no model request was asked twice (the same
messages) but the one whose reply the kill lost, and that no request carried a tool call
without its result. A killed workflow's CLI outlives it for a moment and may send one more
request (with the tool's call failed: its handler died with the workflow); nothing of it
reaches the ledger or the owner.

The whole trial runs inside a network namespace with only loopback (``unshare -n``): the CLI
must reach nothing but the fake. PostgreSQL listens on the host's 127.0.0.1, out of the
namespace's reach; its Unix socket is a file, which a network namespace does not hide, so the
PostgreSQL trial reaches the server through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

# Each store's trials run in one namespace, one CLI run after another: minutes, not seconds.
pytestmark = [pytest.mark.kill, pytest.mark.timeout(900)]

TESTS = Path(__file__).resolve().parents[1]
TURNS = 5  # the script's turns (tests/claude_agent_flows.py: SCRIPT)
SOCKET_DIRS = ("/var/run/postgresql", "/run/postgresql", "/tmp")

# (crash point, requests a resume may ask again). "budget:" trials run the query on a budget
# its first turn spends (the case to beat), raised once the run stopped.
SQLITE = [
    ("in-flight@0", 1),  # killed while the model "generates" the tool call
    ("step.after_record:claude.intent", 1),  # the intent recorded, the tool not started
    ("effect.after_dispatching:tool", 1),  # "may have been sent" durable, not sent
    ("effect.after_receiver_commit:tool", 1),  # the owner committed, the receipt lost
    ("in-flight@1", 1),  # killed while the fake holds the request after the tool's result
    ("step.before_record:claude.query", 0),  # the CLI ended, its segment not recorded
    ("run.before_complete", 0),  # the workflow returned, its completion not recorded
    ("lost:effect.after_dispatching:tool", 1),  # of the transcript only the prompt's batch kept
    ("budget:step.after_record:claude.intent", 1),  # the stopping turn's tool not started
    ("budget:effect.after_receiver_commit:tool", 1),  # inside the stopping turn's effect
    ("budget:step.before_record:claude.query", 0),  # stopped at the budget, the stop lost
    ("budget:in-flight@2", 1),  # the budget raised, the resumed session killed mid-request
    ("budget:lost:effect.after_receiver_commit:tool", 1),  # so, and only the prompt's batch kept
]
# Every point above runs on SQLite; PostgreSQL, where only the store differs, runs a sample
# of three: one of each kind of trial (plain, at the budget, with the transcript's batch lost).
POSTGRES = [
    ("effect.after_receiver_commit:tool", 1),
    ("budget:step.before_record:claude.query", 0),
    ("budget:lost:effect.after_receiver_commit:tool", 1),
]


def _namespace_problem() -> str | None:
    made = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=10, check=False)
    return None if made.returncode == 0 else f"unshare -n failed: {made.stderr.strip()} (it needs root)"


def trials(work: Path, store: str, specs: list[tuple[str, int]]) -> dict[str, Any]:
    """Run ``claude_agent_flows.py kill`` in a loopback-only namespace; its JSON report."""
    problem = _namespace_problem()
    if problem is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"{problem}; CI is set, so this is a failure, not a skip")
        pytest.skip(problem)
    flows = TESTS / "claude_agent_flows.py"
    points = " ".join(f'"{spec}"' for spec, _ in specs)
    command = f'ip link set lo up && exec "{sys.executable}" "{flows}" kill "{work}" "{store}" {points}'
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", command],
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check(report: dict[str, Any], specs: list[tuple[str, int]]) -> None:
    assert report["reference"] == {"status": "completed", "result": {"answer": "Ticket created."}}
    assert report["applied"] == 1
    assert report["budget_reference"]["stops"] == 1  # the uninterrupted run stopped at its budget...
    assert report["budget_reference"]["final"] == report["reference"]  # ...and ended once raised
    assert [t["spec"] for t in report["trials"]] == [spec for spec, _ in specs]
    for trial, (spec, again) in zip(report["trials"], specs, strict=True):
        assert trial["killed"], f"the crash point {spec} was never reached"
        assert trial["problem"] is None, trial["problem"]  # same result, the ticket made once
        assert trial["repeated"] <= again, trial
        assert trial["sent"] - trial["repeated"] <= TURNS, trial  # each turn asked once (but the lost one)
        assert trial["unknown"] == 0, trial  # never "outcome is unknown"
        assert trial["receipt"][-1], trial  # the request that finished the run showed the receipt
        if spec.startswith("budget:"):
            assert trial["stops"] == 1, trial  # the budget stop survived the kill
    assert report["orphans"] == 0  # no request carried a tool call without its result


# The SQLite trials in two halves, which make test runs in two processes at once (its SPREAD):
# each half makes its own uninterrupted runs to compare with, a minute of the CLI, and the two
# together end in about half the time one took.
@pytest.mark.parametrize("half", [0, 1])
def test_the_claude_agent_killed_inside_a_turn_resumes_on_sqlite(tmp_path: Path, half: int) -> None:
    specs = SQLITE[half::2]
    check(trials(tmp_path, "sqlite", specs), specs)


def unix_socket_url(url: str) -> str:
    """``url`` (a PostgreSQL server on this host's loopback) through the server's Unix socket,
    which the loopback-only namespace can reach."""
    parts = urlsplit(url)
    port = parts.port or 5432
    found = [d for d in SOCKET_DIRS if Path(d, f".s.PGSQL.{port}").exists()]
    if parts.hostname not in ("127.0.0.1", "localhost", None) or not found:
        problem = f"no Unix socket of the PostgreSQL server at {url} in {', '.join(SOCKET_DIRS)}"
        if os.environ.get("CI"):
            raise RuntimeError(f"{problem}; CI is set, so this is a failure, not a skip")
        pytest.skip(problem)
    user = f"{parts.username}@" if parts.username else ""
    schema = f"claude_{uuid.uuid4().hex[:12]}"
    return f"postgresql://{user}{parts.path}?host={found[0]}&port={port}&schema={schema}"


def test_the_claude_agent_killed_inside_a_turn_resumes_on_postgres(tmp_path: Path, pg_url: str) -> None:
    check(trials(tmp_path, unix_socket_url(pg_url), POSTGRES), POSTGRES)
