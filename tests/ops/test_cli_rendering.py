"""The terminal shows a ledger's data and never executes it: escape sequences, control
characters, bidi overrides and rich markup in ids and messages come out as visible text."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.ops.cli import cli

# An OSC title change ended by BEL, a colour, rich markup that closes a tag never opened, markup
# that opens one, a carriage return and a backspace (which overwrite what was printed), an 8-bit
# CSI (C1) that clears the screen, and a right-to-left override.
HOSTILE = "\x1b]0;pwned\x07\x1b[31m[/red][bold]x\r\x08\x9b2J\u202e"
UNSAFE = ("\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e")
SEEN = "\\x1b]0;pwned\\x07\\x1b[31m[/red][bold]x\\r\\x08\\x9b2J\\u202e"  # as printed

_PLAIN_ENV: dict[str, str | None] = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "SAFEPOINT_URL": None,
    "COLUMNS": "80",
}

RUN, STEP, OP, WORKFLOW = (f"run{HOSTILE}", f"step{HOSTILE}", f"op{HOSTILE}", f"wf{HOSTILE}")


def refuse(payload: Any, key: sp.EffectKey) -> Any:
    raise ConnectionResetError(f"reset after sending {HOSTILE}")


def look_up(name: str) -> Any:
    raise LookupError(f"no customer {HOSTILE}")


uncertain = sp.Effect("terminal-test.send", execute=refuse)
gated = sp.Effect("terminal-test.gated", execute=lambda payload, key: {"id": "g_1"})


@sp.workflow("terminal-test-stuck")
def stuck(run: sp.Run) -> Any:
    run.read("fetch-token", lambda: {"n": 1})
    return run.effect("send-token", uncertain, payload={"to": HOSTILE}, operation_id="op-token")


@sp.workflow("terminal-test-failing")
def failing(run: sp.Run) -> Any:
    return run.read("lookup", look_up, "bob")


@sp.workflow("terminal-test-gated")
def waiting(run: sp.Run) -> Any:
    return run.effect("gate", gated, payload={"note": HOSTILE}, approval=True)


def forge(path: Path, renames: dict[str, str]) -> None:
    """Rewrite ids in an SQLite ledger, as a ledger written by another tool or an older version
    may hold them: nothing that reads a ledger may trust what it finds there."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys=OFF")
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'safepoint_%'"
            )
        ]
        for table in tables:
            for column in [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]:
                if column.endswith(("run_id", "step_id", "operation_id", "chain_id")) or (
                    column == "workflow"
                ):
                    for old, new in renames.items():
                        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (new, old))
    conn.close()


@pytest.fixture
def hostile(tmp_path: Path) -> str:
    """A ledger whose ids, error messages, payloads and names carry terminal controls and
    markup: a blocked run, a failed run and a run waiting for an approval."""
    path = tmp_path / "hostile.db"
    store = sp.open_store(f"sqlite:///{path}")
    try:
        with pytest.raises(sp.NeedsReconciliation):
            sp.start(store, stuck, run_id="run-token")
        with pytest.raises(sp.StepFailed):
            sp.start(store, failing, run_id="failed-token")
        with pytest.raises(sp.AwaitingApproval):
            sp.start(store, waiting, run_id="waiting-token")
        with pytest.raises(sp.AwaitingApproval):
            sp.start(store, waiting, run_id="approved-token")
        sp.approve(store, "approved-token", "gate", by=f"ana{HOSTILE}", expires=timedelta(hours=1))
    finally:
        store.close()
    forge(
        path,
        {
            "run-token": RUN,
            "fetch-token": STEP,
            "send-token": f"send{HOSTILE}",
            "op-token": OP,
            "terminal-test-stuck": WORKFLOW,
            "failed-token": f"failed{HOSTILE}",
            "waiting-token": f"waiting{HOSTILE}",
            "approved-token": f"approved{HOSTILE}",
        },
    )
    return f"sqlite:///{path}"


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


