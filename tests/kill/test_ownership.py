"""Ownership with real processes: two resumers from one revision, and zombie workers.

These tests take the store URL from the ``store_url`` fixture, so they run on every store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import safepoint as sp
from safepoint.testing import OwnerService, child_outcome, run_child, spawn_child
from safepoint.types import RunStatus

TESTS = str(Path(__file__).parents[1])
TRIALS = 1000
ZOMBIE_LEASE_MS = 1000

# A resumer process: for each run id on stdin, read the run (its revision), say "ready", wait
# for "go", then try to take it over from that revision and carry it on.
_RESUMER = """
import json, sys
sys.path.insert(0, {tests!r})
import flows, safepoint as sp
from safepoint._engine import verbs as _verbs
from safepoint.errors import RunOwned
store = sp.open_store({url!r})
for line in sys.stdin:
    run = store.get_run(line.strip())
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        _verbs.resume_record(store, run, 30_000)
        outcome = "returned"  # executed it, or found it finished by the other one
    except RunOwned:
        outcome = "owned"
    except sp.LostOwnership:
        outcome = "lost"
    print(json.dumps({{"run": run.run_id, "outcome": outcome}}), flush=True)
"""


def _resumer(url: str, owner: OwnerService) -> subprocess.Popen[str]:
    env = {**os.environ, "SAFEPOINT_OWNER_URL": owner.url}
    return subprocess.Popen(
        [sys.executable, "-c", _RESUMER.format(tests=TESTS, url=url)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


@pytest.mark.slow
def test_two_resumers_from_one_revision(store_url: str, owner_env: OwnerService) -> None:
    """≥1000 trials: both processes read the same revision, then both try to take the run.
    Exactly one executes; the other writes nothing and dispatches nothing."""
    import flows

    store = sp.open_store(store_url)
    prefix = f"race-{time.monotonic_ns()}"
    ids = [f"{prefix}-{i}" for i in range(TRIALS)]
    for run_id in ids:
        sp.submit(store, flows.fenced, run_id, run_id=run_id)
    resumers = [_resumer(store_url, owner_env) for _ in range(2)]
    outcomes: dict[str, list[str]] = {}
    try:
        for run_id in ids:
            for proc in resumers:
                proc.stdin.write(run_id + "\n")  # type: ignore[union-attr]
            for proc in resumers:
                assert proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            for proc in resumers:
                proc.stdin.write("go\n")  # type: ignore[union-attr]
            outcomes[run_id] = sorted(
                json.loads(proc.stdout.readline())["outcome"]  # type: ignore[union-attr]
                for proc in resumers
            )
    finally:
        for proc in resumers:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=30)
    assert all(pair in (["owned", "returned"], ["returned", "returned"]) for pair in outcomes.values()), (
        outcomes
    )
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (TRIALS, 0)
    stale = []
    for run_id in ids:
        run = store.get_run(run_id)
        assert run.status is RunStatus.COMPLETED
        assert run.fence == 1
        # one claim, and every write after it made by that worker under its fence
        events = [e for e in store.events(run_id) if e.kind != "run.submitted"]
        claims = [e for e in events if e.kind == "run.claimed"]
        writers = {(e.worker, e.fence) for e in events}
        if len(claims) != 1 or len(writers) != 1:
            stale.append((run_id, writers))
    assert stale == []
    figures = {
        "trials": TRIALS,
        "claims_won": TRIALS,
        "refused_owned": sum(pair == ["owned", "returned"] for pair in outcomes.values()),
        "attached_to_result": sum(pair == ["returned", "returned"] for pair in outcomes.values()),
        "stale_writes_accepted": len(stale),
        "dispatches": stats["applied"],
        "duplicates": stats["duplicates"],
    }
    print("two-resumer figures:", json.dumps(figures))


RETRY_TRIALS = 200

# A retrier process: for each run id on stdin, read the failed run (its revision), say "ready",
# wait for "go", then retry it from that revision and resume it.
_RETRIER = """
import json, sys
sys.path.insert(0, {tests!r})
import flows, safepoint as sp
from safepoint.errors import RetryRefused, RunOwned
store = sp.open_store({url!r})
for line in sys.stdin:
    run = store.get_run(line.strip())
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        sp.retry(store, run.run_id, by={who!r}, expected_revision=run.state_revision)
        retried = "retried"
    except RetryRefused:
        retried = "refused"
    try:
        sp.resume(store, run.run_id, lease_ms=30_000)
        resumed = "returned"  # executed it, or found it finished by another
    except RunOwned:
        resumed = "owned"
    print(json.dumps({{"run": run.run_id, "retry": retried, "resume": resumed}}), flush=True)
