"""``safepoint replay`` and ``safepoint check-deploy`` on every store: an unchanged workflow
exits 0, a changed one exits 6 naming the step, JSON parses, the ledger's values are printed as
data — and the ledger is never created nor written."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import replay_flows
import safepoint as sp
from safepoint.errors import RunNotFound
from safepoint.ops.cli import cli
from safepoint.ops.cli_support import EXIT_DIVERGED

_ENV: dict[str, str | None] = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "SAFEPOINT_URL": None,
    "COLUMNS": "80",
    replay_flows.VARIANT: None,
}
_IMPORT = ("--import", "replay_flows")


def invoke(url: str, *args: str, variant: str | None = None) -> Result:
    env = {**_ENV, replay_flows.VARIANT: variant}
    return CliRunner().invoke(cli, ["--store", url, *args], env=env, catch_exceptions=False)


@pytest.fixture
def ledger(store_url: str) -> Iterator[sp.Store]:
    store = sp.open_store(store_url)
    yield store
    store.close()


def _waiting(store: sp.Store, run_id: str) -> str:
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, replay_flows.order, f"o-{run_id}", run_id=run_id)
    return run_id


def _completed(store: sp.Store, run_id: str) -> str:
    _waiting(store, run_id)
    sp.send(store, run_id, "confirm", {"by": "ana"}, by="ana")
    sp.resume(store, run_id)
    return run_id


def _snapshot(store: sp.Store) -> Callable[[], Any]:
    """What the ledger holds now, read again on each call: every run, its ledger and events."""

    def read() -> Any:
        runs = store.list_runs(None, 1_000)
        return [(run, store.load_ledger(run.run_id), store.events(run.run_id)) for run in runs]

    return read


def _untouched(store: sp.Store, url: str) -> Callable[[], None]:
    """A check that nothing was written since this moment: no step function called, the ledger
    as it was (on SQLite, the file's bytes too)."""
    calls, read = dict(replay_flows.CALLS), _snapshot(store)
    before = read()
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else None
    data = path.read_bytes() if path is not None else None

    def check() -> None:
        assert calls == replay_flows.CALLS, "a step function was called by a replay"
        assert read() == before
        if path is not None:
            assert path.read_bytes() == data

    return check


def test_an_unchanged_workflow_replays_and_exits_0(ledger: sp.Store, store_url: str) -> None:
    done, waiting = _completed(ledger, "done"), _waiting(ledger, "waiting")
    untouched = _untouched(ledger, store_url)
    result = invoke(store_url, "replay", done, waiting, *_IMPORT)
    untouched()
    assert result.exit_code == 0, result.output
    first, second = result.stdout.splitlines()
    assert first.startswith(
        "done  replay-flows-order@1 → replay-flows-order@1  reached the end (6/6 steps replayed,"
    )
    assert first.endswith("carry on: the code asks what the run recorded")
    assert second.startswith("waiting  replay-flows-order@1 → replay-flows-order@1")
    assert "reached now (5/5 steps replayed, next: wait 'message:confirm' (step 'confirm'))" in second


def test_a_changed_workflow_exits_non_zero_and_names_the_step(ledger: sp.Store, store_url: str) -> None:
    _completed(ledger, "done")
    untouched = _untouched(ledger, store_url)
    result = invoke(store_url, "replay", "done", *_IMPORT, variant="prompt edited")
    untouched()
    assert result.exit_code == EXIT_DIVERGED, result.output
    head, *details = result.stdout.splitlines()
    assert "diverged (changed) at step 'plan' (1/6 steps replayed)" in head
    assert "  block (stale_checkpoint): " in head
    asked, recorded = (line for line in details if line.startswith(("  asked:", "  recorded:")))
    assert asked.startswith("  asked:    decision 'plan' (step 'plan'), input ")
    assert recorded.startswith("  recorded: decision 'plan' (step 'plan'), input ")
    assert asked.split("input ")[1] != recorded.split("input ")[1]  # the hashes differ
    ledger_hash = ledger.load_ledger("done").steps["plan"].input_hash
    assert recorded.endswith(f"input {ledger_hash[:12]}…")


def test_replay_json_is_the_reports_with_enums_as_strings(ledger: sp.Store, store_url: str) -> None:
    _completed(ledger, "done")
    _waiting(ledger, "waiting")
    result = invoke(store_url, "replay", "done", "waiting", *_IMPORT, "--json", variant="prompt edited")
    assert result.exit_code == EXIT_DIVERGED, result.output
    done, waiting = json.loads(result.stdout)
    assert (done["run_id"], done["reached"], done["resume"], done["ok"]) == (
        "done",
        "diverged",
        "block",
        False,
    )
    divergence = done["divergence"]
    assert (divergence["kind"], divergence["step_id"]) == ("changed", "plan")
    assert divergence["asked"]["kind"] == divergence["recorded"]["kind"] == "decision"
    assert divergence["recorded"]["input_hash"] == ledger.load_ledger("done").steps["plan"].input_hash
    assert waiting["status"] == "waiting"
    unchanged = json.loads(invoke(store_url, "replay", "done", *_IMPORT, "--json").stdout)
    assert unchanged[0]["result"] == ledger.get_run("done").result
    assert (unchanged[0]["reached"], unchanged[0]["carries_on"]) == ("end", True)


def test_check_deploy_replays_every_run_a_deploy_takes_over(ledger: sp.Store, store_url: str) -> None:
    for i in range(3):
        _waiting(ledger, f"w-{i}")
    _completed(ledger, "done")  # not taken over: not replayed
    untouched = _untouched(ledger, store_url)
    passing = invoke(store_url, "check-deploy", *_IMPORT)
    failing = invoke(store_url, "check-deploy", *_IMPORT, variant="prompt edited")
    as_json = invoke(store_url, "check-deploy", *_IMPORT, "--json", variant="prompt edited")
    untouched()
    assert passing.exit_code == 0, passing.output
    *lines, summary = passing.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines) == ["w-0", "w-1", "w-2"]
    assert all(line.endswith("carry on: the code asks what the run recorded") for line in lines)
    assert summary == "3 runs, 3 carry on"
    assert failing.exit_code == EXIT_DIVERGED, failing.output
    assert failing.stdout.splitlines()[-1] == "3 runs, 3 block, 3 diverged"
    assert failing.stdout.count("diverged (changed) at step 'plan'") == 3
    document = json.loads(as_json.stdout)
    assert (document["ok"], document["summary"]) == (False, "3 runs, 3 block, 3 diverged")
    assert {report["divergence"]["step_id"] for report in document["reports"]} == {"plan"}
    completed = invoke(store_url, "check-deploy", *_IMPORT, "--status", "completed", "--limit", "1")
    assert completed.exit_code == 0, completed.output
    assert completed.stdout.splitlines()[-1] == "1 runs, 1 carry on"
    limited = invoke(store_url, "check-deploy", *_IMPORT, "--limit", "2")
    assert limited.stdout.splitlines()[-1] == "2 runs, 2 carry on"
    assert "note: 2 waiting runs replayed, the --limit: raise it to check them all" in limited.stderr


