"""The console's JSON API and pages over real HTTP on loopback, on a real SQLite ledger holding
runs in every state: filters, counts and pages answered by the store, errors as JSON for API
clients, the OpenAPI document naming every route the server answers, a confirmation after an
action and, after a refused one, the form drawn again with what was typed."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from console_states import build_states
from safepoint.ops.dashboard import Dashboard
from safepoint.ops.dashboard_api import ROUTES

TOKEN = "a-token-for-the-console-tests"


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[sp.Store, dict[str, str]]]:
    store = sp.open_store(f"sqlite:///{Path(tmp_path_factory.mktemp('console')) / 'ledger.db'}")
    ids = build_states(store)
    yield store, ids
    store.close()


@pytest.fixture
def board(states: tuple[sp.Store, dict[str, str]]) -> Iterator[Dashboard]:
    with Dashboard(states[0], port=0, token=TOKEN) as served:
        yield served


def _call(
    board: Dashboard, method: str, path: str, *, body: str = "", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", board.port, timeout=10)
    try:
        connection.request(method, path, body=body.encode() or None, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
    finally:
        connection.close()


def _api(board: Dashboard, path: str) -> tuple[int, Any]:
    status, _, text = _call(board, "GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
    return status, json.loads(text)


def test_the_runs_api_honours_its_filters_and_counts_every_status(
    board: Dashboard, states: tuple[sp.Store, dict[str, str]]
) -> None:
    _, ids = states
    status, page = _api(board, "/api/runs?status=blocked")
    assert status == 200
    assert [run["run_id"] for run in page["runs"]] == [ids["blocked"]]
    assert page["total"] == 1
    assert page["counts"]["waiting"] == 3  # the counts leave the status filter aside
    assert page["counts"]["running"] == 2
    assert sum(page["counts"].values()) == len(ids) + 2  # the chain holds three runs
    _, found = _api(board, "/api/runs?q=TICKET-104")
    assert {run["run_id"] for run in found["runs"]} >= {ids["completed"], ids["live"], ids["dead"]}
    assert all("ticket-104" in run["run_id"] for run in found["runs"])
    _, crawl = _api(board, "/api/runs?workflow=crawl&version=v1")
    assert crawl["total"] in (0, 3)  # the version a workflow gets by default
    _, crawl = _api(board, "/api/runs?workflow=crawl")
    assert crawl["total"] == 3
    _, later = _api(board, "/api/runs?created_after=2999-01-01")
    assert (later["total"], later["runs"]) == (0, [])
    _, earlier = _api(board, "/api/runs?created_before=2999-01-01T00:00:00Z&status=failed")
    assert [run["run_id"] for run in earlier["runs"]] == [ids["failed"]]


def test_the_runs_api_pages_by_cursor_and_says_the_total(board: Dashboard) -> None:
    seen: list[str] = []
    cursor = ""
    totals = set()
    while True:
        _, page = _api(board, "/api/runs?limit=4" + (f"&cursor={cursor}" if cursor else ""))
        totals.add(page["total"])
        seen.extend(run["run_id"] for run in page["runs"])
        if page["next_cursor"] is None:
            break
        cursor = urllib.parse.quote(page["next_cursor"])
    assert totals == {len(seen)}
    assert len(seen) == len(set(seen)) == 14


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/api/runs?status=stuck", "no status 'stuck'"),
        ("/api/runs?limit=0", "limit='0'"),
        ("/api/runs?limit=100000", "from 1 to"),
        ("/api/runs?created_after=yesterday", "is not an instant"),
        ("/api/runs?cursor=bm9wZQ", "cursor"),
        ("/api/runs?colour=red", "no filter 'colour'"),
        ("/api/runs/nobody-has-this", "nobody-has-this"),
        ("/api/nothing", "nothing at /api/nothing"),
    ],
)
def test_the_api_answers_every_error_as_json(board: Dashboard, path: str, says: str) -> None:
    status, error = _api(board, path)
    assert status in (400, 404)
    assert error["status"] == status
    assert says in error["error"]


def test_the_api_needs_the_token_and_says_so_in_json(board: Dashboard) -> None:
    status, headers, text = _call(board, "GET", "/api/runs?status=blocked")
    assert status == 401
    assert headers["content-type"] == "application/json"
    assert "token" in json.loads(text)["error"]
    status, headers, text = _call(board, "GET", "/runs/nobody", headers={"Accept": "application/json"})
    assert (status, json.loads(text)["status"]) == (404, 404)  # an API client gets JSON anywhere


def test_the_openapi_document_names_every_route_the_server_answers(
    board: Dashboard, states: tuple[sp.Store, dict[str, str]]
) -> None:
    status, document = _api(board, "/api/openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.1")
    listed = {(method.upper(), path) for path, methods in document["paths"].items() for method in methods}
    assert listed == {(route.method, route.path) for route in ROUTES}
    run_id = urllib.parse.quote(states[1]["completed"], safe="")
    for method, path in sorted(listed):
        concrete = path.replace("{run_id}", run_id)
        if method == "GET":
            answered, _, _ = _call(board, "GET", concrete, headers={"Authorization": f"Bearer {TOKEN}"})
            assert answered == 200, concrete
        else:  # every action answers (here: refused for its missing token, not "no such action")
            answered, _, text = _call(
                board, "POST", concrete, headers={"Origin": board.url, "Accept": "application/json"}
            )
            assert answered == 403, (concrete, text)
    # and what it does not list, the server does not answer
    for method, path in (("GET", "/api"), ("GET", "/runs"), ("POST", f"/runs/{run_id}/explode")):
        answered, _, _ = _call(board, method, path, headers={"Origin": board.url})
        assert answered == 404, path
    assert document["paths"]["/api/runs"]["get"]["security"] == [{"token": []}]
    names = {p["name"] for p in document["paths"]["/api/runs"]["get"]["parameters"]}
    assert {"status", "workflow", "version", "q", "cursor", "limit", "created_after"} <= names


def test_the_workers_api_flags_an_expired_lease(
    board: Dashboard, states: tuple[sp.Store, dict[str, str]]
) -> None:
    _, ids = states
    _, found = _api(board, "/api/workers")
    held = {run["run_id"]: run for worker in found["workers"] for run in worker["runs"]}
    assert held[ids["dead"]]["lease_expired"] is True
    assert held[ids["live"]]["lease_expired"] is False
    assert found["running"] == 2
    _, page = _call(board, "GET", "/workers")[::2]
    assert "lease(s) expired: worker gone or stalled" in page


def test_a_run_api_has_the_timeline_chain_and_forks(
    board: Dashboard, states: tuple[sp.Store, dict[str, str]]
) -> None:
    _, ids = states
    _, run = _api(board, "/api/runs/" + ids["completed"])
    kinds = [entry["kind"] for entry in run["timeline"]]
    assert kinds == ["model", "pure", "effect"]
    effect = run["timeline"][-1]
    assert effect["operation"]["state"] == "accepted"
    assert effect["operation"]["dispatch_count"] == 1
    assert effect["start_from"] == "prepared"
    assert all(entry["end"] >= entry["start"] for entry in run["timeline"])
    assert [fork["fork"] for fork in run["forks"]] == [ids["fork"]]
    _, first = _api(board, "/api/runs/" + ids["chain"])
    assert first["chain"] == ["crawl-site", "crawl-site~1", "crawl-site~2"]


def _form_post(board: Dashboard, path: str, form: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    return _call(
        board,
        "POST",
        path,
        body=urllib.parse.urlencode(form),
        headers={"Origin": board.url, "Content-Type": "application/x-www-form-urlencoded"},
    )


def test_a_refused_form_comes_back_with_what_was_typed_and_a_done_one_confirms(
    board: Dashboard, states: tuple[sp.Store, dict[str, str]]
) -> None:
    store, ids = states
    run = store.get_run(ids["stopped"])
    path = "/runs/" + ids["stopped"] + "/limits"
    typed = {"tokens": "lots", "by": "ana <b>", "reason": "a long case", "revision": run.state_revision}
    status, _, page = _form_post(board, path, {**typed, "token": TOKEN})
    assert status == 400
    assert "the form is malformed" in page
    assert "value='lots'" in page
    assert "value='ana &lt;b&gt;'" in page  # escaped, as everything shown
    assert "value='a long case'" in page
    assert TOKEN not in page  # the token is never drawn back
    status, _, page = _form_post(board, path, typed | {"tokens": "900"})  # no token
    assert status == 403
    assert "value='900'" in page
    status, headers, _ = _form_post(board, path, {**typed, "tokens": "900", "token": TOKEN})
    assert status == 303
    location = headers["location"]
    assert re.fullmatch(r"/runs/triage-9\?done=[\w-]+", location)
    _, _, page = _call(board, "GET", location)
    assert "Raised the limits of triage-9" in page
    _, _, again = _call(board, "GET", location)
    assert "Raised the limits" not in again  # a confirmation is shown once
    assert store.get_run(ids["stopped"]).token_budget == 900


def test_an_encrypted_ledger_is_shown_decrypted_and_without_the_key_as_unreadable(tmp_path: Path) -> None:
    """With the keyring, the console lists, filters and shows an encrypted ledger's values as
    they were given; with a keyring that lacks the key they were sealed with, every page still
    answers: the runs are listed, and a run's page says it is unreadable and names the key —
    never an envelope shown as a value, never a failure of the request's making (400)."""
    from safepoint.storage import Encrypted, Keyring

    path = tmp_path / "sealed.db"
    old = Keyring({"key-2026-01": Keyring.new_key()}, "key-2026-01")
    store = sp.open_store(f"sqlite:///{path}", codec=Encrypted(old))
    ids = build_states(store)
    with Dashboard(store, port=0, token=TOKEN) as board:
        status, found = _api(board, "/api/runs?status=failed")
        assert status == 200
        assert [run["run_id"] for run in found["runs"]] == [ids["failed"]]
        status, detail = _api(board, f"/api/runs/{ids['completed']}")
        assert status == 200
        assert detail["run"]["inputs"]["args"] == ["Where is my refund for order 1042?"]
        status, _, shown = _call(board, "GET", f"/runs/{ids['blocked']}")
        assert status == 200
        assert "fastship" in shown
        assert "$sp_enc" not in shown
    store.close()
    other = Keyring({"key-2026-06": Keyring.new_key()}, "key-2026-06")
    store = sp.open_store(f"sqlite:///{path}", codec=Encrypted(other))
    with Dashboard(store, port=0, token=TOKEN) as board:
        for address in ("/", "/inbox", "/workers", "/?status=blocked"):
            status, _, shown = _call(board, "GET", address)
            assert status == 200, address
            assert "$sp_enc" not in shown, address
        status, _, listed = _call(board, "GET", "/")
        assert "unreadable" in listed
        assert "key-2026-01" in listed
        status, _, held = _call(board, "GET", "/workers")  # running runs: shown, not left out
        assert ids["live"] in held
        assert ids["dead"] in held
        assert "key-2026-01" in held
        status, found = _api(board, "/api/workers")
        assert {run["run_id"] for run in found["unreadable"]} == {ids["live"], ids["dead"]}
        assert found["running"] == 2
        for state in ("completed", "blocked", "failed"):
            status, _, shown = _call(board, "GET", f"/runs/{ids[state]}")
            assert status == 200, (state, shown)
            assert "unreadable" in shown
            assert "key-2026-01" in shown  # the key to open it with
            assert "$sp_enc" not in shown
            assert ids[state] in shown
            status, answer = _api(board, f"/api/runs/{ids[state]}")
            assert status == 409, (state, answer)
            assert answer["key_id"] == "key-2026-01"
            assert answer["run"]["run_id"] == ids[state]
            assert answer["run"]["unreadable"] is True
            assert "$sp_enc" not in json.dumps(answer)
    store.close()
