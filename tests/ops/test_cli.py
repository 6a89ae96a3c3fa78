"""The `safepoint` command on a real SQLite file, and the demo run for real in a subprocess."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.errors import RunNotFound
from safepoint.ops.cli import cli
from safepoint.ops.render import ago, error_text
from safepoint.testing import run_child
from safepoint.types import EffectState, EventRecord, RunRecord, RunStatus

# rich colours its output when these say so, even into a pipe; the assertions read plain text.
_PLAIN_ENV: dict[str, str | None] = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "SAFEPOINT_URL": None,
    "COLUMNS": "80",
}


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
    receipt = run.effect("send", mail, payload={"to": name, "text": text}, operation_id=f"mail:{name}")
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
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


def line_of(text: str, first_word: str) -> str:
    matches = [line for line in text.splitlines() if line.split()[:1] == [first_word]]
    assert len(matches) == 1, f"expected one line starting {first_word!r} in:\n{text}"
    return matches[0]


def section(text: str, start: str, end: str | None = None) -> list[str]:
    """The non-empty lines after the rule titled ``start`` and before the one titled ``end``."""
    lines = text.splitlines()
    begin = next(i for i, line in enumerate(lines) if line.startswith(f"{start} ─"))
    stop = next((i for i, line in enumerate(lines) if end and line.startswith(f"{end} ─")), len(lines))
    return [line for line in lines[begin + 1 : stop] if line.strip()]


def test_runs_lists_each_run_with_its_status_and_the_phase_of_a_blocked_one(
    two_runs: sp.Store, url: str
) -> None:
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


def test_show_prints_the_header_the_steps_in_order_and_the_events(two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "show", "done")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert line_of(out, "status").split() == ["status", "completed"]
    assert line_of(out, "workflow").split() == ["workflow", "cli-test-greet@2"]
    assert '{"text":"hello ada","mail":"mail-ada"}' in line_of(out, "result")
    steps = section(out, "steps", "events")[1:]  # below the header
    assert [row.split()[:3] for row in steps] == [
        ["1", "read", "lookup"],
        ["2", "pure", "compose"],
        ["3", "effect", "send"],
    ]
    key = two_runs.load_ledger("done").operations["mail:ada"].effect_key
    assert steps[2].split()[-3:] == ["mail:ada", "accepted", key]
    events = [row.split()[1] for row in section(out, "events")[1:]]
    assert events == [
        "run.started",
        "effect.prepared",
        "effect.dispatching",
        "effect.accepted",
        "run.completed",
    ]
    assert "blocked" not in out


def test_show_puts_a_blocked_runs_reason_and_next_actions_before_its_steps(
    two_runs: sp.Store, url: str
) -> None:
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


def test_show_gives_a_failed_steps_error_in_place_of_its_result(ledger: sp.Store, url: str) -> None:
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


def test_record_of_a_run_that_is_not_blocked_fails_on_stderr(two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "record", "done")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "not blocked (status: completed)" in result.stderr


@pytest.mark.parametrize("command", ["show", "record", "resume"])
def test_an_unknown_run_is_one_clear_line_and_exit_code_1(ledger: sp.Store, url: str, command: str) -> None:
    result = invoke(url, command, "no-such-run")
    assert result.exit_code == 1
    assert result.stderr == f"error: {RunNotFound('no-such-run').message}\n"
    assert result.stdout == ""


def test_migrate_distributes_only_a_postgresql_ledger(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    result = invoke(f"sqlite:///{path}", "migrate", "--distribute", "citus")
    assert result.exit_code == 2, result.output
    assert "--distribute needs a PostgreSQL store, not 'sqlite'" in result.stderr
    assert not path.exists()  # nothing made


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


def test_resume_of_a_completed_run_prints_its_result_as_json(two_runs: sp.Store, url: str) -> None:
    result = invoke(url, "resume", "done")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"text": "hello ada", "mail": "mail-ada"}


def test_resume_of_a_blocked_run_exits_3_and_points_at_the_record(two_runs: sp.Store, url: str) -> None:
    before = two_runs.get_run("stuck")
    result = invoke(url, "resume", "stuck")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "is blocked" in result.stderr
    assert "see `safepoint record stuck`" in result.stderr
    after = two_runs.get_run("stuck")
    assert after.status is RunStatus.BLOCKED
    # it really tried again (a claim moved the run on) — without spending resume budget: a
    # blocked run has no worker to take over from
    assert after.state_revision > before.state_revision
    assert after.fence == before.fence + 1
    assert after.resume_count == before.resume_count


RESUMABLE = """
import safepoint as sp


def plus_one(n):
    return n + 1


def times_ten(n):
    return n * 10


