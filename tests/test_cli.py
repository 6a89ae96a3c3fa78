"""The `safepoint` command on a real SQLite file, and the demo run for real in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.cli import ago, cli
from safepoint.testing.kill import run_child

# rich colours its output when these say so, even into a pipe; the assertions read plain text.
_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None,
                                     "SAFEPOINT_URL": None, "COLUMNS": "80"}


def lookup(name: str) -> dict[str, str]:
    return {"name": name, "greeting": "hello"}


def compose(person: dict[str, str]) -> str:
    return f"{person['greeting']} {person['name']}"


def send_mail(payload: Any, key: sp.EffectKey) -> dict[str, str]:
    return {"id": f"mail-{payload['to']}"}


def lose_connection(payload: Any, key: sp.EffectKey) -> dict[str, str]:
    raise ConnectionResetError("connection reset after the request was sent")


mail = sp.Effect("cli-test.mail", execute=send_mail)
# No reconcile: when the call fails after sending, nobody can say whether it happened.
unreachable = sp.Effect("cli-test.unreachable", execute=lose_connection)


@sp.workflow("cli-test-greet", version="2")
def greet(run: sp.Run, name: str) -> dict[str, str]:
    # Step ids out of alphabetical order, so the timeline's order can only come from seq.
    person = run.read("lookup", lookup, name)
    text = run.pure("compose", compose, person)
    receipt = run.effect("send", mail, payload={"to": name, "text": text},
                         operation_id=f"mail:{name}")
    return {"text": text, "mail": receipt["id"]}


@sp.workflow("cli-test-stuck")
def stuck(run: sp.Run, name: str) -> Any:
    run.read("fetch", lookup, name)
    return run.effect("send", unreachable, payload={"to": name}, operation_id=f"call:{name}")


def no_such_customer(name: str) -> dict[str, str]:
    raise LookupError(f"no customer named {name}")


@sp.workflow("cli-test-failing")
def failing(run: sp.Run, name: str) -> Any:
    return run.read("lookup", no_such_customer, name)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture
def ledger(url: str) -> Iterator[sp.Store]:
    store = sp.open_store(url)
    yield store
    store.close()


@pytest.fixture
def two_runs(ledger: sp.Store) -> sp.Store:
    """A completed run "done" and a run "stuck" blocked on an uncertain effect."""
    sp.start(ledger, greet, "ada", run_id="done")
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(ledger, stuck, "bob", run_id="stuck")
    return ledger


def invoke(url: str, *args: str) -> Result:
    # catch_exceptions=False: a traceback anywhere fails the test instead of hiding in Result.
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV,
                              catch_exceptions=False)


def line_of(text: str, first_word: str) -> str:
    matches = [line for line in text.splitlines() if line.split()[:1] == [first_word]]
    assert len(matches) == 1, f"expected one line starting {first_word!r} in:\n{text}"
    return matches[0]


def section(text: str, start: str, end: str | None = None) -> list[str]:
    """The non-empty lines after the rule titled ``start`` and before the one titled ``end``."""
    lines = text.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.startswith(f"{start} ─"))
    stop = next((i for i, line in enumerate(lines) if end and line.startswith(f"{end} ─")),
                len(lines))
    return [line for line in lines[begin + 1:stop] if line.strip()]


def test_runs_lists_each_run_with_its_status_and_the_phase_of_a_blocked_one(
        two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "runs")
    assert result.exit_code == 0, result.output
    done = line_of(result.stdout, "done").split()
    assert done[1:5] == ["cli-test-greet@2", "completed", "0", "1"]
    blocked = line_of(result.stdout, "stuck").split()
    assert blocked[1:3] == ["cli-test-stuck@1", "blocked"]
    assert blocked[-1] == "reconcile_effect"


def test_runs_filters_by_status_and_limits(two_runs: sp.Store, url: str) -> None:
    only_blocked = invoke(url, "runs", "--status", "blocked").stdout
    assert "stuck" in only_blocked
    assert "done" not in only_blocked
    limited = invoke(url, "runs", "--limit", "1").stdout.splitlines()
    assert len(limited) == 2  # the header and one run
    assert "no failed runs" in invoke(url, "runs", "--status", "failed").stdout


def test_show_prints_the_header_the_steps_in_order_and_the_events(
        two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "show", "done")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert line_of(out, "status").split() == ["status", "completed"]
    assert line_of(out, "workflow").split() == ["workflow", "cli-test-greet@2"]
    assert '{"text":"hello ada","mail":"mail-ada"}' in line_of(out, "result")
    steps = section(out, "steps", "events")[1:]  # below the header
    assert [row.split()[:3] for row in steps] == [
        ["1", "read", "lookup"], ["2", "pure", "compose"], ["3", "effect", "send"]]
    key = two_runs.load_ledger("done").operations["mail:ada"].effect_key
    assert steps[2].split()[-3:] == ["mail:ada", "accepted", key]
    events = [row.split()[1] for row in section(out, "events")[1:]]
    assert events == ["run.started", "effect.prepared", "effect.dispatching", "effect.accepted",
                      "run.completed"]
    assert "blocked" not in out


def test_show_puts_a_blocked_runs_reason_and_next_actions_before_its_steps(
        two_runs: sp.Store, url: str) -> None:
    out = invoke(url, "show", "stuck").stdout
    record = two_runs.get_run("stuck").recovery_record
    assert record is not None
    steps_at = out.index("steps ─")
    assert out.index("blocked: reconcile_effect") < steps_at
    assert out.index(record["reason"]) < steps_at
    revision = str(record["state_revision"])
    for action in record["next_actions"]:  # as commands to copy: this run, this revision
        filled = action.replace("RUN", "stuck").replace("<state_revision>", revision)
        assert out.index(filled) < steps_at
    assert f"safepoint resolve stuck --abandon --revision {revision} --by <you>" in out
    # The uncertain operation has no step row yet: it is listed as in flight, state unknown.
    in_flight = section(out, "steps", "events")[-1].split()
    assert in_flight[:3] == ["…", "effect", "send"]
    assert in_flight[-3:-1] == ["call:bob", "unknown"]


def test_show_gives_a_failed_steps_error_in_place_of_its_result(
        ledger: sp.Store, url: str) -> None:
    with pytest.raises(sp.SafepointError):
        sp.start(ledger, failing, "zed", run_id="failed")
    out = invoke(url, "show", "failed").stdout
    assert line_of(out, "status").split() == ["status", "failed"]
    [row] = section(out, "steps", "events")[1:]
    assert row.split()[:3] == ["1", "read", "lookup"]
    assert "✗ LookupError: no customer named zed" in row


def test_record_prints_the_recovery_record_as_json(two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "record", "stuck")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == two_runs.get_run("stuck").recovery_record
    assert printed["phase"] == "reconcile_effect"
    assert printed["operation_id"] == "call:bob"


def test_record_of_a_run_that_is_not_blocked_fails_on_stderr(
        two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "record", "done")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "not blocked (status: completed)" in result.stderr


@pytest.mark.parametrize("command", ["show", "record", "resume"])
def test_an_unknown_run_is_one_clear_line_and_exit_code_1(url: str, command: str) -> None:
    result = invoke(url, command, "no-such-run")
    assert result.exit_code == 1
    assert result.stderr == f"error: {sp.RunNotFound('no-such-run').message}\n"
    assert result.stdout == ""


def test_migrate_creates_the_store_and_prints_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    result = invoke(f"sqlite:///{path}", "migrate")
    assert result.exit_code == 0, result.output
    assert path.exists()
    store = sp.open_store(f"sqlite:///{path}")
    try:
        version = store.schema_version()  # type: ignore[attr-defined, unused-ignore]
    finally:
        store.close()
    assert version >= 1
    assert result.stdout.startswith(f"schema version {version} ")


def test_resume_of_a_completed_run_prints_its_result_as_json(
        two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "resume", "done")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"text": "hello ada", "mail": "mail-ada"}


def test_resume_of_a_blocked_run_exits_3_and_points_at_the_record(
        two_runs: sp.Store, url: str) -> None:
    before = two_runs.get_run("stuck")
    result = invoke(url, "resume", "stuck")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "is blocked" in result.stderr
    assert "see `safepoint record stuck`" in result.stderr
    after = two_runs.get_run("stuck")
    assert after.status is sp.RunStatus.BLOCKED
    # it really tried again (a claim moved the run on) — without spending resume budget: a
    # blocked run has no worker to take over from
    assert after.state_revision > before.state_revision
    assert after.fence == before.fence + 1
    assert after.resume_count == before.resume_count


RESUMABLE = '''
import safepoint as sp


def plus_one(n):
    return n + 1


def times_ten(n):
    return n * 10


@sp.workflow("cli-test-resumable")
def resumable(run, n):
    a = run.pure("one", plus_one, n)
    return {"value": run.pure("two", times_ten, a)}
'''


def test_resume_after_a_real_kill_imports_the_workflow_from_the_working_directory(
        tmp_path: Path, url: str, ledger: sp.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    module = "cli_test_resumable_flow"
    assert module not in sys.modules
    (tmp_path / f"{module}.py").write_text(RESUMABLE)
    killed = run_child(f"{module}:resumable", store_url=url, run_id="killed", args=[4],
                       crash_at="step.after_record:one", pythonpath=[str(tmp_path)])
    assert killed.killed, killed.stderr

    # Without the module this process has no such workflow: one line that says --import.
    missing = invoke(url, "resume", "killed")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: workflow 'cli-test-resumable' is not registered")
    assert "--import" in missing.stderr

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # resume adds the working directory
    result = invoke(url, "resume", "killed", "--import", module)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"value": 50}
    run = ledger.get_run("killed")
    assert (run.status, run.resume_count, run.fence) == (sp.RunStatus.COMPLETED, 1, 2)


def test_resume_with_a_module_that_does_not_exist_is_a_usage_error(url: str) -> None:
    result = invoke(url, "resume", "any", "--import", "no_such_module_for_cli_tests")
    assert result.exit_code == 2
    assert "no module named 'no_such_module_for_cli_tests'" in result.stderr


@pytest.mark.parametrize(("seconds", "said"), [(5, "5s ago"), (90, "1m ago"),
                                               (3 * 3600, "3h ago"), (2 * 86400, "2d ago")])
def test_ago_says_how_long_ago_as_a_person_would(seconds: int, said: str) -> None:
    now = 1_800_000_000_000
    assert ago(now - seconds * 1000, now) == said


def demo_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run([sys.executable, "-m", "safepoint", "demo", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.kill
def test_demo_kills_the_agent_and_no_effect_is_repeated() -> None:
    done = demo_process()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "effects applied: 5, duplicates: 0"
    assert any("killed (SIGKILL, exit code -9)" in line for line in lines)
    assert "ledger kept" not in done.stdout  # a temporary work dir is neither shown nor kept


@pytest.mark.kill
def test_demo_ledger_shows_a_dead_worker_taken_over_and_one_dispatch(tmp_path: Path) -> None:
    done = demo_process("--workdir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    [db] = tmp_path.glob("demo-*.db")
    store = sp.open_store(f"sqlite:///{db}")
    try:
        run = store.get_run("support-demo")
        events = store.events("support-demo")
        refund = store.load_ledger("support-demo").operations["refund:T-1002"]
    finally:
        store.close()
    assert run.status is sp.RunStatus.COMPLETED
    claims = [e for e in events if e.kind == "run.claimed"]
    # The resumer took the run from an owner that no longer existed: the first process died.
    assert len(claims) == 1
    assert claims[0].detail["took_over_from"] == starting_worker(events)
    assert (refund.state, refund.dispatch_count) == (sp.EffectState.ACCEPTED, 1)


def starting_worker(events: list[sp.EventRecord]) -> str | None:
    """The worker that started the run."""
    return next(e.worker for e in events if e.kind == "run.started")
