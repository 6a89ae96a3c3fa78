"""One bad row never stops the others.

A run whose stored row cannot be read — JSON that does not parse or is not the shape its field
holds, a status or kind this version does not know, a time that is not an integer, text that is
not UTF-8, a missing artifact — is blocked (``unreadable_record``, naming what could not be read)
by the first worker that claims it, listed as unreadable by every listing, and every other run
proceeds. Each row is damaged behind the store's back (``safepoint.testing.tamper``), on every
store."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint.errors import ArtifactMissing, CorruptRecord, RunNotFound
from safepoint.ops.cli import cli
from safepoint.ops.dashboard import Dashboard
from safepoint.storage.base import NewRun
from safepoint.testing.tamper import overwrite
from safepoint.types import (
    AttemptRecord,
    EffectState,
    OperationRecord,
    RunStatus,
    StepKind,
    StepRecord,
    UnreadableRun,
)

TESTS = str(Path(__file__).parents[1])
HEALTHY = 4
MISSING = "sha256:" + "0" * 64

# What is damaged in a run's own row: (columns and the values they get).
RUN_ROW = {
    "inputs-bad-json": {"inputs": "{not json"},
    "inputs-artifact-missing": {"inputs": None, "inputs_ref": MISSING},
    "manifest-bad-json": {"workflow_manifest": "{oops"},
    "manifest-a-list": {"workflow_manifest": "[1]"},
    "manifest-tools-a-list": {"workflow_manifest": '{"tools": [1], "models": [], "prompts": {}}'},
    "manifest-models-objects": {"workflow_manifest": '{"tools": {}, "models": [{}]}'},
    "step-attempts": {"step_attempts": '{"attempts": "many"}'},
    "result": {"result": "{not json"},
    "error-a-list": {"error": "[1]"},
    "recovery-record-text": {"recovery_record": '"text"'},
}
# Readable JSON, but not what a workflow is called with: the engine finds it unreadable.
RUN_INPUTS = {
    "inputs-a-list": {"inputs": "[1, 2]"},
    "inputs-args-not-a-list": {"inputs": '{"args": 3, "kwargs": {}}'},
    "inputs-no-kwargs": {"inputs": '{"args": [3]}'},
}
# Only SQLite can hold these: PostgreSQL's columns are typed and its text is always UTF-8.
RUN_ROW_SQLITE = {
    "inputs-not-utf8": {"inputs": b'{"args": [\xc3\x28], "kwargs": {}}'},
    "created-at-text": {"created_at": "soon"},
    "cost-spent-text": {"cost_spent": "lots"},
    "resume-count-a-float": {"resume_count": 1.5},
}
# What is damaged in the rows of the run's ledger: (table, column, value).
LEDGER_ROW = {
    "step-result": ("safepoint_steps", "result", "{not json"),
    "step-kind": ("safepoint_steps", "kind", "teleported"),
    "step-error-a-list": ("safepoint_steps", "error", "[1]"),
    "step-status": ("safepoint_steps", "status", "maybe"),
    "attempt-error": ("safepoint_attempts", "error", "{"),
    "attempt-kind": ("safepoint_attempts", "kind", "nope"),
    "operation-state": ("safepoint_operations", "state", "teleported"),
    "operation-receipt": ("safepoint_operations", "receipt", "{"),
}
LEDGER_ROW_SQLITE = {
    "step-recorded-at-text": ("safepoint_steps", "recorded_at", "later"),
    "attempt-retry-at-text": ("safepoint_attempts", "retry_at", "soon"),
}


def _pending(store: sp.Store, run_id: str) -> None:
    """A run of ``many-steps`` for any worker, as ``submit`` makes it."""
    import flows

    sp.submit(store, flows.many_steps, 3, run_id=run_id)


def _released_with_a_ledger(store: sp.Store, run_id: str) -> None:
    """A run of ``many-steps`` a worker left behind (released): a step, a failed attempt and a
    prepared effect recorded."""
    _, claim = store.create_run(
        NewRun(
            run_id=run_id,
            workflow="many-steps",
            workflow_version="1",
            input_hash="h",
            inputs={"args": [3], "kwargs": {}},
            owner="gone",
            lease_ms=60_000,
        )
    )
    assert claim is not None
    store.record_step(
        claim,
        StepRecord(
            run_id=run_id, step_id="add", kind=StepKind.PURE, name="add", input_hash="h", result=0, seq=0
        ),
    )
    store.record_attempt(
        claim,
        AttemptRecord(
            run_id=run_id,
            step_id="look",
            attempt=1,
            kind=StepKind.READ,
            name="look",
            input_hash="h",
            error={"type": "TimeoutError", "message": "slow"},
            retry_at=0,
        ),
    )
    payload = b'{"amount":5}'
    store.prepare_effect(
        claim,
        OperationRecord(
            run_id=run_id,
            operation_id="op-1",
            step_id="pay",
            effect="pay",
            state=EffectState.PREPARED,
            payload_ref=f"sha256:{hashlib.sha256(payload).hexdigest()}",
            effect_key="k-1",
        ),
        payload,
    )
    store.release_run(claim)


def _submit_healthy(store: sp.Store) -> list[str]:
    ids = [f"healthy-{index}" for index in range(HEALTHY)]
    for run_id in ids:
        _pending(store, run_id)
    return ids


def _work_until_idle(store: sp.Store) -> sp.Worker:
    """A worker in this process, working until nothing is runnable — which never happens while
    a bad run is claimed and given back in a loop: then it is stopped after a while."""
    worker = sp.Worker(store, workflows=["many-steps"])
    done = threading.Thread(target=worker.run, kwargs={"until_idle": True, "handle_signals": False})
    done.start()
    done.join(timeout=20)
    if done.is_alive():
        worker.stop()
        done.join(timeout=20)
        pytest.fail(f"the worker never went idle: claimed {worker.stats.claimed} times")
    return worker


def _claims_of(store: sp.Store, run_id: str) -> int:
    """How often workers claimed the run (its history says; a store restart under a healthy
    run may make the worker claim that one again)."""
    return sum(event.kind == "run.claimed" for event in store.events(run_id))


def _assert_blocked_unreadable(store: sp.Store, run_id: str, *names: str) -> None:
    [found] = [run for run in store.list_runs(limit=100) if run.run_id == run_id]
    assert found.status is RunStatus.BLOCKED, found
    record = found.recovery_record
    assert record is not None
    assert record["phase"] == "unreadable_record"
    assert all(name in record["reason"] for name in names), record["reason"]
    assert record["task_id"] == run_id
    assert record["workflow_version"] == "many-steps@1"


def _assert_others_completed(store: sp.Store, ids: list[str]) -> None:
    for run_id in ids:
        run = store.get_run(run_id)
        assert (run.status, run.result) == (RunStatus.COMPLETED, 3), run_id


def _check_run_row(
    store: sp.Store, damage: dict[str, Any], caplog: pytest.LogCaptureFixture, *, store_level: bool = True
) -> None:
    _pending(store, "bad")  # the oldest: claimed first
    for column, value in damage.items():
        assert overwrite(store, "safepoint_runs", column, value, run_id="bad") == 1
    healthy = _submit_healthy(store)
    if store_level:
        with pytest.raises((CorruptRecord, ArtifactMissing)):
            store.get_run("bad")
        assert isinstance(store.find_run("bad"), UnreadableRun)
    listed = {run.run_id: run for run in store.list_runs(limit=100)}
    assert set(listed) == {"bad", *healthy}
    with caplog.at_level(logging.INFO, logger="safepoint"):
        worker = _work_until_idle(store)
    assert _claims_of(store, "bad") == 1  # once, never again
    assert worker.stats.blocked == 1
    _assert_blocked_unreadable(store, "bad", *(c for c in damage if not c.endswith("_ref")))
    _assert_others_completed(store, healthy)
    assert len(caplog.records) < 10, [r.getMessage() for r in caplog.records]


def _on_stores(both: dict[str, Any], sqlite_only: dict[str, Any]) -> list[Any]:
    """Each case on every store that can hold it: (``store_url``'s kind, the case)."""
    return [
        pytest.param(kind, case, id=f"{kind}-{name}")
        for cases, kinds in ((both, ("sqlite", "postgres")), (sqlite_only, ("sqlite",)))
        for name, case in cases.items()
        for kind in kinds
    ]


@pytest.mark.parametrize(("store_url", "damage"), _on_stores(RUN_ROW, RUN_ROW_SQLITE), indirect=["store_url"])
def test_a_worker_blocks_a_run_whose_row_is_unreadable_and_runs_the_others(
    store: sp.Store, damage: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    _check_run_row(store, damage, caplog)


@pytest.mark.parametrize("damage", RUN_INPUTS.values(), ids=RUN_INPUTS.keys())
def test_a_worker_blocks_a_run_whose_inputs_are_not_a_runs_inputs(
    store: sp.Store, damage: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    _check_run_row(store, damage, caplog, store_level=False)


def _check_ledger_row(
    store: sp.Store, table: str, column: str, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _released_with_a_ledger(store, "bad")
    assert overwrite(store, table, column, value, run_id="bad") == 1
    healthy = _submit_healthy(store)
    with pytest.raises(CorruptRecord) as corrupt:
        store.load_ledger("bad")
    assert corrupt.value.table == table  # type: ignore[attr-defined]
    assert column in corrupt.value.reason  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="safepoint"):
        _work_until_idle(store)
    assert _claims_of(store, "bad") == 1
    _assert_blocked_unreadable(store, "bad", column)
    _assert_others_completed(store, healthy)
    assert len(caplog.records) < 10, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    ("store_url", "damage"), _on_stores(LEDGER_ROW, LEDGER_ROW_SQLITE), indirect=["store_url"]
)
def test_a_worker_blocks_a_run_whose_ledger_has_an_unreadable_row(
    store: sp.Store, damage: tuple[str, str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    _check_ledger_row(store, *damage, caplog)


def test_a_record_found_unreadable_mid_run_blocks_the_run_too(store: sp.Store) -> None:
    """Wherever a worker meets a record it cannot read — here the cancel request, read only when
    the run stops for it — the run ends blocked, not held until its lease runs out."""
    _, claim = store.create_run(
        NewRun(
            run_id="bad",
            workflow="many-steps",
            workflow_version="1",
            input_hash="h",
            inputs={"args": [3], "kwargs": {}},
            owner="gone",
            lease_ms=60_000,
        )
    )
    assert claim is not None
    store.request_cancel("bad", by="ana", reason="wrong case")
    store.release_run(claim)
    [asked] = [e for e in store.events("bad") if e.kind == "run.cancel_requested"]
    overwrite(store, "safepoint_events", "detail", "{not json", event_id=asked.event_id)
    healthy = _submit_healthy(store)
    worker = _work_until_idle(store)
    assert worker.stats.blocked == 1
    _assert_blocked_unreadable(store, "bad", "detail")
    _assert_others_completed(store, healthy)


def test_a_run_whose_status_is_unknown_is_listed_and_never_claimed(
    store: sp.Store, caplog: pytest.LogCaptureFixture
) -> None:
    _pending(store, "bad")
    assert overwrite(store, "safepoint_runs", "status", "teleported", run_id="bad") == 1
    healthy = _submit_healthy(store)
    with pytest.raises(CorruptRecord, match="status"):
        store.get_run("bad")
    with caplog.at_level(logging.INFO, logger="safepoint"):
        worker = _work_until_idle(store)
    assert _claims_of(store, "bad") == 0
    assert worker.stats.claimed >= HEALTHY
    _assert_others_completed(store, healthy)
    [found] = [run for run in store.list_runs(limit=100) if run.run_id == "bad"]
    assert isinstance(found, UnreadableRun)
    assert (found.status, found.workflow, found.workflow_version) == (None, "many-steps", "1")
    assert "status" in found.columns
    assert "teleported" in found.reason


def test_a_run_whose_lease_cannot_be_read_is_taken_over_not_left_running(file_store: sp.Store) -> None:
    """SQLite can hold text where a lease's expiry belongs: such a lease counts as expired (it
    can never be compared with the clock), so the run is taken over instead of staying
    "running" for ever."""
    file_store.create_run(
        NewRun(
            run_id="bad",
            workflow="many-steps",
            workflow_version="1",
            input_hash="h",
            inputs={"args": [3], "kwargs": {}},
            owner="gone",
            lease_ms=60_000,
        )
    )
    overwrite(file_store, "safepoint_runs", "lease_expires_at", "soon", run_id="bad")
    listed = file_store.find_run("bad")
    assert isinstance(listed, UnreadableRun)
    assert listed.columns == ("lease_expires_at",)
    healthy = _submit_healthy(file_store)
    _work_until_idle(file_store)
    assert _claims_of(file_store, "bad") == 1
    _assert_others_completed(file_store, [*healthy, "bad"])  # the claim wrote a new lease


def test_listings_show_an_unreadable_run_with_what_could_not_be_read(store: sp.Store, store_url: str) -> None:
    _pending(store, "bad")
    overwrite(store, "safepoint_runs", "inputs", "{<b>not json", run_id="bad")
    healthy = _submit_healthy(store)
    runs = store.list_runs(limit=100)
    assert {run.run_id for run in runs} == {"bad", *healthy}
    [bad] = [run for run in runs if isinstance(run, UnreadableRun)]
    assert (bad.run_id, bad.status, bad.columns) == ("bad", RunStatus.PENDING, ("inputs",))
    assert "<b>not json" in bad.reason
    assert [run.run_id for run in store.list_runs(RunStatus.PENDING, 100)].count("bad") == 1
    assert store.find_run("bad") == bad
    assert store.find_run(healthy[0]) == store.get_run(healthy[0])
    with pytest.raises(RunNotFound):
        store.find_run("nobody")

    result = CliRunner().invoke(
        cli,
        ["--store", store_url, "runs"],
        env={"COLUMNS": "200", "SAFEPOINT_URL": None},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if line.split()[:1] == ["bad"]]
    assert "unreadable" in line
    assert "inputs" in line
    shown = CliRunner().invoke(
        cli, ["--store", store_url, "show", "bad"], env={"SAFEPOINT_URL": None}, catch_exceptions=False
    )
    assert shown.exit_code == 1
    assert "inputs" in shown.stderr
    assert "Traceback" not in shown.output

    with Dashboard(store, port=0, token="a-token-for-the-tests-only") as board:
        import urllib.request

        with urllib.request.urlopen(board.url + "/", timeout=10) as page:
            html = page.read().decode()
        asked = urllib.request.Request(
            board.url + "/api/runs", headers={"Authorization": "Bearer a-token-for-the-tests-only"}
        )  # the JSON API needs it
        with urllib.request.urlopen(asked, timeout=10) as answer:
            api = answer.read().decode()
    assert "unreadable" in html
    assert "&lt;b&gt;not json" in html
    assert "<b>not" not in html
    assert '"bad"' in api


def test_record_shows_the_recovery_record_of_a_blocked_unreadable_run(
    store: sp.Store, store_url: str
) -> None:
    _pending(store, "bad")
    overwrite(store, "safepoint_runs", "inputs", "{not json", run_id="bad")
    _work_until_idle(store)
    result = CliRunner().invoke(
        cli, ["--store", store_url, "record", "bad"], env={"SAFEPOINT_URL": None}, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert '"unreadable_record"' in result.stdout


class _FailingLedger:
    """A store whose every ledger read fails as if the database were gone: each run a worker
    claims is interrupted and given back."""

    def __init__(self, store: sp.Store) -> None:
        self._store = store
        self.claims = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claim_next(self, *args: Any) -> Any:
        self.claims += 1
        return self._store.claim_next(*args)

    def load_ledger(self, run_id: str) -> Any:
        raise sp.StoreUnavailable("the database went away")


def test_a_worker_backs_off_when_the_runs_it_claims_are_interrupted(
    file_store: sp.Store, caplog: pytest.LogCaptureFixture
) -> None:
    _pending(file_store, "r")
    failing = _FailingLedger(file_store)
    worker = sp.Worker(failing, workflows=["many-steps"])  # type: ignore[arg-type]
    slot = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    with caplog.at_level(logging.INFO, logger="safepoint"):
        slot.start()
        time.sleep(1.5)
        worker.stop()
        slot.join(timeout=20)
    # back-off from 50 ms, doubling: at most 50 + 100 + 200 + 400 + 800 ms of claims in 1.5 s
    assert 1 <= failing.claims <= 6, failing.claims
    assert len(caplog.records) <= 3, [r.getMessage() for r in caplog.records]


class _Unreachable(_FailingLedger):
    """A store that cannot be reached at all: every claim fails."""

    def claim_next(self, *args: Any) -> Any:
        self.claims += 1
        raise sp.StoreUnavailable("the database is restarting")


def test_a_worker_that_cannot_claim_backs_off_and_says_so_once(
    file_store: sp.Store, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = _Unreachable(file_store)
    worker = sp.Worker(unreachable, workflows=["many-steps"])  # type: ignore[arg-type]
    slot = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    with caplog.at_level(logging.INFO, logger="safepoint"):
        slot.start()
        time.sleep(2.5)
        worker.stop()
        slot.join(timeout=20)
    assert 2 <= unreachable.claims <= 7, unreachable.claims  # 50 ms, 100, … 1.6 s, within 2.5 s
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "cannot claim" in said[0]


def _worker_process(url: str, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safepoint",
            "--store",
            url,
            "worker",
            "--import",
            "flows",
            "--lease",
            "5",
            "--concurrency",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
    )


@pytest.fixture
def stop_after() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_worker_process_blocks_every_unreadable_run_and_its_log_stays_small(
    store: sp.Store, store_url: str, tmp_path: Path, stop_after: list[subprocess.Popen[str]]
) -> None:
    bad = {
        "bad-inputs": ("safepoint_runs", "inputs", "{not json"),
        "bad-manifest": ("safepoint_runs", "workflow_manifest", "[1]"),
        "bad-attempts": ("safepoint_runs", "step_attempts", "nope"),
    }
    for run_id, (table, column, value) in bad.items():
        _pending(store, run_id)
        overwrite(store, table, column, value, run_id=run_id)
    _released_with_a_ledger(store, "bad-step")
    overwrite(store, "safepoint_steps", "result", "{not json", run_id="bad-step")
    _pending(store, "bad-status")
    overwrite(store, "safepoint_runs", "status", "teleported", run_id="bad-status")
    healthy = _submit_healthy(store)
    log = tmp_path / "worker.log"
    worker = _worker_process(store_url, log)
    stop_after.append(worker)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = {run.run_id: run for run in store.list_runs(limit=100)}
        if all(runs[r].status is RunStatus.COMPLETED for r in healthy) and all(
            runs[r].status is RunStatus.BLOCKED for r in (*bad, "bad-step")
        ):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # idle a while: nothing more may be claimed or logged
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    lines = log.read_text().splitlines()
    _assert_others_completed(store, healthy)
    for run_id in (*bad, "bad-step"):
        _assert_blocked_unreadable(store, run_id)
    assert len(lines) < 50, "\n".join(lines[:60])
    assert sum("bad-inputs" in line for line in lines) == 1, "\n".join(lines)
    result = CliRunner().invoke(
        cli,
        ["--store", store_url, "runs"],
        env={"COLUMNS": "200", "SAFEPOINT_URL": None},
        catch_exceptions=False,
    )
    listed = [line.split()[0] for line in result.stdout.splitlines()[1:] if line.split()]
    assert set(listed) >= {*bad, "bad-step", "bad-status", *healthy}


def test_a_record_met_unreadable_mid_run_blocks_as_unreadable(store: sp.Store, crash_at: Any) -> None:
    """Not only at load: an earlier run of the chain whose settled operation turns out
    unreadable when the successor looks it up blocks the successor (``unreadable_record``),
    never as a store's refusal and never by sending the operation again."""
    sent: list[str] = []
    charge = sp.Effect(
        "unreadable-mid.charge", execute=lambda payload, key: sent.append(str(key)) or {"id": "ch_1"}
    )

    @sp.workflow("unreadable-mid-run")
    def flow(run: sp.Run, generation: int) -> Any:
        receipt = run.effect("charge", charge, payload={"amount": 5}, operation_id="charge:1")
        if generation == 0:
            run.continue_as_new(1)
        return receipt

    crash_at("run.after_continue")
    with pytest.raises(BaseException, match="crash"):
        sp.start(store, flow, 0, run_id="c", lease_ms=0)
    crash_at(None)
    overwrite(store, "safepoint_operations", "receipt", "{not json", run_id="c", operation_id="charge:1")
    with pytest.raises(CorruptRecord):
        sp.resume(store, "c")
    successor = store.get_run("c~1")
    assert successor.status is RunStatus.BLOCKED
    assert (successor.recovery_record or {}).get("phase") == "unreadable_record"
    assert len(sent) == 1
