"""A body nobody can read, at the operator's tools: the console over real HTTP and the command's
JSON arguments. JSON nested deeper than Python's decoder goes (it raises ``RecursionError``, not
``ValueError``) is refused the way any other bad body is — a 400 with a JSON error from the
console, a usage error from the command — never a 500 or a traceback; and a value the console
took it can show again. (The fake model server and the effect owner's service are tested for
the same in their own files.)"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.ops.cli import cli
from safepoint.ops.dashboard import Dashboard
from safepoint.ops.dashboard_actions import ACTIONS

TOKEN = "a-token-for-the-body-tests"
DEPTH = 100_000  # far past any recursion limit
DEEP = "[" * DEPTH + "]" * DEPTH
_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "SAFEPOINT_URL": None}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@sp.workflow("bodies-answer")
def answer(run: sp.Run) -> Any:
    return {"said": run.wait_for("manager.answer", timeout=3600)}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def waiting(url: str) -> sp.Store:
    """A store with one run, ``w``, waiting for a message."""
    store = sp.open_store(url)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, answer, run_id="w")
    return store


@pytest.fixture
def board(waiting: sp.Store) -> Iterator[Dashboard]:
    with Dashboard(waiting, port=0, token=TOKEN) as served:
        yield served


def _request(
    base: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    split = urllib.parse.urlsplit(base)
    assert split.hostname is not None
    connection = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answered = connection.getresponse()
        return answered.status, answered.read().decode()
    finally:
        connection.close()


def _console(board: Dashboard, method: str, path: str, body: bytes | None = None, form: bool = False) -> Any:
    """A program's request to the console (the token as a Bearer header): its status and JSON."""
    kind = "application/x-www-form-urlencoded" if form else "application/json"
    headers = {"Content-Type": kind, "Accept": "application/json", "Authorization": f"Bearer {TOKEN}"}
    status, text = _request(board.url, method, path, body, headers)
    return status, json.loads(text)


# -- the console ---------------------------------------------------------------------------------


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_body_nested_too_deep_is_a_400_for_every_action_and_changes_nothing(
    board: Dashboard, waiting: sp.Store, action: str
) -> None:
    before = waiting.get_run("w")
    status, answered = _console(board, "POST", f"/runs/w/{action}", f'{{"by": {DEEP}}}'.encode())
    assert status == 400, answered
    assert answered["status"] == 400
    assert "the body is not JSON" in answered["error"]
    assert "too deeply" in answered["error"]
    assert waiting.get_run("w") == before


@pytest.mark.parametrize(
    ("action", "fields", "says"),
    [
        ("send", {"name": "manager.answer", "by": "ana"}, "the message is not JSON"),
        ("resolve", {"action": "applied", "revision": "1", "by": "ana"}, "the receipt is not JSON"),
    ],
)
def test_a_json_field_nested_too_deep_is_a_400_in_a_form_and_in_a_json_body(
    board: Dashboard, waiting: sp.Store, action: str, fields: dict[str, str], says: str
) -> None:
    field = "payload" if action == "send" else "receipt"
    before = waiting.get_run("w")
    as_form = urllib.parse.urlencode({**fields, field: DEEP}).encode()
    as_json = json.dumps({**fields, field: DEEP}).encode()
    for body, form in ((as_form, True), (as_json, False)):
        status, answered = _console(board, "POST", f"/runs/w/{action}", body, form=form)
        assert status == 400, answered
        assert says in answered["error"]
        assert "too deeply" in answered["error"]
    assert waiting.get_run("w") == before
    assert waiting.messages("w") == []


@pytest.mark.parametrize("action", ["resolve", "send"])
def test_a_value_at_the_edge_of_what_decodes_is_never_a_500(board: Dashboard, action: str) -> None:
    """Around the depth where decoding stops, the body is read, a receipt written again as the
    form's text and read once more, a message's payload read from its field and checked by the
    verb, each a little deeper in the stack: wherever it stops, the answer is the request's
    (refused, or for a message taken), never the console's failure."""
    for depth in range(880, 1001, 4):
        if action == "resolve":
            body = f'{{"action": "applied", "revision": "1", "by": "ana", "receipt": {nested(depth)}}}'
        else:
            body = json.dumps({"name": "manager.answer", "payload": nested(depth), "by": "ana"})
        status, answered = _console(board, "POST", f"/runs/w/{action}", body.encode())
        assert status in (200, 400, 409), (depth, answered)
        assert "error" in answered or action == "send", (depth, answered)


def test_a_cursor_nested_too_deep_is_a_400(board: Dashboard) -> None:
    cursor = base64.urlsafe_b64encode(nested(5000).encode()).decode().rstrip("=")
    status, answered = _console(board, "GET", f"/api/runs?cursor={cursor}")
    assert status == 400, answered
    assert "cursor" in answered["error"]


def test_a_deep_message_the_console_took_is_shown_again_by_the_console_and_the_command(
    board: Dashboard, waiting: sp.Store, url: str
) -> None:
    payload = json.loads(nested(600))
    body = json.dumps({"name": "manager.answer", "payload": json.dumps(payload), "by": "ana"})
    status, answered = _console(board, "POST", "/runs/w/send", body.encode())
    assert status == 200, answered
    status, detail = _console(board, "GET", "/api/runs/w")
    assert status == 200, detail
    assert [m["payload"] for m in detail["messages"]] == [payload]
    assert _request(board.url, "GET", "/runs/w")[0] == 200
    shown = _invoke(url, "show", "w", "--json")
    assert shown.exit_code == 0, shown.output
    assert [m["payload"] for m in json.loads(shown.stdout)["messages"]] == [payload]


# -- the command's JSON arguments --------------------------------------------------------------


def _invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("send", "w", "manager.answer", "--payload", nested(5000)), "--payload"),
        (
            ("resolve", "w", "--applied", "--revision", "1", "--by", "ana", "--receipt", nested(5000)),
            "--receipt",
        ),
    ],
)
def test_a_json_argument_nested_too_deep_is_a_usage_error(
    waiting: sp.Store, url: str, args: tuple[str, ...], option: str
) -> None:
    before = waiting.get_run("w")
    done = _invoke(url, *args)
    assert done.exit_code == 2, done.output
    assert option in done.stderr
    assert "not JSON" in done.stderr
    assert "too deeply" in done.stderr
    assert "Traceback" not in done.output
    assert waiting.get_run("w") == before