@sp.workflow("cli-test-resumable")
def resumable(run, n):
    a = run.pure("one", plus_one, n)
    return {"value": run.pure("two", times_ten, a)}
"""


def test_resume_after_a_real_kill_imports_the_workflow_from_the_working_directory(
    tmp_path: Path, url: str, ledger: sp.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "cli_test_resumable_flow"
    assert module not in sys.modules
    (tmp_path / f"{module}.py").write_text(RESUMABLE)
    killed = run_child(
        f"{module}:resumable",
        store_url=url,
        run_id="killed",
        args=[4],
        crash_at="step.after_record:one",
        pythonpath=[str(tmp_path)],
    )
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
    assert (run.status, run.resume_count, run.fence) == (RunStatus.COMPLETED, 1, 2)


def test_resume_with_a_module_that_does_not_exist_is_a_usage_error(url: str) -> None:
    result = invoke(url, "resume", "any", "--import", "no_such_module_for_cli_tests")
    assert result.exit_code == 2
    assert "no module named 'no_such_module_for_cli_tests'" in result.stderr


@pytest.mark.parametrize(
    ("seconds", "said"), [(5, "5s ago"), (90, "1m ago"), (3 * 3600, "3h ago"), (2 * 86400, "2d ago")]
)
def test_ago_says_how_long_ago_as_a_person_would(seconds: int, said: str) -> None:
    now = 1_800_000_000_000
    assert ago(now - seconds * 1000, now) == said


def demo_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run(
        [sys.executable, "-m", "safepoint", "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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
    assert run.status is RunStatus.COMPLETED
    claims = [e for e in events if e.kind == "run.claimed"]
    # The resumer took the run from an owner that no longer existed: the first process died.
    assert len(claims) == 1
    assert claims[0].detail["took_over_from"] == starting_worker(events)
    assert (refund.state, refund.dispatch_count) == (EffectState.ACCEPTED, 1)


def starting_worker(events: list[EventRecord]) -> str | None:
    """The worker that started the run."""
    return next(e.worker for e in events if e.kind == "run.started")


# -- a command line that behaves like one ---------------------------------------------------------


def run_cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**_PLAIN_ENV, **(env or {})}, catch_exceptions=False)


def test_store_may_follow_the_command_too(two_runs: sp.Store, url: str, tmp_path: Path) -> None:
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    listed = run_cli("runs", "--store", url, env={"SAFEPOINT_URL": elsewhere})
    assert listed.exit_code == 0, listed.output
    assert line_of(listed.stdout, "done").split()[2] == "completed"
    shown = run_cli("show", "stuck", "--store", url)
    assert shown.exit_code == 0, shown.output
    assert line_of(shown.stdout, "status").split() == ["status", "blocked"]
    record = run_cli("record", "stuck", "--store", url)
    assert json.loads(record.stdout)["operation_id"] == "call:bob"
    assert run_cli("--store", url, "show", "done", "--store", url).exit_code == 0
    assert not (tmp_path / "elsewhere.db").exists()


@pytest.mark.parametrize("where", ["before and after", "twice before", "twice after"])
def test_two_different_stores_are_a_usage_error(
    two_runs: sp.Store, url: str, tmp_path: Path, where: str
) -> None:
    other = f"sqlite:///{tmp_path / 'other.db'}"
    args = {
        "before and after": ["--store", url, "runs", "--store", other],
        "twice before": ["--store", url, "--store", other, "runs"],
        "twice after": ["runs", "--store", url, "--store", other],
    }[where]
    result = run_cli(*args)
    assert result.exit_code == 2
    assert f"--store names 2 ledgers ({url!r}, {other!r}): name one" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "other.db").exists()
    assert run_cli("--store", url, "--store", url, "runs", "--store", url).exit_code == 0


LOOKING = [
    ["runs"],
    ["show", "r"],
    ["show", "r", "--json"],
    ["record", "r"],
    ["export", "r"],
    ["resume", "r"],
    ["cancel", "r", "--by", "ana"],
    ["approve", "r", "s", "--by", "ana"],
    ["revoke", "r", "s", "--by", "ana", "--reason", "why"],
    ["resolve", "r", "--abandon", "--revision", "1", "--by", "ana"],
]


@pytest.mark.parametrize("form", ["url", "path", "after"])
@pytest.mark.parametrize("command", LOOKING, ids=lambda c: " ".join(c[:1] + c[2:3]))
def test_a_command_about_runs_never_creates_a_ledger(tmp_path: Path, command: list[str], form: str) -> None:
    where = tmp_path / "typo" / "ledger.db" if form == "path" else tmp_path / "ledger.db"
    if form == "path":
        where.parent.mkdir()
    url = str(where) if form == "path" else f"sqlite:///{where}"
    args = [*command, "--store", url] if form == "after" else ["--store", url, *command]
    result = run_cli(*args)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: no ledger at '{where}': the file does not exist")
    assert "safepoint migrate" in result.stderr
    assert list(where.parent.iterdir()) == []  # no file, no -wal, no -shm


@pytest.mark.parametrize("command", LOOKING[:4], ids=lambda c: " ".join(c[:1] + c[2:3]))
def test_a_command_about_runs_never_creates_a_ledger_in_a_postgresql_schema(
    pg_url: str, command: list[str]
) -> None:
    """A schema name mistyped is no ledger either: looking at it creates neither the schema nor
    a ledger's tables in it (nor in a schema that holds something else)."""
    import psycopg

    schema = f"typo_{uuid.uuid4().hex[:12]}"
    url = f"{pg_url}?schema={schema}"
    result = run_cli(*command, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: no ledger at "), result.stderr
    assert "safepoint migrate" in result.stderr
    with psycopg.connect(pg_url) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert found == (0,)
    assert run_cli("migrate", "--store", url).exit_code == 0  # and migrate sets it up
    assert run_cli(*command, "--store", url).stderr.startswith(("", "error: no run"))


@pytest.mark.parametrize("command", LOOKING[1:], ids=lambda c: " ".join(c[:1] + c[2:3]))
def test_a_run_id_no_ledger_can_hold_is_one_clear_line(
    two_runs: sp.Store, url: str, command: list[str]
) -> None:
    """An argument that is not UTF-8 reaches the command as a lone surrogate: no run can have
    that id, and every command says so as it says it of any malformed id."""
    name, _, *rest = command
    result = run_cli("--store", url, name, "stuck\udcff", *rest)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: invalid run id 'stuck\\udcff'"), result.stderr


def test_migrate_still_creates_a_ledger_and_then_the_others_find_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert run_cli("migrate", "--store", url).exit_code == 0
    listed = run_cli("runs", "--store", url)
    assert listed.exit_code == 0
    assert listed.stdout.startswith("no runs in ")


def big_page(size: int) -> dict[str, str]:
    return {"body": "ab" * size}


@sp.workflow("cli-test-big")
def big(run: sp.Run, size: int) -> Any:
    page = run.read("page", big_page, size)
    return run.effect("send", mail, payload={"to": "ada", "text": page["body"]}, operation_id="mail:big")


def test_show_json_prints_the_whole_ledger_as_valid_json(ledger: sp.Store, url: str) -> None:
    sp.start(ledger, big, 60_000, run_id="big")  # a result stored as an artifact of its own
    result = invoke(url, "show", "big", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["run"]["run_id"] == "big"
    assert document["run"]["status"] == "completed"
    [page, send] = document["steps"]
    assert page["result"] == big_page(60_000)  # whole: nothing cut
    assert send["result"] == {"id": "mail-ada"}
    [operation] = document["operations"]
    assert operation["payload"] == {"to": "ada", "text": "ab" * 60_000}
    assert operation["effect_key"] == ledger.load_ledger("big").operations["mail:big"].effect_key
    assert [e["kind"] for e in document["events"]][-1] == "run.completed"
    assert document["ownership"]["state"] == "none"


ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def test_show_prints_times_as_utc_instants_and_how_long_ago(two_runs: sp.Store, url: str) -> None:
    out = invoke(url, "show", "done").stdout
    assert re.fullmatch(rf"created\s+{ISO} \(\d+s ago\)\s*", line_of(out, "created"))
    assert re.fullmatch(rf"updated\s+{ISO} \(\d+s ago\)\s*", line_of(out, "updated"))
    events = section(out, "events")[1:]
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", row) for row in events)


def claimed(store: sp.Store, run_id: str, owner: str, lease_ms: int) -> RunRecord:
    """``run_id`` submitted and claimed by a worker called ``owner`` (which then does nothing)."""
    sp.submit(store, greet, "ann", run_id=run_id)
    claim = store.claim_next(owner, lease_ms, ["cli-test-greet"])
    assert claim is not None
    assert claim.run_id == run_id
    return store.get_run(run_id)


def test_a_run_held_by_a_live_worker_says_until_when_readably(store: sp.Store, store_url: str) -> None:
    claimed(store, "held", "w-live", 600_000)
    listed = invoke(store_url, "runs").stdout
    row = line_of(listed, "held")
    assert row.split()[2:4] == ["running", "w-live"]
    assert "(lease ends in 9m)" in row or "(lease ends in 10m)" in row
    shown = invoke(store_url, "show", "held").stdout
    assert re.search(rf"owner\s+w-live, lease until {ISO} \(in \d+m\)", shown)
    refused = invoke(store_url, "resume", "held")
    assert refused.exit_code == 1
    assert "epoch ms" not in refused.stderr
    assert re.search(rf"{ISO} \(in \d+m\)", refused.stderr), refused.stderr


def test_a_run_whose_workers_lease_expired_is_shown_as_such(store: sp.Store, store_url: str) -> None:
    run = claimed(store, "orphan", "w-gone", 1)
    assert run.lease_expires_at is not None
    while store.now() <= run.lease_expires_at:  # the store's clock decides, as claims do
        time.sleep(0.002)
    row = line_of(invoke(store_url, "runs").stdout, "orphan")
    assert "lease expired" in row
    assert "w-gone (lease expired" in row
    assert " running " not in row
    shown = invoke(store_url, "show", "orphan").stdout
    assert line_of(shown, "status").split() == ["status", "lease", "expired", "(status", "running)"]
    assert re.search(rf"owner\s+w-gone, lease expired {ISO} \(\d+s ago\) — its worker is gone", shown)


def test_a_run_released_by_a_resolution_does_not_claim_to_be_running(store: sp.Store, store_url: str) -> None:
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, stuck, "bob", run_id="settled")
    revision = store.get_run("settled").state_revision
    done = invoke(
        store_url,
        "resolve",
        "settled",
        "--applied",
        "--receipt",
        '{"id": "c_1"}',
        "--revision",
        str(revision),
        "--by",
        "ana",
    )
    assert done.exit_code == 0, done.output
    assert "now released" in done.stdout
    run = store.get_run("settled")
    assert (run.status, run.owner) == (RunStatus.RUNNING, None)
    row = line_of(invoke(store_url, "runs").stdout, "settled")
    assert row.split()[2:4] == ["released", "(nobody)"]
    shown = invoke(store_url, "show", "settled").stdout
    assert line_of(shown, "status").split()[:2] == ["status", "released"]
    assert "released: no worker holds it" in line_of(shown, "owner")


refundable = sp.Effect("cli-test.refund", execute=lambda payload, key: {"id": "re_1"})


@sp.workflow("cli-test-approval")
def needs_approval(run: sp.Run) -> Any:
    run.read("lookup", lookup, "ada")
    return run.effect("refund", refundable, payload={"amount": 5}, approval=True)


def test_approving_a_step_that_cannot_be_approved_says_which_can(ledger: sp.Store, url: str) -> None:
    with pytest.raises(sp.AwaitingApproval):
        sp.start(ledger, needs_approval, run_id="gated")
    wrong = invoke(url, "approve", "gated", "lookup", "--by", "ana")
    assert wrong.exit_code == 1
    assert "the steps of run 'gated' that can be approved: 'refund' (the run waits for it)" in (wrong.stderr)
    sp.start(ledger, greet, "ada", run_id="done")
    nothing = invoke(url, "approve", "done", "send", "--by", "ana")
    assert nothing.exit_code == 1
    assert "no step of run 'done' can be approved now (status completed)" in nothing.stderr
    assert invoke(url, "approve", "gated", "refund", "--by", "ana").exit_code == 0
    not_given = invoke(url, "revoke", "gated", "lookup", "--by", "ana", "--reason", "oops")
    assert not_given.exit_code == 1
    assert "the steps of run 'gated' that can be revoked: 'refund'" in not_given.stderr


def test_a_file_that_holds_no_ledger_is_not_turned_into_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.close()
    before = other.read_bytes()
    for path in (empty, other):
        result = run_cli("show", "r", "--store", str(path))
        assert result.exit_code == 1
        assert result.stderr.startswith(f"error: no ledger at '{path}': the file holds no safepoint ledger")
    assert empty.read_bytes() == b""
    assert other.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "other.db"]


def test_cancelling_a_run_no_worker_holds_does_not_promise_a_worker(ledger: sp.Store, url: str) -> None:
    run = claimed(ledger, "orphan", "w-gone", 1)
    assert run.lease_expires_at is not None
    while ledger.now() <= run.lease_expires_at:
        time.sleep(0.002)
    result = invoke(url, "cancel", "orphan", "--by", "ana")
    assert result.exit_code == 0, result.output
    assert "no worker holds it now" in result.stdout
    assert "its worker stops" not in result.stdout


@pytest.mark.parametrize("quoted", ["epoch ms 1800000025000", "2027-01-15T08:00:25+00:00"])
def test_an_error_carrying_a_moment_is_printed_with_how_far_it_is(quoted: str) -> None:
    now = 1_800_000_000_000
    error = sp.SafepointError(f"held by worker 'w-1' until {quoted}; wait")
    error.lease_expires_at = now + 25_000  # type: ignore[attr-defined]  # a field any error may have
    printed = error_text(error, now)
    assert "2027-01-15T08:00:25Z (in 25s)" in printed
    assert "epoch ms" not in printed
