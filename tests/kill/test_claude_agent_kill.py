"""The Claude Agent SDK on the ledger, SIGKILLed: the workflow process (and with it the Claude
Code CLI it drives) is killed inside the effect tool's dispatch, right after the owner
committed, and while the fake model server holds the request that follows the tool; each run
is resumed in fresh processes, each with a CLI config directory of its own (the CLI's session
files are gone, as on another machine).

Each trial asserts the kill test's two assertions (the result of an uninterrupted run; the
ticket created once, counted by the owner), that no model request was sent twice but the one
whose reply the kill lost, and that no request carried a tool call without its result.

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

pytestmark = pytest.mark.kill

TESTS = Path(__file__).resolve().parents[1]
TURNS = 3  # the script's turns (tests/claude_agent_flows.py: SCRIPT)
SOCKET_DIRS = ("/var/run/postgresql", "/run/postgresql", "/tmp")

# (crash point, requests a resume may send again)
SQLITE = [
    ("effect.after_receiver_commit:tool", 1),  # the owner committed, the receipt lost
    ("in-flight@1", 1),  # killed while the fake holds the request after the tool's result
]
POSTGRES = [("effect.after_receiver_commit:tool", 1)]


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
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check(report: dict[str, Any], specs: list[tuple[str, int]]) -> None:
    assert report["reference"] == {"status": "completed", "result": {"answer": "Ticket created."}}
    assert report["applied"] == 1
    assert [t["spec"] for t in report["trials"]] == [spec for spec, _ in specs]
    for trial, (spec, again) in zip(report["trials"], specs, strict=True):
        assert trial["killed"], f"the crash point {spec} was never reached"
        assert trial["problem"] is None, trial["problem"]  # same result, the ticket made once
        assert trial["repeated"] <= again, trial
        assert trial["sent"] - trial["repeated"] <= TURNS + again, (
            trial
        )  # each turn asked once (but the lost one)
    assert report["orphans"] == 0  # no request carried a tool call without its result


def test_the_claude_agent_killed_inside_a_turn_resumes_on_sqlite(tmp_path: Path) -> None:
    check(trials(tmp_path, "sqlite", SQLITE), SQLITE)


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
