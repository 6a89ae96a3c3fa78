"""The typed usage file of a support agent's workflow (tests/typing/workflow_usage.py): mypy
--strict accepts it as written — every mistake it marks still caught, none of its ignores left
with nothing to ignore — and its workflows run, so the file stays the code a user writes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import safepoint as sp

ROOT = Path(__file__).parents[2]
USAGE = ROOT / "tests" / "typing" / "workflow_usage.py"


def _usage_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("workflow_usage", USAGE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a mypy run of its own, seconds long: make lint checks the same file
def test_step_types_and_marked_mistakes_check_in_user_code(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--warn-unused-ignores",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path),
            str(USAGE),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_usage_workflows_run(file_store: sp.Store) -> None:
    usage = _usage_module()
    plain = sp.start(file_store, usage.follow_up, "case-1", run_id="typed-plain")
    assert plain["ticket"].startswith("T-")
    assert plain["cheapest"] == "9.0"
    awaited = sp.start(file_store, usage.follow_up_async, "case-2", run_id="typed-async")
    assert awaited["customer"] == "c-17"
    # replayed from the ledger: the same answers
    assert sp.resume(file_store, "typed-plain") == plain
