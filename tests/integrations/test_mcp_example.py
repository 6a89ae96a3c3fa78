"""``examples/mcp_support.py`` runs as a reader runs it — one command, no key, no network — and
shows what it claims; the MCP page's diff changes as few lines as it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# The example runs in processes of its own, killed and resumed: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_mcp_example_runs_and_does_everything_once() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mcp_support.py")],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0] == "crashed: the server opened the ticket, its answer was never recorded"
    assert "answer: I opened ticket T-1 for order A1." in lines
    assert "model requests per turn: {0: 1, 1: 1, 2: 1}, repeated: 0, orphaned tool calls: 0" in lines
    assert lines[-1] == "orders looked up: 1, tickets opened: 1"


def test_the_diff_that_makes_an_mcp_agent_durable_adds_eight_lines() -> None:
    page = (ROOT / "docs" / "integrations" / "mcp.md").read_text()
    diff = page.split("```diff\n", 1)[1].split("```", 1)[0].splitlines()
    added = [line for line in diff if line.startswith("+")]
    removed = [line for line in diff if line.startswith("-")]
    assert len(added) == 8, added
    assert len(removed) == 4, removed
    assert "(8 lines\nadded, 4 of them replacing lines)" in page
