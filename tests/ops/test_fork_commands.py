"""Forking from the command line (`safepoint fork`) and from a run's page on the dashboard: the
same checks as ``sp.fork``, and a fork that runs only its tail and sends nothing its source
sent but what the operator names."""

from __future__ import annotations

import importlib
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint._rules.effects import mint_effect_key
from safepoint.ops.cli import cli
from safepoint.ops.dashboard import Dashboard
from safepoint.testing import forget_workflows
from safepoint.types import RunStatus

_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "SAFEPOINT_URL": None}
TOKEN = "a-token-for-the-fork-tests"

# A workflow of three reads and three effects, as an application's module holds it; the effect
# counts what it was sent, and under which key.
FLOW = """
import safepoint as sp

asked = []
sent = []


def look(index):
    asked.append(index)
    return index


def send(payload, key):
    sent.append((payload, str(key)))
    return {{"id": f"t{{len(sent)}}"}}


tickets = sp.Effect("fork-cli-tickets", execute=send)


@sp.workflow("{name}", version="{version}", models=["{model}"])
def flow(run):
    made = []
    for index in range(3):
        seen = run.read(f"read.{{index}}", look, index)
        made.append(run.effect(f"send.{{index}}", tickets, payload={{"index": seen}})["id"])
    return made
"""


@pytest.fixture
def ledger(file_store: sp.Store) -> sp.Store:
    return file_store