def assert_inert(result: Result) -> None:
    """Nothing in the output is an instruction to the terminal."""
    for stream in (result.stdout, result.stderr):
        for char in UNSAFE:
            assert char not in stream, f"{char!r} reached the terminal:\n{stream!r}"


@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["show", RUN],
        ["show", f"failed{HOSTILE}"],
        ["show", f"waiting{HOSTILE}"],
        ["show", f"approved{HOSTILE}"],
    ],
)
def test_ids_messages_and_payloads_are_printed_as_visible_escapes(hostile: str, command: list[str]) -> None:
    result = invoke(hostile, *command)
    assert result.exit_code == 0, result.output
    assert_inert(result)
    assert "\\x1b]0;pwned\\x07\\x1b[31m" in result.stdout
    assert "[/red][bold]x" in result.stdout  # markup is text: neither a crash nor a style


def test_show_prints_every_hostile_value_of_a_run_visibly(hostile: str) -> None:
    out = invoke(hostile, "show", RUN).stdout
    assert f"run{SEEN}" in out
    assert f"wf{SEEN}@1" in out
    assert f"step{SEEN}" in out
    assert f"op{SEEN}" in out
    failed = invoke(hostile, "show", f"failed{HOSTILE}").stdout
    assert f"LookupError: no customer {SEEN}" in failed
    approved = invoke(hostile, "show", f"approved{HOSTILE}").stdout
    assert f"approved by ana{SEEN}" in approved
    waiting = invoke(hostile, "show", f"waiting{HOSTILE}").stdout
    assert '"note": "\\u001b]0;pwned\\u0007' in waiting  # the payload, as JSON escapes it


@pytest.mark.parametrize(
    "command", [["show", RUN, "--json"], ["record", RUN], ["show", f"waiting{HOSTILE}", "--json"]]
)
def test_json_output_escapes_them_the_json_way_and_keeps_every_value(
    hostile: str, command: list[str]
) -> None:
    result = invoke(hostile, *command)
    assert result.exit_code == 0, result.output
    assert_inert(result)
    document = json.loads(result.stdout)
    assert any(HOSTILE in text for text in strings(document))  # read back whole and exact
    assert "\\u009b2J\\u202e" in result.stdout


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*strings(list(value)), *strings(list(value.values()))]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


def test_errors_that_quote_hostile_values_are_escaped_too(hostile: str) -> None:
    missing = invoke(hostile, "show", f"nope{HOSTILE}")
    assert missing.exit_code == 1
    assert_inert(missing)
    assert f"no run 'nope{SEEN}'" in missing.stderr.replace("\\\\", "\\")
    failed = invoke(hostile, "resume", f"failed{HOSTILE}")
    assert failed.exit_code == 1
    assert_inert(failed)
    assert "\\x1b]0;pwned" in failed.stderr
    refused = invoke(hostile, "approve", RUN, f"nope{HOSTILE}", "--by", "ana")
    assert refused.exit_code == 1
    assert_inert(refused)


def test_a_real_terminal_process_receives_no_control_bytes(hostile: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "SAFEPOINT_URL")}
    for args in (["show", RUN], ["runs"], ["show", f"nope{HOSTILE}"]):
        done = subprocess.run(
            [sys.executable, "-m", "safepoint", "--store", hostile, *args],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        assert b"Traceback" not in done.stderr
        for stream in (done.stdout, done.stderr):
            for char in UNSAFE:
                assert char.encode() not in stream


def test_the_workers_log_lines_are_escaped_too(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    store = sp.open_store(f"sqlite:///{path}")
    try:
        sp.submit(store, failing, run_id="queued-token")
    finally:
        store.close()
    forge(path, {"queued-token": f"queued{HOSTILE}"})
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "SAFEPOINT_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "safepoint",
            "worker",
            "--store",
            str(path),
            "--import",
            "test_cli_rendering",
            "--until-idle",
        ],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"failed 1" in done.stderr
    assert f"run queued{SEEN}".encode() in done.stderr
    for char in UNSAFE:
        assert char.encode() not in done.stderr