"""

# A worker process, claiming every runnable run of the race as soon as one is retried.
_WORKER = """
import sys
sys.path.insert(0, {tests!r})
import flows, safepoint as sp
sp.Worker(sp.open_store({url!r}), workflows=["retry-race"], rescan=0.05).run()
"""


def _python(script: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )


def test_retries_racing_each_other_and_a_worker(
    store_url: str, owner_env: OwnerService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial: a run failed at a lookup after sending its ticket; two processes read it at
    the same revision and both retry it from there, then resume it, while a worker process
    claims whatever becomes runnable. One retry wins, the other is refused; one process
    executes the run; the lookup is asked once more and the ticket is never sent again."""
    import flows

    monkeypatch.setenv(flows.RETRY_RACE_DIR, str(tmp_path))
    env = {**os.environ, "SAFEPOINT_OWNER_URL": owner_env.url}
    store = sp.open_store(store_url)
    prefix = f"retry-race-{time.monotonic_ns()}"
    ids = [f"{prefix}-{i}" for i in range(RETRY_TRIALS)]
    for run_id in ids:
        with pytest.raises(sp.StepFailed):
            sp.start(store, flows.retry_race, run_id, run_id=run_id)
        (tmp_path / run_id).touch()  # the lookup's service is back for it
    racers = [_python(_RETRIER.format(tests=TESTS, url=store_url, who=who), env) for who in ("ana", "bo")]
    worker = _python(_WORKER.format(tests=TESTS, url=store_url), env)
    outcomes: dict[str, list[dict[str, str]]] = {}
    try:
        for run_id in ids:
            for proc in racers:
                proc.stdin.write(run_id + "\n")  # type: ignore[union-attr]
            for proc in racers:
                assert proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
            for proc in racers:
                proc.stdin.write("go\n")  # type: ignore[union-attr]
            outcomes[run_id] = [
                json.loads(proc.stdout.readline())  # type: ignore[union-attr]
                for proc in racers
            ]
    finally:
        for proc in racers:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(timeout=30)
        worker.send_signal(signal.SIGTERM)  # drains: what it holds goes on to its end
        worker.communicate(timeout=60)
    assert all(sorted(o["retry"] for o in pair) == ["refused", "retried"] for pair in outcomes.values()), (
        outcomes
    )
    calls = (tmp_path / "calls").read_text().split()
    asked_twice = [run_id for run_id in ids if calls.count(run_id) != 2]
    assert asked_twice == []  # failed once, asked once more after the retry: never twice
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (RETRY_TRIALS, 0)
    unfenced, executors = [], {"worker": 0, "resumer": 0}
    for run_id in ids:
        run = store.get_run(run_id)
        assert run.status is RunStatus.COMPLETED, (run_id, run.status, run.error)
        assert run.result == {"ticket": run.result["ticket"], "found": run_id}
        events = store.events(run_id)
        kinds = [e.kind for e in events]
        assert kinds.count("run.retried") == 1
        after = events[kinds.index("run.retried") + 1 :]
        claims = [e for e in after if e.kind == "run.claimed"]
        writers = {(e.worker, e.fence) for e in after}
        if len(claims) != 1 or len(writers) != 1:
            unfenced.append((run_id, writers))
        by_worker = bool(claims) and f":{worker.pid}:" in str(claims[0].worker)
        executors["worker" if by_worker else "resumer"] += 1
    assert unfenced == []
    print(
        "retry-race figures:",
        json.dumps({"trials": RETRY_TRIALS, **executors, "dispatches": stats["applied"]}),
    )


def _wait_stopped(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat", encoding="ascii") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        if proc.poll() is not None:
            raise AssertionError(f"child exited instead of stopping: {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError("child never reached its stop point")


@pytest.mark.parametrize(
    "point",
    [
        "step.before_record",  # frozen inside a long step: its record is refused by the fence
        "effect.after_dispatching",  # frozen between "dispatching" and the call: the owner refuses it
    ],
)
def test_a_zombie_worker_writes_nothing_and_dispatches_nothing(
    store_url: str, owner_env: OwnerService, point: str
) -> None:
    """Worker A freezes (SIGSTOP, heartbeat and all) until its lease expires; worker B takes the
    run over and finishes it; A wakes up (SIGCONT) and must neither write nor dispatch."""
    run_id = f"zombie-{time.monotonic_ns()}"
    zombie = spawn_child(
        "flows:fenced",
        store_url=store_url,
        run_id=run_id,
        args=[run_id],
        crash_at=point,
        crash_mode="stop",
        owner_url=owner_env.url,
        pythonpath=[TESTS],
        lease_ms=ZOMBIE_LEASE_MS,
    )
    _wait_stopped(zombie)
    store = sp.open_store(store_url)
    zombie_owner = store.get_run(run_id).owner
    time.sleep(ZOMBIE_LEASE_MS / 1000 + 0.3)  # frozen, it cannot renew: the lease runs out
    taken = run_child(
        "flows:fenced",
        store_url=store_url,
        run_id=run_id,
        resume=True,
        owner_url=owner_env.url,
        pythonpath=[TESTS],
        timeout=90,
    )
    assert taken.outcome is not None, taken.stderr
    assert taken.outcome["status"] == "completed", taken.outcome
    events_before = len(store.events(run_id))
    zombie.send_signal(signal.SIGCONT)
    stdout, stderr = zombie.communicate(timeout=60)
    woke = child_outcome(zombie.returncode, stdout, stderr)
    assert woke.outcome == {"status": "lost", "error": "LostOwnership", "fence": 1}, stderr
    run = store.get_run(run_id)
    assert run.status is RunStatus.COMPLETED
    assert run.fence == 2
    late = store.events(run_id)[events_before:]
    assert late == []  # the zombie wrote nothing after it woke
    assert all(e.worker != zombie_owner for e in store.events(run_id) if e.fence == 2)
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    # frozen before dispatch: its record was refused; frozen mid-dispatch: its call was refused
    # by the owner's fence (the same idempotency key alone would have been replayed, not refused)
    assert stats["stale_fence_refused"] == (1 if point.startswith("effect") else 0)
    assert stats["highest_fence"] == {f"charges:{run_id}": 2}