@pytest.fixture
def url(file_store: sp.Store) -> str:
    return file_store.url


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Two deploys of one workflow, as modules on the path: ``v1`` (imported) and ``v2``."""
    name = f"fork-cli-{uuid.uuid4().hex[:8]}"
    modules = {}
    for version, model in (("v1", "m-1"), ("v2", "m-2")):
        module = f"fork_cli_{version}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(FLOW.format(name=name, version=version, model=model))
        modules[version] = module
    monkeypatch.syspath_prepend(str(tmp_path))
    v1 = importlib.import_module(modules["v1"])
    yield {"name": name, "modules": modules, "v1": v1}
    forget_workflows(name)
    for module in modules.values():
        sys.modules.pop(module, None)


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


def _source(store: sp.Store, v1: ModuleType) -> list[str]:
    made: list[str] = sp.start(store, v1.flow, run_id="source")
    v1.asked.clear()
    return made


def test_fork_forks_from_a_step_and_the_fork_runs_only_its_tail(
    url: str, ledger: sp.Store, app: dict[str, Any]
) -> None:
    v1 = app["v1"]
    made = _source(ledger, v1)
    result = invoke(
        url, "fork", "source", "--from-step", "read.1", "--run-id", "f1", "--by", "ana", "--reason", "x"
    )
    assert result.exit_code == 0, result.output
    assert "'source' forked from step 'read.1': f1 (pending), 2 steps copied" in result.stdout
    fork = ledger.get_run("f1")
    assert (fork.status, fork.forked_from) == (RunStatus.PENDING, {"run_id": "source", "step_id": "read.1"})
    assert ledger.events("f1")[0].detail["reason"] == "x"
    assert sp.resume(ledger, "f1") == made
    assert v1.asked == [1, 2]
    assert len(v1.sent) == 3  # nothing sent again
    shown = invoke(url, "show", "f1").stdout
    assert "forked from" in shown
    assert "source at step read.1" in shown

    named = invoke(
        url, "fork", "source", "--from-step", "read.2", "--run-id", "f2", "--resend", "send.2", "--by", "ana"
    )
    assert named.exit_code == 0, named.output
    assert "sent again by the fork, under its own key: send.2" in named.stdout
    assert sp.resume(ledger, "f2")[2] == "t4"
    assert v1.sent[-1][1] == mint_effect_key(ledger.identity.ledger_id, "f2", "send.2") != v1.sent[2][1]
    assert len(v1.sent) == 4


def test_fork_refusals_are_one_line_and_write_nothing(
    url: str, ledger: sp.Store, app: dict[str, Any]
) -> None:
    _source(ledger, app["v1"])
    before = ledger.events("source")
    unknown = invoke(url, "fork", "source", "--from-step", "nope", "--by", "ana")
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("error: cannot fork run 'source': it recorded no step 'nope'")
    assert "'read.0', 'send.0', 'read.1'" in unknown.stderr
    taken = invoke(url, "fork", "source", "--from-step", "read.1", "--run-id", "source", "--by", "ana")
    assert taken.exit_code == 1
    assert "already exists" in taken.stderr
    copied = invoke(url, "fork", "source", "--from-step", "read.1", "--resend", "send.0", "--by", "ana")
    assert (copied.exit_code, "copied prefix" in copied.stderr) == (1, True)
    bare = invoke(url, "fork", "source", "--from-step", "read.1", "--current-code", "--by", "ana")
    assert bare.exit_code == 2
    assert "--import" in bare.stderr
    assert ledger.events("source") == before
    assert len(ledger.list_runs()) == 1


def test_fork_on_the_current_code_records_the_fork_under_the_imported_code(
    url: str, ledger: sp.Store, app: dict[str, Any]
) -> None:
    made = _source(ledger, app["v1"])
    result = invoke(
        url,
        "fork",
        "source",
        "--from-step",
        "read.2",
        "--run-id",
        "on-v2",
        "--import",
        app["modules"]["v2"],
        "--current-code",
        "--by",
        "ana",
    )
    assert result.exit_code == 0, result.output
    assert f"under {app['name']}@v2" in result.stdout
    v2 = sys.modules[app["modules"]["v2"]]
    fork = ledger.get_run("on-v2")
    assert (fork.workflow_version, fork.workflow_fingerprint) == ("v2", v2.flow.fingerprint)
    stats = sp.Worker(ledger, workflows=[f"{app['name']}@v2"]).run(until_idle=True, handle_signals=False)
    assert (stats.claimed, stats.completed) == (1, 1)
    assert ledger.get_run("on-v2").result == made
    assert (v2.asked, v2.sent) == ([2], [])  # the new code ran the tail, and sent nothing again


@pytest.fixture
def board(ledger: sp.Store) -> Iterator[Dashboard]:
    with Dashboard(ledger, port=0, token=TOKEN) as served:
        yield served


def _get(board: Dashboard, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(board.url + path, timeout=10) as answer:
        return str(answer.read().decode())


def _post(board: Dashboard, path: str, form: dict[str, Any]) -> tuple[int, Any]:
    import urllib.error
    import urllib.parse
    import urllib.request

    request = urllib.request.Request(
        board.url + path,
        data=urllib.parse.urlencode(form).encode(),
        method="POST",
        headers={"Accept": "application/json", "Origin": board.url},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_run_is_forked_from_its_page_with_the_token(
    board: Dashboard, ledger: sp.Store, app: dict[str, Any]
) -> None:
    v1 = app["v1"]
    made = _source(ledger, v1)
    page = _get(board, "/runs/source")
    assert "action='/runs/source/fork'" in page
    assert "<option value='read.1'>read.1</option>" in page
    form = {
        "from_step": "read.1",
        "new_run_id": "from-board",
        "resend": "send.2",
        "by": "ana",
        "reason": "why",
    }
    assert _post(board, "/runs/source/fork", form)[0] == 403  # no token
    assert _post(board, "/runs/source/fork", {**form, "token": "wrong" * 4})[0] == 403
    assert len(ledger.list_runs()) == 1
    status, refused = _post(board, "/runs/source/fork", {**form, "from_step": "nope", "token": TOKEN})
    assert status == 409
    assert "it recorded no step 'nope'" in refused["error"]
    status, answer = _post(board, "/runs/source/fork", {**form, "token": TOKEN})
    assert status == 200
    assert (answer["run_id"], answer["status"]) == ("from-board", "pending")  # the fork's
    assert answer["forked_from"] == {
        "run_id": "source",
        "step_id": "read.1",
        "resend": ["send.2"],
        "resent_by": {"send.2": answer["run_id"]},
    }
    assert "forked from" in _get(board, "/runs/from-board")
    assert "href='/runs/source'" in _get(board, "/runs/from-board")
    again = sp.resume(ledger, "from-board")
    assert again[:2] == made[:2]
    assert again[2] != made[2]  # named: sent again, under the fork's key
    assert (v1.asked, len(v1.sent)) == ([1, 2], 4)
