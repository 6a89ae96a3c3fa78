"""``--slice`` on ``safepoint resume`` and ``safepoint worker``: exit 75 while the run goes on,
released for the next call; ``safepoint show`` says how the slices went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.ops.cli import cli
from safepoint.types import RunStatus

TESTS = str(Path(__file__).parents[1])
EXIT_UNFINISHED = 75
_PLAIN_ENV: dict[str, str | None] = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "SAFEPOINT_URL": None,
    "COLUMNS": "200",
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'slices.db'}"


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


def _started(url: str, steps: int) -> str:
    """A run of ``slice_flows.long_run`` (no effects: ``every`` past its end) started for one
    short slice, left unfinished."""
    import slice_flows

    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    store = sp.open_store(url)
    try:
        first = sp.start(store, slice_flows.long_run, steps, steps + 1, run_id=run_id, slice=0.02)
    finally:
        store.close()
    assert isinstance(first, sp.Unfinished)
    return run_id


def test_resume_with_a_slice_exits_75_until_the_run_ends_then_prints_its_result(url: str) -> None:
    run_id = _started(url, 200)
    exits = []
    while True:
        result = invoke(url, "resume", run_id, "--slice", "50ms", "--import", "slice_flows")
        exits.append(result.exit_code)
        if result.exit_code != EXIT_UNFINISHED:
            break
        assert result.stdout == ""  # nothing a script could take for the result
        assert f"run '{run_id}' is not finished: its slice of 0.05s was spent" in result.stderr
        assert "resume it to carry it on" in result.stderr
        store = sp.open_store(url)
        try:
            run = store.get_run(run_id)
        finally:
            store.close()
        assert (run.status, run.owner) == (RunStatus.RUNNING, None)
        assert len(exits) < 100
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"total": sum(range(200)), "tickets": []}
    assert len(exits) > 1
    assert set(exits[:-1]) == {EXIT_UNFINISHED}


@pytest.mark.parametrize("given", ["0", "0s", "-5", "25x", "nan", "soon"])
def test_a_slice_that_is_not_a_positive_duration_is_a_usage_error(url: str, given: str) -> None:
    result = invoke(url, "resume", "any", "--slice", given)
    assert result.exit_code == 2
    assert "--slice" in result.stderr


def test_show_says_how_the_slices_went(url: str) -> None:
    run_id = _started(url, 200)
    shown = invoke(url, "show", run_id)
    assert shown.exit_code == 0, shown.output
    line = next(line for line in shown.stdout.splitlines() if line.startswith("slices: "))
    assert line.startswith("slices: 1 slice ended; the last ")
    assert "before step add." in line
    assert "into a slice of 20 ms" in line
    assert line.endswith("released there: the next resume (or a worker) carries it on at once")
    assert "run.slice_ended" in shown.stdout  # the event, in the history
    # Once claimed again, the release is history: the line no longer says it stands so.
    invoke(url, "resume", run_id, "--import", "slice_flows")
    again = next(
        line for line in invoke(url, "show", run_id).stdout.splitlines() if line.startswith("slices: ")
    )
    assert "released there" not in again


def test_a_worker_given_a_slice_exits_75_when_it_left_a_run_unfinished(url: str, tmp_path: Path) -> None:
    import slice_flows

    store = sp.open_store(url)
    try:
        run_id = sp.submit(store, slice_flows.long_run, 400, 401)
    finally:
        store.close()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "SAFEPOINT_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, env.get("PYTHONPATH")]))

    def worker(*options: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "safepoint", "worker", "--store", url, "--import", "slice_flows"]
        return subprocess.run(
            [*command, *options], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    cut = worker("--slice", "0.1")
    assert cut.returncode == EXIT_UNFINISHED, cut.stderr
    assert "claimed 1, completed 0" in cut.stderr
    assert "unfinished 1" in cut.stderr
    store = sp.open_store(url)
    try:
        run = store.get_run(run_id)
        assert (run.status, run.owner) == (RunStatus.RUNNING, None)  # released for the next one
    finally:
        store.close()
    done = worker("--slice", "1m", "--until-idle")
    assert done.returncode == 0, done.stderr
    assert "completed 1" in done.stderr
    assert "unfinished 0" in done.stderr
