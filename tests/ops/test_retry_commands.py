"""Retrying a failed run from the command line (``safepoint retry``) and from the dashboard's
form on the run's page (with the token), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_dashboard import TOKEN, _get, _post

import safepoint as sp
from safepoint.errors import EffectRejected
from safepoint.ops.cli import cli
from safepoint.ops.dashboard import Dashboard
from safepoint.testing import OwnerService, owner_effect
from safepoint.types import EffectState, RunStatus

_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "SAFEPOINT_URL": None}

charges = owner_effect("charges", name="retry-ops.charges")
_lookups = {"fail": True}


def lookup(name: str) -> dict[str, str]:
    if _lookups["fail"]:
        raise LookupError(f"the customer service did not know {name} yet")
    return {"name": name}


@sp.workflow("retry-ops-greet")
def greet(run: sp.Run, name: str) -> str:
    charge = run.effect("charge", charges, payload={"for": name}, operation_id=f"charge:{name}")
    person = run.read("lookup", lookup, name)
    return f"{person['name']} {charge['id']}"


def _invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


@pytest.fixture
def opened(store_url: str) -> Iterator[sp.Store]:
    store = sp.open_store(store_url)
    yield store
    store.close()


def _failed_lookup(store: sp.Store) -> None:
    _lookups["fail"] = True
    with pytest.raises(sp.StepFailed):
        sp.start(store, greet, "ada", run_id="r")


def _rejected_charge(store: sp.Store, owner: OwnerService) -> None:
    owner.client.set_faults(decline=1)
    with pytest.raises(EffectRejected):
        sp.start(store, greet, "bob", run_id="r")


def test_retry_moves_the_failed_step_and_says_what_it_moved(
    opened: sp.Store, store_url: str, owner_env: OwnerService
) -> None:
    _failed_lookup(opened)
    revision = opened.get_run("r").state_revision
    done = _invoke(
        store_url, "retry", "r", "--by", "ana", "--reason", "it knows ada now", "--revision", str(revision)
    )
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"run 'r' retried: now pending, revision {revision + 1} (a worker takes it, or: safepoint resume r)"
    )
    assert lines[1] == (
        "moved into the history: step 'lookup' (failed with LookupError: the customer service did"
        " not know ada yet); it runs again"
    )
    assert "none is sent again" in lines[-1]
    _lookups["fail"] = False
    resumed = _invoke(store_url, "resume", "r")
    assert resumed.exit_code == 0, resumed.output
    assert opened.get_run("r").result == "ada ch_1"
    assert owner_env.client.stats()["applied"] == 1  # the charge made before the failure, once
    (asked,) = [e for e in opened.events("r") if e.kind == "run.retried"]
    assert (asked.worker, asked.detail["reason"]) == ("ana", "it knows ada now")


def test_retry_resends_a_rejected_operation_only_when_named(
    opened: sp.Store, store_url: str, owner_env: OwnerService
) -> None:
    _rejected_charge(opened, owner_env)
    refused = _invoke(store_url, "retry", "r", "--by", "ana", "--resend", "charge:nobody")
    assert refused.exit_code == 1
    assert "what resend can name (the operations its owner rejected): 'charge:bob' (step 'charge')" in (
        refused.stderr
    )
    assert opened.get_run("r").status is RunStatus.FAILED
    plain = _invoke(store_url, "retry", "r", "--by", "ana")
    assert plain.exit_code == 0, plain.output
    assert (
        "no step moved: the run failed at operation 'charge:bob', which its owner rejected"
        " (a rejection is no failed step)"
    ) in plain.stdout
    assert (
        "kept rejected, not sent again: operation 'charge:bob' (step 'charge') — the run meets its"
        " rejection again; name it with --resend to send it again"
    ) in plain.stdout
    with pytest.raises(EffectRejected):
        sp.resume(opened, "r")
    resent = _invoke(store_url, "retry", "r", "--by", "ana", "--resend", "charge", "--reason", "card updated")
    assert resent.exit_code == 0, resent.output
    key = opened.load_ledger("r").operations["charge:bob"].effect_key
    assert (
        f"will be sent again: operation 'charge:bob' (step 'charge'), attempt 2, under effect key {key}"
    ) in resent.stdout
    _lookups["fail"] = False
    assert sp.resume(opened, "r") == "bob ch_1"
    assert owner_env.client.find_by_key("charges", key)["id"] == "ch_1"


def test_retry_of_a_completed_run_is_a_clear_error(
    opened: sp.Store, store_url: str, owner_env: OwnerService
) -> None:
    _lookups["fail"] = False
    sp.start(opened, greet, "cy", run_id="r")
    refused = _invoke(store_url, "retry", "r", "--by", "ana")
    assert refused.exit_code == 1
    assert "error: retry of run 'r' refused: it completed: its result stands" in refused.stderr
    missing = _invoke(store_url, "retry", "r")
    assert missing.exit_code == 2
    assert "--by" in missing.stderr


# -- the dashboard --------------------------------------------------------------------------------


@pytest.fixture
def board(opened: sp.Store) -> Iterator[Dashboard]:
    with Dashboard(opened, port=0, token=TOKEN) as served:
        yield served


def _forms(page: str, action: str) -> list[str]:
    return re.findall(rf"<form method=post action='[^']*/{action}'[^>]*>.*?</form>", page)


def test_a_failed_run_is_retried_from_its_page_with_the_token(
    board: Dashboard, opened: sp.Store, owner_env: OwnerService
) -> None:
    _rejected_charge(opened, owner_env)
    status, page = _get(board, "/runs/r")
    assert status == 200
    (form,) = _forms(page, "retry")
    assert "<option value='charge:bob'>send charge:bob (charge) again" in form
    assert "no step moved (the workflow itself raised)" in form
    assert TOKEN not in page
    failed = opened.get_run("r")
    fields: dict[str, Any] = {"revision": failed.state_revision, "by": "ana", "resend": "charge:bob"}
    assert _post(board, "/runs/r/retry", fields)[0] == 403  # no token: nothing changes
    assert opened.get_run("r") == failed
    status, body = _post(
        board, "/runs/r/retry", {**fields, "revision": failed.state_revision - 1, "token": TOKEN}
    )
    assert status == 409
    assert "moved since revision" in json.loads(body)["error"]
    status, body = _post(board, "/runs/r/retry", {**fields, "reason": "card updated", "token": TOKEN})
    assert status == 200, body
    assert json.loads(body)["status"] == "pending"
    op = opened.load_ledger("r").operations["charge:bob"]
    assert (op.state, op.key_attempt) == (EffectState.PREPARED, 2)
    (asked,) = [e for e in opened.events("r") if e.kind == "run.retried"]
    assert (asked.worker, [r["operation_id"] for r in asked.detail["resent"]]) == ("ana", ["charge:bob"])
    # pending now: the page offers no retry any more
    assert _forms(_get(board, "/runs/r")[1], "retry") == []


def test_the_retry_form_names_the_failed_step_and_refuses_a_bad_choice(
    board: Dashboard, opened: sp.Store, owner_env: OwnerService
) -> None:
    _failed_lookup(opened)
    (form,) = _forms(_get(board, "/runs/r")[1], "retry")
    assert "run lookup again (the step it failed at)" in form
    assert "name=resend" not in form  # no operation was rejected
    revision = opened.get_run("r").state_revision
    status, body = _post(
        board, "/runs/r/retry", {"revision": revision, "by": "ana", "resend": "charge:ada", "token": TOKEN}
    )
    assert status == 409
    assert "accepted: what happened is never sent again" in json.loads(body)["error"]
    assert opened.get_run("r").status is RunStatus.FAILED
    path = "/runs/" + urllib.parse.quote("r", safe="") + "/retry"
    assert _post(board, path, {"by": "ana", "token": TOKEN})[0] == 400  # the form needs its revision
