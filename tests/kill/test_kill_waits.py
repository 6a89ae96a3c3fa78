"""Durable waits with real processes killed by SIGKILL, on every store: a run waiting for a
message, or sleeping, outlives the worker that made it wait; a new worker finishes it, with the
message recorded once and the effect after the wait sent once; a sleep is neither shortened nor
restarted; and a message sent while a worker is about to wait is never lost."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import safepoint as sp
from safepoint.testing import OwnerService, run_child
from safepoint.types import RunRecord, RunStatus

TESTS = str(Path(__file__).parents[1])
RACES = 200  # trials of a send racing a worker about to wait, per store


def _env(owner: OwnerService, crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SAFEPOINT_CRASH_AT", "SAFEPOINT_CRASH_MODE")}
    env["SAFEPOINT_OWNER_URL"] = owner.url
    env["PYTHONPATH"] = os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])])
    if crash_at:
        env["SAFEPOINT_CRASH_AT"] = crash_at
    return env


@contextmanager
def _worker(url: str, owner: OwnerService, crash_at: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """A `safepoint worker` process (lease 1 s), SIGKILLed at the end if it still runs."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safepoint",
            "--store",
            url,
            "worker",
            "--import",
            "wait_flows",
            "--lease",
            "1",
        ],
        env=_env(owner, crash_at),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)


def _until(store: sp.Store, run_id: str, *statuses: RunStatus, timeout: float = 60.0) -> RunRecord:
    deadline = time.monotonic() + timeout
    while True:
        run = store.get_run(run_id)
        if run.status in statuses:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.01)


def _applied(owner: OwnerService) -> tuple[int, int]:
    stats = owner.client.stats()
    return int(stats["applied"]), int(stats["duplicates"])


@pytest.mark.parametrize(
    "kill",
    [
        "waiting",  # killed after the run went waiting: it holds nothing, the run waits on
        "step.before_record:answer",  # killed at the gate, before it: nothing of the wait is recorded
        "step.after_record:answer",  # killed after the wait took the message: it is the step's
    ],
)
def test_a_wait_survives_a_sigkill_of_its_worker(store_url: str, owner_env: OwnerService, kill: str) -> None:
    import wait_flows

    store = sp.open_store(store_url)
    run_id = f"wait-{time.monotonic_ns()}"
    sp.submit(store, wait_flows.answer, "c-1", run_id=run_id)
    payload = {"approved": True, "by": "ana"}
    if kill == "step.after_record:answer":
        sp.send(store, run_id, "answer", payload)  # before the run waits: the wait takes it
    crash = None if kill == "waiting" else kill
    with _worker(store_url, owner_env, crash) as doomed:
        if crash is None:
            waiting = _until(store, run_id, RunStatus.WAITING)
            assert waiting.owner is None  # released: the worker holds nothing of it
            doomed.send_signal(signal.SIGKILL)
        assert doomed.wait(timeout=60) == -signal.SIGKILL
    killed = store.get_run(run_id)
    if kill == "step.after_record:answer":
        assert killed.status is RunStatus.RUNNING  # its dead worker's lease runs out
        assert store.load_ledger(run_id).steps["answer"].result == payload
    else:
        if kill == "waiting":
            assert killed.status is RunStatus.WAITING
        sp.send(store, run_id, "answer", payload)  # after the run suspended, or its worker died
    assert _applied(owner_env) == (0, 0)
    with _worker(store_url, owner_env) as survivor:
        done = _until(store, run_id, RunStatus.COMPLETED)
        survivor.send_signal(signal.SIGTERM)
    assert done.result == {"answer": payload, "reply": "re_1"}
    assert _applied(owner_env) == (1, 0)  # the effect after the wait: sent once
    [message] = store.messages(run_id)
    assert (message.payload, message.taken_by) == (payload, "answer")
    assert [e.kind for e in store.events(run_id)].count("message.received") == 1  # recorded once
    assert store.load_ledger(run_id).steps["answer"].fence == (1 if kill == "step.after_record:answer" else 2)


