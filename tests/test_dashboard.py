"""The dashboard, reached over real HTTP on loopback: what it shows, and that every action needs
its token and goes through the same checks as the API."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._crashpoints import SimulatedCrash
from safepoint.cli import cli
from safepoint.dashboard import Dashboard, is_loopback
from safepoint.testing.effects import owner_effect
from safepoint.testing.owner import OwnerService

TOKEN = "a-token-for-the-tests-only"


@pytest.fixture
def board(file_store: sp.Store) -> Iterator[Dashboard]:
    with Dashboard(file_store, port=0, token=TOKEN) as served:
        yield served


def _get(board: Dashboard, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(board.url + path, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _post(board: Dashboard, path: str, form: dict[str, Any]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(board.url + path, data=data, method="POST",
                                     headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _blocked_run(store: sp.Store, crash_at: Any) -> None:
    """A notification in flight when its worker died, with an owner that has no read path."""
    notify = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow("board-notify")
    def flow(run: sp.Run) -> Any:
        return run.effect("notify", notify, payload={"to": "<b>ana</b>"}, operation_id="n:1")

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="stuck <script>", lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(store, "stuck <script>")


def test_it_lists_runs_and_shows_a_blocked_runs_record_escaped(
        board: Dashboard, file_store: sp.Store, owner_env: OwnerService,
        crash_at: Any) -> None:
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


def test_every_action_needs_the_token_and_a_wrong_one_changes_nothing(
        board: Dashboard, file_store: sp.Store, owner_env: OwnerService,
        crash_at: Any) -> None:
    _blocked_run(file_store, crash_at)
    before = file_store.get_run("stuck <script>")
    path = "/runs/" + urllib.parse.quote("stuck <script>", safe="") + "/resolve"
    form = {"action": "not_applied", "revision": before.state_revision, "by": "ana",
            "operation_id": "n:1"}
    assert _post(board, path, form)[0] == 403
    assert _post(board, path, {**form, "token": "wrong-token-wrong-token"})[0] == 403
    assert file_store.get_run("stuck <script>") == before
    status, body = _post(board, path, {**form, "revision": before.state_revision - 1,
                                       "token": TOKEN})
    assert status == 409  # a stale revision is refused by the same check as the CLI's
    assert "revision" in json.loads(body)["error"]
    status, body = _post(board, path, {**form, "token": TOKEN})
    assert status == 200
    after = json.loads(body)
    assert after["status"] == "running"  # released: a worker sends it again, same key
    assert file_store.load_ledger("stuck <script>").operations["n:1"].state is (
        sp.EffectState.PREPARED)
    assert [e.detail["by"] for e in file_store.events("stuck <script>")
            if e.kind == "run.resolved"] == ["ana"]


def _waiting_refund(store: sp.Store, workflow: str, run_id: str) -> None:
    """Start a run whose refund of 40 waits for approval."""
    refunds = owner_effect("refunds")

    @sp.workflow(workflow)
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", refunds, payload={"amount": 40}, approval=True)

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id=run_id)


def test_a_waiting_run_shows_its_payload_and_is_approved_and_cancelled_from_the_board(
        board: Dashboard, file_store: sp.Store, owner_env: OwnerService) -> None:
    _waiting_refund(file_store, "board-refund", "w")
    status, page = _get(board, "/runs/w")
    assert "waiting for approval" in page
    assert "&quot;amount&quot;: 40" in page  # the payload a person is asked to approve
    waiting = file_store.get_run("w").waiting_for
    assert waiting is not None
    status, _ = _post(board, "/runs/w/approve", {
        "step_id": "refund", "payload_digest": waiting["payload_digest"], "by": "ana",
        "expires_minutes": "30", "token": TOKEN})
    assert status == 200
    assert file_store.get_run("w").status is sp.RunStatus.PENDING
    assert sp.resume(file_store, "w")["amount"] == 40
    assert int(owner_env.client.stats()["applied"]) == 1
    # a run that ended cannot be cancelled into anything else
    status, body = _post(board, "/runs/w/cancel", {"by": "ana", "token": TOKEN})
    assert json.loads(body)["status"] == "completed"


def test_an_approval_is_revoked_from_the_board_with_the_token_and_a_reason(
        board: Dashboard, file_store: sp.Store, owner_env: OwnerService) -> None:
    _waiting_refund(file_store, "board-revoke", "v")
    sp.approve(file_store, "v", "refund", by="ana")
    _, page = _get(board, "/runs/v")
    assert "<h2>approvals</h2>" in page
    assert "action='/runs/v/revoke'" in page
    assert "revoke the approval of refund" in page
    form = {"step_id": "refund", "by": "carol", "reason": "the customer withdrew"}
    assert _post(board, "/runs/v/revoke", form)[0] == 403  # no token
    assert _post(board, "/runs/v/revoke", {**form, "token": "wrong" * 4})[0] == 403
    assert _post(board, "/runs/v/revoke", {"step_id": "refund", "by": "carol",
                                           "token": TOKEN})[0] == 400  # why?
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
    with pytest.raises(sp.ApprovalInvalid, match="revoked by carol"):
        sp.resume(file_store, "v")
    assert int(owner_env.client.stats()["applied"]) == 0


def test_cancel_from_the_board_and_bad_forms_are_clear_errors(
        board: Dashboard, file_store: sp.Store) -> None:
    @sp.workflow("board-pending")
    def flow(run: sp.Run) -> int:
        return 1

    sp.submit(file_store, flow, run_id="p")
    assert _post(board, "/runs/p/cancel", {"token": TOKEN})[0] == 400  # who cancels?
    assert _post(board, "/runs/p/resolve", {"by": "ana", "action": "abandon",
                                            "revision": "x", "token": TOKEN})[0] == 400
    assert _post(board, "/runs/p/explode", {"token": TOKEN})[0] == 404
    status, body = _post(board, "/runs/p/cancel", {"by": "ana", "reason": "not needed",
                                                   "token": TOKEN})
    assert (status, json.loads(body)["status"]) == (200, "cancelled")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com", "::"])
def test_it_never_binds_beyond_loopback(file_store: sp.Store, host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(sp.UsageError, match="loopback"):
        Dashboard(file_store, host=host, port=0)


def test_the_command_refuses_a_public_address(tmp_path: Any) -> None:
    result = CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'l.db'}", "dashboard",
                                      "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "loopback" in result.output
