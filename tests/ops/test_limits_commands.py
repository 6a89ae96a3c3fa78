"""A run stopped at a limit, seen and carried on from the command line: `safepoint show` and
`safepoint runs` say which limit, how far it spent and the step it stopped before; `safepoint
limits` raises it. (The dashboard's form: tests/ops/test_dashboard.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.errors import BudgetExhausted
from safepoint.ops.cli import cli
from safepoint.ops.cli_support import parse_when
from safepoint.types import RunStatus

_PLAIN_ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
RUN = "triage <1>"  # an id with markup and a space in it: data, never markup


def answer(**kwargs: Any) -> dict[str, Any]:
    return {"text": "ok", "usage": {"input_tokens": 12, "output_tokens": 5}}


@sp.workflow("ops-limits", budget=sp.Budget(tokens=30))
def turns(run: sp.Run) -> int:
    for turn in range(3):
        run.model(f"turn.{turn}", answer, model="m-1", messages=[])
    return 3


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'limits.db'}"


@pytest.fixture
def stopped(url: str) -> Iterator[sp.Store]:
    """A run stopped before its third model call: 34 tokens spent of 30."""
    store = sp.open_store(url)
    with pytest.raises(BudgetExhausted):
        sp.start(store, turns, run_id=RUN)
    yield store
    store.close()


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


def test_show_and_runs_say_the_limit_what_was_spent_and_the_step_it_stopped_before(
    stopped: sp.Store, url: str
) -> None:
    shown = invoke(url, "show", RUN)
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "stopped: its tokens limit" in text
    assert "tokens: 34 spent of 30, before step 'turn.2'" in text
    assert "tokens 34 of 30 spent" in text
    assert "model calls 2 made" in text
    assert "safepoint limits 'triage <1>' --tokens <more than 34>" in text  # a command to copy
    listed = invoke(url, "runs")
    row = next(line for line in listed.output.splitlines() if line.startswith("triage <1>"))
    assert "stopped" in row
    assert "tokens: 34 spent of 30, before step 'turn.2'" in " ".join(row.split())
    record = invoke(url, "record", RUN)
    assert record.exit_code == 0, record.output
    assert json.loads(record.output)["limit"] == "tokens"


def test_limits_raises_it_and_the_run_carries_on(stopped: sp.Store, url: str) -> None:
    before = stopped.get_run(RUN)
    raised = invoke(
        url, "limits", RUN, "--tokens", "100", "--deadline", "+30m", "--by", "ana", "--reason", "long case"
    )
    assert raised.exit_code == 0, raised.output
    text = " ".join(raised.output.split())
    assert "limits now tokens 34 of 100" in text
    assert "now pending" in text
    run = stopped.get_run(RUN)
    assert (run.status, run.token_budget) == (RunStatus.PENDING, 100)
    assert run.deadline_at is not None
    assert 29 * 60_000 <= run.deadline_at - stopped.now() <= 30 * 60_000
    [event] = [e for e in stopped.events(RUN) if e.kind == "run.limits_extended"]
    assert (event.worker, event.detail["reason"], event.detail["old"]["tokens"]) == ("ana", "long case", 30)
    assert run.state_revision == before.state_revision + 1
    assert sp.resume(stopped, RUN) == 3


def test_limits_refuses_what_does_not_fit_in_one_line(stopped: sp.Store, url: str) -> None:
    run = stopped.get_run(RUN)
    for args, said in (
        (["--tokens", "20"], "below what was spent"),
        (["--tokens", "200", "--revision", str(run.state_revision - 1)], "moved on"),
        ([], "name a limit"),
    ):
        refused = invoke(url, "limits", RUN, *args, "--by", "ana")
        assert refused.exit_code == 1
        assert said in refused.output
        assert "Traceback" not in refused.output
    assert invoke(url, "limits", RUN, "--deadline", "soon", "--by", "ana").exit_code == 2  # usage
    assert stopped.get_run(RUN) == run


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("+30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("1h30m", timedelta(minutes=90)),
        ("2030-01-31T17:00:00+01:00", datetime(2030, 1, 31, 16, tzinfo=UTC)),
    ],
)
def test_a_deadline_is_a_span_from_now_or_an_instant(text: str, moment: timedelta | datetime) -> None:
    assert parse_when(text, "--deadline") == moment