def test_a_sleep_survives_a_sigkill_neither_shortened_nor_restarted(
    store_url: str, owner_env: OwnerService
) -> None:
    import wait_flows

    seconds = 4.0
    store = sp.open_store(store_url)
    run_id = f"sleep-{time.monotonic_ns()}"
    sp.submit(store, wait_flows.sleeper, "c-1", seconds, run_id=run_id)
    with _worker(store_url, owner_env) as doomed:
        sleeping = _until(store, run_id, RunStatus.WAITING)
        time.sleep(0.3)
        doomed.send_signal(signal.SIGKILL)
        assert doomed.wait(timeout=60) == -signal.SIGKILL
    step = store.load_ledger(run_id).steps["sleep"]
    until = step.result["until"]
    assert until == step.recorded_at + int(seconds * 1000)  # recorded at its first run
    assert (sleeping.wake_at, store.get_run(run_id).wake_at) == (until, until)
    assert store.now() < until  # killed well before it was due
    # a restart before it is due, in a process of its own: it sleeps on, to the same instant
    early = run_child(
        "wait_flows:sleeper", store_url=store_url, run_id=run_id, resume=True, pythonpath=[TESTS]
    )
    assert early.outcome == {"status": "error", "error": "Sleeping", "message": early.outcome["message"]}
    assert store.load_ledger(run_id).steps["sleep"] == step
    assert store.get_run(run_id).wake_at == until
    with _worker(store_url, owner_env) as survivor:  # up and idle before the run is due
        done = _until(store, run_id, RunStatus.COMPLETED, timeout=seconds * 5)
        survivor.send_signal(signal.SIGTERM)
    finished = next(e.at for e in store.events(run_id) if e.kind == "run.completed")
    assert finished >= until  # not shortened
    assert finished < until + seconds * 1000 * 0.75  # not restarted (that ends a sleep later)
    claims = [e for e in store.events(run_id) if e.kind == "run.claimed"]
    assert claims[-1].at >= until  # the survivor took it when it fell due, not before
    assert store.load_ledger(run_id).steps["sleep"] == step  # the same record: never again
    assert done.result == {"reply": "re_1"}
    assert _applied(owner_env) == (1, 0)


# A racer process, one per role. Each line on stdin names a run: the racer says "ready",
# waits for "go", then — a resumer — carries the run on (its workflow's first step is the wait)
# or — a sender — sends it its message, after a pause drawn from the line; and says what
# happened.
_RACER = """
import json, sys, time
sys.path.insert(0, {tests!r})
import wait_flows, safepoint as sp
from safepoint._engine import verbs as _verbs
store = sp.open_store({url!r})
role = {role!r}
for line in sys.stdin:
    run_id, pause = line.split()
    run = store.get_run(run_id) if role == "resumer" else None
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(float(pause))
    if role == "sender":
        store.send_message(run_id, "answer", {{"run": run_id}})
        outcome = "sent"
    else:
        try:
            _verbs.resume_record(store, run, 30_000)
            outcome = "completed"
        except sp.AwaitingMessage:
            outcome = "waiting"
    print(json.dumps({{"run": run_id, "outcome": outcome}}), flush=True)
"""


def _racer(url: str, owner: OwnerService, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _RACER.format(tests=TESTS, url=url, role=role)],
        env=_env(owner),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def test_a_send_racing_a_worker_about_to_wait_is_never_lost(store_url: str, owner_env: OwnerService) -> None:
    """Hundreds of trials: a worker carries a run to its wait while, in another process, the
    message is sent, their timing swept across the gate. Each ends one of two ways — the wait
    took the message, or the send found the run waiting and made it pending — never a run left
    waiting beside its message; every run then finishes with its payload, the reply sent once."""
    import wait_flows

    store = sp.open_store(store_url)
    prefix = f"race-{time.monotonic_ns()}"
    ids = [f"{prefix}-{i}" for i in range(RACES)]
    for run_id in ids:
        sp.submit(store, wait_flows.answer, run_id, run_id=run_id)
    resumer, sender = _racer(store_url, owner_env, "resumer"), _racer(store_url, owner_env, "sender")
    racers, draw = (resumer, sender), random.Random(12)
    outcomes: dict[str, str] = {}
    lost = []
    try:
        for run_id in ids:
            # the sender's pause sweeps the window in which the resumer reaches the gate
            pauses = {resumer: 0.0, sender: draw.uniform(0.0, 0.03)}
            for proc in racers:
                proc.stdin.write(f"{run_id} {pauses[proc]}\n")  # type: ignore[union-attr]
            for proc in racers:
                assert proc.stdout.readline().strip() == "ready", proc.stderr.read()  # type: ignore[union-attr]
            for proc in racers:
                proc.stdin.write("go\n")  # type: ignore[union-attr]
            said = {proc: json.loads(proc.stdout.readline())["outcome"] for proc in racers}  # type: ignore[union-attr]
            outcomes[run_id] = said[resumer]
            run = store.get_run(run_id)
            [message] = store.messages(run_id)
            if run.status is RunStatus.WAITING or (message.taken_by is None) == (
                said[resumer] == "completed"
            ):
                lost.append((run_id, run.status, said[resumer], message.taken_by))
    finally:
        for proc in racers:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=30)
    assert lost == []
    for run_id in ids:  # those the send woke are pending: carry them on
        assert sp.resume(store, run_id)["answer"] == {"run": run_id}
    assert _applied(owner_env) == (RACES, 0)
    assert all([e.kind for e in store.events(run_id)].count("message.received") == 1 for run_id in ids)
    both = {outcome: list(outcomes.values()).count(outcome) for outcome in ("completed", "waiting")}
    print("send-race figures:", json.dumps({"trials": RACES, **both, "lost": len(lost)}))
    assert both["completed"], both  # the timing really was swept across the gate
    assert both["waiting"], both