def test_check_deploy_lists_a_run_no_import_registers_and_fails(ledger: sp.Store, store_url: str) -> None:
    @sp.workflow("replay-commands-gone")
    def gone(run: sp.Run) -> None:
        run.wait_for("never")

    with pytest.raises(sp.AwaitingMessage):
        sp.start(ledger, gone, run_id="orphan")
    sp.testing.forget_workflows("replay-commands-gone")
    _waiting(ledger, "w-0")
    result = invoke(store_url, "check-deploy", *_IMPORT)
    assert result.exit_code == EXIT_DIVERGED, result.output
    assert "orphan  not replayable: workflow 'replay-commands-gone' is not registered" in result.stdout
    assert result.stdout.splitlines()[-1] == "2 runs, 1 carry on, 1 not replayable"
    only = invoke(store_url, "check-deploy", *_IMPORT, "--workflow", "replay-flows-order")
    assert only.exit_code == 0, only.output
    unknown = invoke(store_url, "check-deploy", *_IMPORT, "--workflow", "replay-commands-gone")
    assert unknown.exit_code == 1
    assert "workflow 'replay-commands-gone' is not registered" in unknown.stderr
    assert "--import" in unknown.stderr


def test_a_run_whose_workflow_no_import_registers_is_an_error_naming_import(
    ledger: sp.Store, store_url: str
) -> None:
    @sp.workflow("replay-commands-unimported")
    def unimported(run: sp.Run) -> int:
        return run.pure("one", lambda: 1)

    sp.start(ledger, unimported, run_id="plain")
    sp.testing.forget_workflows("replay-commands-unimported")
    result = invoke(store_url, "replay", "plain", *_IMPORT)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: workflow 'replay-commands-unimported' is not registered")
    assert "--import" in result.stderr


