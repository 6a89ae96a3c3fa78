"""The examples run as a reader runs them — one command each, no key, no network — and show what
they claim: each model turn asked once, no tool call without its result, the refund and the
e-mail applied once at the owner, though the run crashed after the owner sent the e-mail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow  # each example runs in a process of its own, killed and resumed
@pytest.mark.parametrize("example", ["anthropic_support.py", "openai_support.py"])
def test_the_example_runs_and_does_everything_once(example: str) -> None:
    ran = subprocess.run(
        [sys.executable, str(EXAMPLES / example)], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("waiting for approval: refund:")
    assert "crashed: the e-mail went out, its receipt was never recorded" in lines
    assert "answer: I refunded order A1 and e-mailed Ada." in lines
    assert "model requests per turn: {0: 1, 1: 1, 2: 1, 3: 1}, repeated: 0, orphaned tool calls: 0" in lines
    assert lines[-1] == "refunds applied: 1, e-mails sent: 1"


ROOT = EXAMPLES.parent


def _diffs(page: Path) -> list[list[str]]:
    blocks, block = [], None
    for line in page.read_text().splitlines():
        if line.strip() == "```diff":
            block = []
        elif line.strip() == "```" and block is not None:
            blocks.append(block)
            block = None
        elif block is not None:
            block.append(line)
    return blocks


@pytest.mark.parametrize(
    "page",
    [
        "README.md",
        "docs/integrations/anthropic.md",
        "docs/integrations/openai.md",
        "docs/integrations/openai-agents.md",
        "docs/integrations/pydantic-ai.md",
        "docs/integrations/mcp.md",
    ],
)
def test_the_diff_that_makes_a_loop_durable_changes_at_most_ten_lines(page: str) -> None:
    diffs = _diffs(ROOT / page)
    assert diffs, f"{page} shows no diff"
    for diff in diffs:
        added = [line for line in diff if line.startswith("+")]
        assert 0 < len(added) <= 10, added
