"""The dashboard, reached over real HTTP on loopback: what it shows, and that every action needs
its token and goes through the same checks as the API; that it answers only under its own
loopback name, acts only for its own pages and for token holders, reaches every run id, and
answers every malformed request with an error instead of a dropped connection."""

from __future__ import annotations

import html
import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from html.parser import HTMLParser
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._rules.presence import ownership, status_label
from safepoint.errors import ApprovalInvalid, BudgetExhausted
from safepoint.ops.admission import host_allowed
from safepoint.ops.cli import cli
from safepoint.ops.dashboard import Dashboard, is_loopback
from safepoint.ops.dashboard_api import ROUTES
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunRecord, RunStatus, StepStatus

TOKEN = "a-token-for-the-tests-only"


@pytest.fixture
def board(file_store: sp.Store) -> Iterator[Dashboard]:
    with Dashboard(file_store, port=0, token=TOKEN) as served:
        yield served


def _get(board: Dashboard, path: str) -> tuple[int, str]:
    """A GET as a browser (or, for the JSON API, a token holder) sends it."""
    headers = {"Authorization": f"Bearer {TOKEN}"} if path.startswith("/api/") else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(board.url + path, headers=headers), timeout=10
        ) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _post(board: Dashboard, path: str, form: dict[str, Any]) -> tuple[int, str]:
    """A form POST as the dashboard's own page sends it (its Origin), answered in JSON."""
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(
        board.url + path,
        data=data,
        method="POST",
        headers={"Accept": "application/json", "Origin": board.url},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _blocked_run(store: sp.Store, crash_at: Any, run_id: str = "stuck <script>") -> None:
    """A notification in flight when its worker died, with an owner that has no read path."""
    notify = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow("board-notify")
    def flow(run: sp.Run) -> Any:
        return run.effect("notify", notify, payload={"to": "<b>ana</b>"}, operation_id="n:1")

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id=run_id, lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(store, run_id)


def test_it_lists_runs_and_shows_a_blocked_runs_record_escaped(
    board: Dashboard, file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    _blocked_run(file_store, crash_at)
    status, page = _get(board, "/")
    assert status == 200
    assert "stuck &lt;script&gt;" in page
    assert "<script>" not in page  # a run id is data, never markup
    assert "reconcile_effect" in page
    status, page = _get(board, "/runs/" + urllib.parse.quote("stuck <script>", safe=""))
    assert status == 200
    assert "blocked: reconcile_effect" in page
    assert "no reconcile function" in page
    assert TOKEN not in page  # a page never carries the token
    status, api = _get(board, "/api/runs/" + urllib.parse.quote("stuck <script>", safe=""))
    assert json.loads(api)["run"]["status"] == "blocked"
    assert _get(board, "/runs/nope")[0] == 404


RESOLVE_STUCK = "/runs/" + urllib.parse.quote("stuck <script>", safe="") + "/resolve"


@pytest.fixture
def stuck(file_store: sp.Store, owner_env: OwnerService, crash_at: Any) -> RunRecord:
    """The blocked run ``stuck <script>``, as it stands before anyone resolves it."""
    _blocked_run(file_store, crash_at)
    return file_store.get_run("stuck <script>")


def test_every_action_needs_the_token_and_a_wrong_one_changes_nothing(
    board: Dashboard, file_store: sp.Store, stuck: RunRecord
) -> None:
    before, path = stuck, RESOLVE_STUCK
    form = {"action": "not_applied", "revision": before.state_revision, "by": "ana", "operation_id": "n:1"}
    assert _post(board, path, form)[0] == 403
    assert _post(board, path, {**form, "token": "wrong-token-wrong-token"})[0] == 403
    assert file_store.get_run("stuck <script>") == before
    status, body = _post(board, path, {**form, "revision": before.state_revision - 1, "token": TOKEN})
    assert status == 409  # a stale revision is refused by the same check as the CLI's
    assert "revision" in json.loads(body)["error"]
    status, body = _post(board, path, {**form, "token": TOKEN})
    assert status == 200
    after = json.loads(body)
    assert after["status"] == "running"  # released: a worker sends it again, same key
    assert file_store.load_ledger("stuck <script>").operations["n:1"].state is (EffectState.PREPARED)
    assert [e.detail["by"] for e in file_store.events("stuck <script>") if e.kind == "run.resolved"] == [
        "ana"
    ]


def _waiting_refund(store: sp.Store, workflow: str, run_id: str) -> None:
    """Start a run whose refund of 40 waits for approval."""
    refunds = owner_effect("refunds")

    @sp.workflow(workflow)
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", refunds, payload={"amount": 40}, approval=True)

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id=run_id)


def test_a_waiting_run_shows_its_payload_and_is_approved_and_cancelled_from_the_board(
    board: Dashboard, file_store: sp.Store, owner_env: OwnerService
) -> None:
    _waiting_refund(file_store, "board-refund", "w")
    status, page = _get(board, "/runs/w")
    assert "waiting for approval" in page
    assert "&quot;amount&quot;: 40" in page  # the payload a person is asked to approve
    waiting = file_store.get_run("w").waiting_for
    assert waiting is not None
    status, _ = _post(
        board,
        "/runs/w/approve",
        {
            "step_id": "refund",
            "payload_digest": waiting["payload_digest"],
            "by": "ana",
            "expires_minutes": "30",
            "token": TOKEN,
        },
    )
    assert status == 200
    assert file_store.get_run("w").status is RunStatus.PENDING
    assert sp.resume(file_store, "w")["amount"] == 40
    assert int(owner_env.client.stats()["applied"]) == 1
    # a run that ended cannot be cancelled into anything else
    status, body = _post(board, "/runs/w/cancel", {"by": "ana", "token": TOKEN})
    assert json.loads(body)["status"] == "completed"


def test_an_approval_is_revoked_from_the_board_with_the_token_and_a_reason(
    board: Dashboard, file_store: sp.Store, owner_env: OwnerService
) -> None:
    _waiting_refund(file_store, "board-revoke", "v")
    sp.approve(file_store, "v", "refund", by="ana")
    _, page = _get(board, "/runs/v")
    assert "<h2>approvals</h2>" in page
    assert "action='/runs/v/revoke'" in page
    assert "revoke the approval of refund" in page
    form = {"step_id": "refund", "by": "carol", "reason": "the customer withdrew"}
    assert _post(board, "/runs/v/revoke", form)[0] == 403  # no token
    assert _post(board, "/runs/v/revoke", {**form, "token": "wrong" * 4})[0] == 403
    assert (
        _post(board, "/runs/v/revoke", {"step_id": "refund", "by": "carol", "token": TOKEN})[0] == 400
    )  # why?
    assert file_store.approvals("v")[0].revoked_at is None
    status, body = _post(board, "/runs/v/revoke", {**form, "token": TOKEN})
    assert status == 200
    assert json.loads(body)["status"] == "pending"  # the gate makes it wait when it gets there
    [revoked] = file_store.approvals("v")
    assert (revoked.revoked_by, revoked.revoke_reason) == ("carol", "the customer withdrew")
    _, page = _get(board, "/runs/v")
    assert "revoked by carol" in page
    assert "action='/runs/v/revoke'" not in page  # nothing in force is left to revoke
    status, body = _post(board, "/runs/v/revoke", {**form, "token": TOKEN})
    assert status == 409
    assert "revoked already" in json.loads(body)["error"]
    with pytest.raises(ApprovalInvalid, match="revoked by carol"):
        sp.resume(file_store, "v")
    assert int(owner_env.client.stats()["applied"]) == 0


def test_cancel_from_the_board_and_bad_forms_are_clear_errors(board: Dashboard, file_store: sp.Store) -> None:
    _pending(file_store)
    assert _post(board, "/runs/p/cancel", {"token": TOKEN})[0] == 400  # who cancels?
    assert (
        _post(board, "/runs/p/resolve", {"by": "ana", "action": "abandon", "revision": "x", "token": TOKEN})[
            0
        ]
        == 400
    )
    assert _post(board, "/runs/p/explode", {"token": TOKEN})[0] == 404
    status, body = _post(board, "/runs/p/cancel", {"by": "ana", "reason": "not needed", "token": TOKEN})
    assert (status, json.loads(body)["status"]) == (200, "cancelled")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com", "::"])
def test_it_never_binds_beyond_loopback(file_store: sp.Store, host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(sp.UsageError, match="loopback"):
        Dashboard(file_store, host=host, port=0)


def test_the_command_refuses_a_public_address(tmp_path: Any) -> None:
    result = CliRunner().invoke(
        cli, ["--store", f"sqlite:///{tmp_path / 'l.db'}", "dashboard", "--host", "0.0.0.0"]
    )
    assert result.exit_code == 1
    assert "loopback" in result.output


# -- who is asking: the Host, the Origin, the token ------------------------------------------------


@sp.workflow("board-pending")
def _board_pending(run: sp.Run) -> int:
    return 1


def _pending(store: sp.Store, run_id: str = "p") -> RunRecord:
    """A submitted run of the workflow ``board-pending`` that no worker has claimed."""
    sp.submit(store, _board_pending, run_id=run_id)
    return store.get_run(run_id)


def _port(board: Dashboard) -> int:
    port = urllib.parse.urlsplit(board.url).port
    assert port is not None
    return port


def _http(
    board: Dashboard, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """One request over http.client, with exactly the headers given (a Host among them replaces
    the one http.client would send)."""
    connection = http.client.HTTPConnection("127.0.0.1", _port(board), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("host", "port", "admitted"),
    [
        ("127.0.0.1:8470", 8470, True),
        ("localhost:8470", 8470, True),
        ("LocalHost:8470", 8470, True),  # host names are case-insensitive
        ("[::1]:8470", 8470, True),
        ("localhost", 80, True),  # the default port may go unsaid
        ("[::1]", 80, True),
        (None, 8470, False),  # HTTP/1.0 without Host: nothing says whom it asks
        ("", 8470, False),
        ("evil.example:8470", 8470, False),  # a DNS-rebinding page asks under its own name
        ("evil.example", 8470, False),
        ("127.0.0.1", 8470, False),  # port 80 is not this dashboard
        ("localhost", 8470, False),
        ("127.0.0.1:8471", 8470, False),
        ("127.0.0.1:08470", 8470, False),
        ("localhost:8470.evil.example", 8470, False),
        ("localhost.evil.example:8470", 8470, False),
        ("127.0.0.1.nip.io:8470", 8470, False),
        ("user@127.0.0.1:8470", 8470, False),
        ("0.0.0.0:8470", 8470, False),
        ("127.1:8470", 8470, False),
        ("::1:8470", 8470, False),
        ("[::1]:8470:8470", 8470, False),
        ("127.0.0.1:8470 ", 8470, False),
    ],
)
def test_the_host_decision_admits_only_the_loopback_names_and_port_it_serves(
    host: str | None, port: int, admitted: bool
) -> None:
    assert host_allowed(host, port) is admitted


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/runs/p"),
        ("GET", "/api/runs"),
        ("GET", "/api/runs/p"),
        ("GET", "/nothing-here"),
        # every address the server answers: the OpenAPI document and /static among them
        *((route.method, route.path.replace("{run_id}", "p")) for route in ROUTES),
        ("POST", "/runs/p/cancel"),
        ("HEAD", "/"),
        ("PUT", "/runs/p"),
        ("DELETE", "/runs/p"),
        ("OPTIONS", "/api/runs"),
    ],
)
def test_a_request_under_another_host_name_is_refused_whatever_it_asks(
    board: Dashboard, file_store: sp.Store, method: str, path: str
) -> None:
    _pending(file_store)
    port = _port(board)
    for host in (f"evil.example:{port}", f"127.0.0.1:{port + 1}", "localhost"):
        status, _, body = _http(
            board,
            method,
            path,
            body=b"by=ana&token=" + TOKEN.encode(),
            headers={
                "Host": host,
                "Origin": f"http://{host}",
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        assert status == 421, (host, status, body)
        assert "board-pending" not in body  # nothing of the ledger
    assert file_store.get_run("p").status is RunStatus.PENDING
    status, _, _ = _http(board, "GET", "/", headers={"Host": f"localhost:{port}"})
    assert status == 200
    status, headers, body = _http(board, "HEAD", "/runs/p")
    assert (status, body) == (200, "")
    assert int(headers["Content-Length"]) > 0
    assert _http(board, "PUT", "/runs/p")[0] == 405


@pytest.mark.parametrize(
    ("origin", "fetch_site", "bearer", "allowed"),
    [
        ("http://127.0.0.1:{port}", "same-origin", False, True),  # the dashboard's own form
        ("http://localhost:{port}", None, False, True),
        ("http://[::1]:{port}", None, False, True),
        (None, None, True, True),  # a script with the token
        (None, None, False, False),  # no Origin, no Bearer
        ("http://evil.example", "cross-site", False, False),
        ("http://evil.example", None, True, False),
        ("http://127.0.0.1:{other}", "same-site", False, False),  # another server on loopback
        ("https://127.0.0.1:{port}", None, False, False),
        ("null", None, False, False),  # a sandboxed or file: page
        ("http://127.0.0.1:{port}", "cross-site", False, False),
    ],
)
def test_every_post_must_come_from_the_dashboards_own_origin_or_a_bearer_of_the_token(
    board: Dashboard,
    file_store: sp.Store,
    origin: str | None,
    fetch_site: str | None,
    bearer: bool,
    allowed: bool,
) -> None:
    _pending(file_store)
    port = _port(board)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    if origin is not None:
        headers["Origin"] = origin.format(port=port, other=port + 1)
    if fetch_site is not None:
        headers["Sec-Fetch-Site"] = fetch_site
    if bearer:
        headers["Authorization"] = f"Bearer {TOKEN}"
    status, _, body = _http(
        board, "POST", "/runs/p/cancel", body=f"by=ana&token={TOKEN}".encode(), headers=headers
    )
    if allowed:
        assert (status, json.loads(body)["status"]) == (200, "cancelled")
    else:
        assert status == 403, body
        assert json.loads(body)["error"]
        assert file_store.get_run("p").status is RunStatus.PENDING


def test_the_json_api_needs_the_token_and_the_pages_do_not(board: Dashboard, file_store: sp.Store) -> None:
    _pending(file_store)
    for path in ("/api/runs", "/api/runs/p"):
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-wrong-token"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": TOKEN},
        ):
            status, answer_headers, body = _http(board, "GET", path, headers=headers)
            assert status == 401, (path, headers)
            assert answer_headers.get("WWW-Authenticate", "").startswith("Bearer")
            assert "board-pending" not in body
            assert "token" in json.loads(body)["error"]
        status, _, body = _http(board, "GET", path, headers={"Authorization": f"bearer {TOKEN}"})
        assert status == 200
        assert "board-pending" in body
    status, _, page = _http(board, "GET", "/runs/p")
    assert status == 200
    assert "board-pending" in page
    assert TOKEN not in page


# -- every run id is reachable -----------------------------------------------------------------


class _Links(HTMLParser):
    """The links and form actions of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.actions: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and found.get("href"):
            self.hrefs.append(str(found["href"]))
        if tag == "form" and found.get("action"):
            self.actions.append(str(found["action"]))


def _links(page: str) -> _Links:
    links = _Links()
    links.feed(page)
    return links


ODD_IDS = ["a/b", "x?y#z", "100%", "with space", "ünï/çødé", "a/../b", "<b>/x", "runs/cancel", "trailing/"]


def test_a_run_id_with_slashes_or_url_syntax_is_reached_from_every_link_and_form(
    board: Dashboard, file_store: sp.Store
) -> None:
    for run_id in ODD_IDS:
        _pending(file_store, run_id)
    _, page = _get(board, "/")
    hrefs = [href for href in _links(page).hrefs if href.startswith("/runs/")]
    assert len(hrefs) == len(ODD_IDS)
    for href in hrefs:
        status, run_page = _get(board, href)
        assert status == 200, href
        run_id = next(
            r for r in ODD_IDS if f"<h1>{_escaped(r)} —" in run_page or f"<h1>{_escaped(r)}</h1>" in run_page
        )
        status, api = _get(board, "/api" + href)
        assert (status, json.loads(api)["run"]["run_id"]) == (200, run_id)
        [action] = _links(run_page).actions  # a pending run: its cancel form
        status, body = _post(board, action, {"by": "ana", "token": TOKEN})
        assert (status, json.loads(body)["run_id"]) == (200, run_id), action
        assert file_store.get_run(run_id).status is RunStatus.CANCELLED
    # a browser's form POST is redirected back to the run's own page, reachable too
    _pending(file_store, "c/d?e")
    status, headers, _ = _http(
        board,
        "POST",
        "/runs/c%2Fd%3Fe/cancel",
        body=f"by=ana&token={TOKEN}".encode(),
        headers={"Origin": board.url, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 303
    assert _get(board, headers["Location"])[0] == 200
    assert "c/d?e" in _get(board, headers["Location"])[1]


def _escaped(text: str) -> str:
    return html.escape(text, quote=True)


def test_a_blocked_run_whose_id_has_a_slash_is_resolved_from_its_page(
    board: Dashboard, file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    _blocked_run(file_store, crash_at, "tenant/7 #1")
    _, page = _get(board, "/runs/" + urllib.parse.quote("tenant/7 #1", safe=""))
    actions = _links(page).actions
    assert actions
    assert all(a.startswith("/runs/tenant%2F7%20%231/") for a in actions)
    revision = file_store.get_run("tenant/7 #1").state_revision
    status, body = _post(
        board,
        actions[1],
        {  # "it did not happen"
            "action": "not_applied",
            "revision": revision,
            "operation_id": "n:1",
            "by": "ana",
            "token": TOKEN,
        },
    )
    assert status == 200, body
    assert file_store.load_ledger("tenant/7 #1").operations["n:1"].state is (EffectState.PREPARED)


def test_a_transaction_step_that_may_have_committed_is_resolved_from_its_page(
    board: Dashboard, file_store: sp.Store
) -> None:
    """A run blocked on a transaction step whose function committed on its own: its page offers
    "its writes are there" (with the value the step returns) and "none is", as for an effect."""

    def commits(tx: Any) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS board_rows (id TEXT)")
        tx.driver_connection().commit()

    @sp.workflow("board-tx")
    def flow(run: sp.Run) -> Any:
        return run.transaction("rows.make", commits)

    with pytest.raises(sp.RunBlocked):
        sp.start(file_store, flow, run_id="tx-1")
    _, page = _get(board, "/runs/tx-1")
    assert "its writes are there: record it done" in page
    assert "none of its writes is there: run it again" in page
    revision = file_store.get_run("tx-1").state_revision
    status, body = _post(
        board,
        _links(page).actions[0],
        {"action": "applied", "revision": revision, "receipt": '{"made": 1}', "by": "ana", "token": TOKEN},
    )
    assert status == 200, body
    step = file_store.load_ledger("tx-1").steps["rows.make"]
    assert (step.status, step.result) == (StepStatus.COMPLETED, {"made": 1})


# -- malformed requests are answered -----------------------------------------------------------


@pytest.fixture
def quick_board(file_store: sp.Store) -> Iterator[Dashboard]:
    """A dashboard that gives a client half a second to send what it announced."""
    with Dashboard(file_store, port=0, token=TOKEN, read_timeout=0.5) as served:
        yield served


@pytest.mark.parametrize(
    ("body", "content_type", "declared", "status", "says"),
    [
        (b"{not json", "application/json", None, 400, "JSON"),
        (b'["by", "ana"]', "application/json", None, 400, "object"),
        (b'"ana"', "application/json", None, 400, "object"),
        (b"42", "application/json", None, 400, "object"),
        (b"null", "application/json", None, 400, "object"),
        (b'{"by": ["ana", "bob"]}', "application/json", None, 400, "by"),
        (b'{"by": "\xff"}', "application/json", None, 400, "UTF-8"),
        (b"by=\xff", "application/x-www-form-urlencoded", None, 400, "UTF-8"),
        (b'{"by": "ana"}', "application/json", "abc", 400, "Content-Length"),
        (b'{"by": "ana"}', "application/json", "-5", 400, "Content-Length"),
        (b'{"by": "ana"}', "application/json", "+13", 400, "Content-Length"),
        (b'{"by": "ana"}', "application/json", "1e3", 400, "Content-Length"),
        (b'{"by": "ana"}', "application/json", "100", 400, "Content-Length"),  # more than sent
        (b'{"by": "ana"}', "application/json", str(2 * 1024 * 1024), 413, "large"),
    ],
)
def test_a_malformed_body_gets_a_json_error_and_changes_nothing(
    request: pytest.FixtureRequest,
    file_store: sp.Store,
    body: bytes,
    content_type: str,
    declared: str | None,
    status: int,
    says: str,
) -> None:
    # a body shorter than its length is waited for: not for the default 10 s here
    board = request.getfixturevalue("quick_board" if declared == "100" else "board")
    before = _pending(file_store)
    headers = {"Content-Type": content_type, "Accept": "application/json", "Authorization": f"Bearer {TOKEN}"}
    if declared is not None:
        headers["Content-Length"] = declared
    answer, answer_headers, text = _http(board, "POST", "/runs/p/cancel", body=body, headers=headers)
    assert answer == status, text
    assert answer_headers["Content-Type"] == "application/json"
    assert says in json.loads(text)["error"]
    assert file_store.get_run("p") == before


def test_a_large_body_sent_whole_is_answered_413_not_reset(board: Dashboard, file_store: sp.Store) -> None:
    before = _pending(file_store)
    body = b'{"by": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    status, _, text = _http(
        board,
        "POST",
        "/runs/p/cancel",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    assert status == 413
    assert "large" in json.loads(text)["error"]
    assert file_store.get_run("p") == before


_CANCEL_P = f'{{"by": "ana", "token": "{TOKEN}"}}'


@pytest.mark.parametrize(
    ("head", "body", "status", "says"),
    [
        (
            "POST /runs/p/cancel HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: {length}\r\nContent-Length: 2",
            _CANCEL_P,
            400,
            "Content-Length",
        ),
        (
            "POST /runs/p/cancel HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked",
            f"{len(_CANCEL_P):x}\r\n{_CANCEL_P}\r\n0\r\n\r\n",
            411,
            "Content-Length",
        ),
        (
            "POST /runs/p/cancel HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\n"
            "Content-Type: application/json\r\nContent-Length: {length}",
            _CANCEL_P,
            421,
            "more than one Host",
        ),
        (
            "POST /runs/p/cancel HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {length}",
            _CANCEL_P,
            421,
            "no Host",
        ),
        (
            "POST http://evil.example/runs/p/cancel HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nContent-Length: {length}",
            _CANCEL_P,
            400,
            "proxy",
        ),
        ("GET /runs/%ff HTTP/1.1\r\nHost: {host}", "", 400, "UTF-8"),
    ],
)
def test_a_request_that_does_not_say_one_thing_is_refused(
    board: Dashboard, file_store: sp.Store, head: str, body: str, status: int, says: str
) -> None:
    """Over a raw socket: what http.client would not send."""
    before = _pending(file_store)
    request = (
        head.format(host=board.url.removeprefix("http://"), length=len(body))
        + f"\r\nAuthorization: Bearer {TOKEN}\r\nAccept: application/json\r\n\r\n"
        + body
    )
    with socket.create_connection(("127.0.0.1", _port(board)), timeout=10) as raw:
        raw.sendall(request.encode())
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    assert answer.startswith(f"HTTP/1.0 {status} ".encode()), answer[:200]
    assert says in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert file_store.get_run("p") == before


def test_an_unexpected_fault_is_answered_500_and_the_board_goes_on(
    board: Dashboard, file_store: sp.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pending(file_store)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the disk said no")

    monkeypatch.setattr(file_store, "query_runs", broken)
    status, _headers, body = _http(board, "GET", "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 500
    assert "RuntimeError" in json.loads(body)["error"]
    monkeypatch.undo()
    assert _get(board, "/")[0] == 200


# -- a resolution is one resolution ------------------------------------------------------------


def test_a_resolve_naming_two_resolutions_or_an_unknown_one_is_refused(
    board: Dashboard, file_store: sp.Store, stuck: RunRecord
) -> None:
    before, path = stuck, RESOLVE_STUCK
    common = f"revision={before.state_revision}&by=ana&operation_id=n%3A1&token={TOKEN}"
    json_headers = {"Content-Type": "application/json", "Accept": "application/json", "Origin": board.url}
    form_headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": board.url}
    refused: list[tuple[bytes, dict[str, str], str]] = [
        ((common + "&action=not_applied&action=abandon").encode(), form_headers, "action"),
        ((common + "&action=abandon&not_applied=on").encode(), form_headers, "not_applied"),
        ((common + "&action=maybe").encode(), form_headers, "applied, not_applied, abandon"),
        ((common + "&action=not_applied&by=bob").encode(), form_headers, "by"),
        (
            json.dumps(
                {
                    "action": ["not_applied", "abandon"],
                    "revision": before.state_revision,
                    "by": "ana",
                    "token": TOKEN,
                }
            ).encode(),
            json_headers,
            "action",
        ),
        (
            json.dumps(
                {"action": "maybe", "revision": before.state_revision, "by": "ana", "token": TOKEN}
            ).encode(),
            json_headers,
            "applied, not_applied, abandon",
        ),
        # JSON itself would keep the last of two keys: the dashboard refuses both
        (
            (
                f'{{"action": "not_applied", "action": "abandon", "revision":'
                f' {before.state_revision}, "by": "ana", "token": "{TOKEN}"}}'
            ).encode(),
            json_headers,
            "'action' twice",
        ),
        (
            json.dumps(
                {
                    "action": "applied",
                    "revision": before.state_revision,
                    "by": "ana",
                    "receipt": "{not json",
                    "token": TOKEN,
                }
            ).encode(),
            json_headers,
            "the receipt is not JSON",
        ),
    ]
    for body, headers, says in refused:
        status, answer_headers, text = _http(board, "POST", path, body=body, headers=headers)
        assert status == 400, (body, text)
        if "json" in headers["Content-Type"]:
            assert says in json.loads(text)["error"]
        else:
            assert answer_headers["Content-Type"].startswith("text/html")
            assert _escaped(says) in text
        assert file_store.get_run("stuck <script>") == before
    status, _, _ = _http(
        board, "POST", path, body=(common + "&action=not_applied").encode(), headers=form_headers
    )
    assert status == 303
    assert file_store.get_run("stuck <script>").status is RunStatus.RUNNING


def test_an_error_about_markup_is_shown_as_text(board: Dashboard) -> None:
    status, page = _get(board, "/runs/" + urllib.parse.quote("<script>alert(1)</script>"))
    assert status == 404
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>" not in page
    status, _, page = _http(
        board,
        "POST",
        "/runs/%3Cscript%3E/cancel",
        body=f"by=ana&token={TOKEN}".encode(),
        headers={"Origin": board.url, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 404
    assert "<script>" not in page
    assert "&lt;script&gt;" in page


# -- who holds a run -------------------------------------------------------------------------------


def test_a_rows_status_never_says_running_when_no_process_is_at_it(file_store: sp.Store) -> None:
    pending = _pending(file_store)
    now = 1_800_000_000_000
    held = replace(pending, status=RunStatus.RUNNING, owner="w:1", lease_expires_at=now + 5_000)
    assert status_label(held, ownership(held, now)) == "running — held by w:1, lease ends in 5s"
    expired = replace(held, lease_expires_at=now - 42_000)
    assert status_label(expired, ownership(expired, now)).startswith("running — lease of w:1 expired 42s ago")
    released = replace(held, owner=None, lease_expires_at=None)
    assert status_label(released, ownership(released, now)).startswith("runnable — released")
    for status in (
        RunStatus.PENDING,
        RunStatus.WAITING,
        RunStatus.BLOCKED,
        RunStatus.COMPLETED,
        RunStatus.CANCELLED,
    ):
        quiet = replace(pending, status=status)
        assert status_label(quiet, ownership(quiet, now)) == status.value


def test_the_board_says_who_holds_a_run_and_when_its_worker_is_gone(
    board: Dashboard, file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    @sp.workflow("board-held")
    def flow(run: sp.Run) -> int:
        return 1

    crash_at("run.after_start")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="held")  # a 30 s lease, still current
    crash_at("run.after_start")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="gone", lease_ms=0)  # its lease ran out at once
    crash_at(None)
    owner = file_store.get_run("held").owner
    assert owner is not None
    _, listing = _get(board, "/")
    _, page = _get(board, "/runs/held")
    for shown in (listing, page):
        assert f"running — held by {owner}, lease ends in" in shown
    _, page = _get(board, "/runs/gone")
    assert f"lease of {owner} expired" in page
    _, api = _get(board, "/api/runs/gone")
    assert json.loads(api)["run"]["ownership"]["state"] == "lease_expired"
    assert json.loads(api)["run"]["ownership"]["owner"] == owner
    # released by a person's resolution: runnable, and never "running" while nobody holds it
    _blocked_run(file_store, crash_at)
    run = file_store.get_run("stuck <script>")
    sp.resolve(file_store, "stuck <script>", "not_applied", revision=run.state_revision, by="ana")
    _, page = _get(board, "/runs/" + urllib.parse.quote("stuck <script>", safe=""))
    assert "runnable — released: no worker holds it" in page
    _, listing = _get(board, "/")
    row = next(line for line in listing.split("<tr") if "stuck &lt;script&gt;" in line)
    assert "runnable — released" in row
    assert ">running<" not in row
    _, api = _get(board, "/api/runs")
    [listed] = [r for r in json.loads(api)["runs"] if r["run_id"] == "stuck <script>"]
    assert listed["ownership"]["state"] == "released"


# -- starting it -----------------------------------------------------------------------------------


def test_a_busy_port_is_a_clear_error_not_a_traceback(file_store: sp.Store, tmp_path: Any) -> None:
    with Dashboard(file_store, port=0, token=TOKEN) as first:
        port = _port(first)
        with pytest.raises(sp.UsageError, match=f"port {port} .*in use.*--port"):
            Dashboard(file_store, port=port, token=TOKEN)
        result = CliRunner().invoke(
            cli, ["--store", f"sqlite:///{tmp_path / 'l.db'}", "dashboard", "--port", str(port)]
        )
        assert result.exit_code == 1
        assert "in use" in result.output
        assert "--port" in result.output
        assert "Traceback" not in result.output
        assert not isinstance(result.exception, OSError)
        assert _get(first, "/")[0] == 200  # the first one still serves


# -- a run stopped at a limit ---------------------------------------------------------------------


def _stopped_run(store: sp.Store, run_id: str) -> None:
    """A run stopped before its third model call: 34 tokens spent of 30."""

    def answer(**kwargs: Any) -> dict[str, Any]:
        return {"text": "ok", "usage": {"input_tokens": 12, "output_tokens": 5}}

    @sp.workflow("board-limits", budget=sp.Budget(tokens=30))
    def flow(run: sp.Run) -> int:
        for turn in range(3):
            run.model(f"turn.{turn}", answer, model="m-1", messages=[])
        return 3

    with pytest.raises(BudgetExhausted):
        sp.start(store, flow, run_id=run_id)


def test_a_stopped_run_shows_its_limit_and_a_form_with_the_token_raises_it(
    board: Dashboard, file_store: sp.Store
) -> None:
    run_id = "triage <1>"
    path = "/runs/" + urllib.parse.quote(run_id, safe="")
    _stopped_run(file_store, run_id)
    status, listed = _get(board, "/")
    assert "tokens: 34 spent of 30, before step &#x27;turn.2&#x27;" in listed
    status, page = _get(board, path)
    assert "stopped: its tokens limit" in page
    assert f"action='{path}/limits'" in page
    assert TOKEN not in page
    run = file_store.get_run(run_id)
    form = {"tokens": "200", "by": "ana", "reason": "long case", "revision": run.state_revision}
    assert _post(board, f"{path}/limits", form)[0] == 403  # no token
    assert _post(board, f"{path}/limits", {**form, "token": "wrong" * 5})[0] == 403
    status, body = _post(
        board, f"{path}/limits", {**form, "revision": run.state_revision - 1, "token": TOKEN}
    )
    assert status == 409  # the same check as the API's
    assert "moved on" in json.loads(body)["error"]
    assert _post(board, f"{path}/limits", {**form, "tokens": "many", "token": TOKEN})[0] == 400
    assert file_store.get_run(run_id) == run  # nothing refused changed anything
    status, body = _post(board, f"{path}/limits", {**form, "deadline_minutes": "45", "token": TOKEN})
    assert status == 200, body
    after = json.loads(body)
    assert (after["status"], after["token_budget"]) == ("pending", 200)
    assert after["deadline_at"] - file_store.now() > 44 * 60_000
    assert [e.worker for e in file_store.events(run_id) if e.kind == "run.limits_extended"] == ["ana"]
    assert sp.resume(file_store, run_id) == 3


def test_the_board_answers_a_waiting_runs_wait_once_with_the_token(
    board: Dashboard, file_store: sp.Store
) -> None:
    @sp.workflow("board-waits-answer")
    def answer(run: sp.Run) -> Any:
        return {"said": run.wait_for("manager.answer", timeout=3600)}

    with pytest.raises(sp.AwaitingMessage):
        sp.start(file_store, answer, run_id="w")
    assert "message &#x27;manager.answer&#x27;" in _get(board, "/")[1]
    page = _get(board, "/runs/w")[1]
    assert "waiting for a message" in page
    assert "action='/runs/w/answer'" in page
    assert TOKEN not in page
    assert "name=wait value='manager.answer'" in page  # the wait the page shows
    form = {"name": "manager.answer", "wait": "manager.answer", "payload": '{"ok": 1}', "by": "ana"}
    assert _post(board, "/runs/w/answer", form)[0] == 403  # no token: nothing is sent
    assert _post(board, "/runs/w/answer", {**form, "token": "wrong-token-wrong-token"})[0] == 403
    assert file_store.messages("w") == []
    status, body = _post(board, "/runs/w/answer", {**form, "payload": "{nope", "token": TOKEN})
    assert status == 400
    assert "not JSON" in json.loads(body)["error"]
    credential = '{"k": "sk_live_a1B2c3D4e5F6g7H8i9J0k1L2"}'
    status, body = _post(board, "/runs/w/answer", {**form, "payload": credential, "token": TOKEN})
    assert status == 409  # refused by the verb, as a UsageError is
    assert "looks like a credential" in json.loads(body)["error"]
    assert file_store.messages("w") == []
    status, body = _post(board, "/runs/w/answer", {**form, "token": TOKEN})
    assert status == 200, body
    assert json.loads(body)["status"] == "pending"
    [message] = file_store.messages("w")
    assert (message.payload, message.sent_by, message.for_wait) == ({"ok": 1}, "ana", "manager.answer")
    # a second person answering the same wait: refused, naming the first, and nothing kept
    status, body = _post(
        board, "/runs/w/answer", {**form, "payload": '{"ok": 2}', "by": "bo", "token": TOKEN}
    )
    assert status == 409
    assert "answered already by ana" in json.loads(body)["error"]
    assert file_store.messages("w") == [message]
    # the mailbox stays for API clients: a message queued for the next wait of its name
    status, body = _post(board, "/runs/w/send", {"name": "other", "payload": "1", "token": TOKEN})
    assert status == 200, body
    assert sp.resume(file_store, "w") == {"said": {"ok": 1}}
    page = _get(board, "/runs/w")[1]
    assert "<h2>messages</h2>" in page
    assert "waiting for a message" not in page


def test_control_characters_in_what_a_run_recorded_are_shown_as_escapes_never_raw(
    board: Dashboard, file_store: sp.Store
) -> None:
    """A failure's message holding a terminal escape and a bell (a read's error, a limit's
    record) reaches the page as visible escapes, as it reaches the terminal — never raw."""

    def refused() -> None:
        raise ConnectionRefusedError("\x1b[31mred\x07 and \u202eevil")

    @sp.workflow("board-controls")
    def flow(run: sp.Run) -> None:
        run.read("look", refused, retry=sp.Retry(attempts=2, backoff=0.0))

    with pytest.raises(sp.LimitReached):
        sp.start(file_store, flow, run_id="controls")
    status, page = _get(board, "/runs/controls")
    assert status == 200
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in page
    for visible in ("\\x1b[31mred\\x07", "\\u202e"):
        assert visible in page
    assert "placeholder='None'" not in page  # an unset limit says so


@pytest.mark.parametrize("path", [route.path for route in ROUTES if route.method == "POST"])
def test_every_action_needs_the_token(board: Dashboard, file_store: sp.Store, path: str) -> None:
    """Each POST the server answers, from the dashboard's own page (its Origin) with a form that
    lacks the token or holds a wrong one, is refused and changes nothing."""
    before = _pending(file_store)
    port = _port(board)
    for body in (b"by=ana", b"by=ana&token=not-the-token-at-all"):
        status, _, answer = _http(
            board,
            "POST",
            path.replace("{run_id}", "p"),
            body=body,
            headers={
                "Host": f"127.0.0.1:{port}",
                "Origin": f"http://127.0.0.1:{port}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        assert status == 403, (path, status, answer)
        assert "needs the dashboard's token" in html.unescape(answer)
    assert file_store.get_run("p") == before