def test_an_unknown_run_is_an_error(ledger: sp.Store, store_url: str) -> None:
    _completed(ledger, "done")
    result = invoke(store_url, "replay", "done", "no-such-run", *_IMPORT)
    assert result.exit_code == 1
    assert result.stderr == f"error: {RunNotFound('no-such-run').message}\n"
    assert result.stdout == ""


def test_the_ledgers_values_are_printed_as_data(ledger: sp.Store, store_url: str) -> None:
    hostile = "[red]boom\x1b[2J"
    sp.start(ledger, replay_flows.echoed, hostile, run_id=f"run{hostile}")
    with pytest.raises(sp.SafepointError):
        sp.start(ledger, replay_flows.echoed, f"fail {hostile}", run_id="failed")
    result = invoke(store_url, "replay", f"run{hostile}", "failed", *_IMPORT)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    ran, failed = result.stdout.splitlines()
    assert ran.startswith("run[red]boom\\x1b[2J  replay-flows-echo@1")  # markup as written, ESC escaped
    assert '"said":"[red]boom\\u001b[2J"' in ran  # the result, as JSON
    assert (
        "raises StepFailed: step 'echo' of run 'failed' raised ValueError: fail [red]boom\\x1b[2J" in failed
    )
    document = invoke(store_url, "replay", f"run{hostile}", *_IMPORT, "--json").stdout
    assert "\x1b" not in document
    assert json.loads(document)[0]["result"] == {"said": hostile}


def test_no_ledger_is_created(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    for args in (("replay", "r"), ("check-deploy",)):
        result = invoke(f"sqlite:///{path}", *args, *_IMPORT)
        assert result.exit_code == 1, result.output
        assert "no ledger at" in result.stderr
        assert not path.exists()


def test_a_run_file_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    result = invoke(
        f"sqlite:///{tmp_path / 'none.db'}", "replay", *_IMPORT, "--file", str(tmp_path / "run.json")
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot read the run file ")
    assert not (tmp_path / "none.db").exists()  # a file alone opens no store


def test_replay_needs_a_run_or_a_file(tmp_path: Path) -> None:
    result = invoke(f"sqlite:///{tmp_path / 'l.db'}", "replay", *_IMPORT)
    assert result.exit_code == 2
    assert "name a run (RUN) or a run file" in result.stderr


def test_a_run_file_exported_from_the_ledger_replays_with_file_alone(
    ledger: sp.Store, store_url: str, tmp_path: Path
) -> None:
    """``safepoint export`` then ``safepoint replay --file``: the file replays as the ledger's run
    does — unchanged, to its end; edited, to the step where it parts — and no store is opened."""
    _completed(ledger, "done")
    path = tmp_path / "done.json"
    exported = invoke(store_url, "export", "done", "--out", str(path))
    assert exported.exit_code == 0, exported.output
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"  # never opened: the file is all it needs
    same = invoke(missing, "replay", "--file", str(path), *_IMPORT)
    assert same.exit_code == 0, same.output
    assert "reached the end (6/6 steps replayed," in same.stdout
    edited = invoke(missing, "replay", "--file", str(path), *_IMPORT, variant="prompt edited")
    assert edited.exit_code == EXIT_DIVERGED, edited.output
    assert "diverged (changed) at step 'plan'" in edited.stdout
    assert not (tmp_path / "nowhere.db").exists()
