"""``extend_limits`` racing the workers that run the run, with real processes: the two-resumers
test's pattern, with a person's change of limits as the other party.

Two worker processes take runs of six turns (a model call, then an effect at the owner) whose
turn limit is three; the test raises the limit to six at a random moment after each run is
submitted — before a worker took it, while it runs, as it stops, or once it stopped. Whichever
it was, the raise is never lost (every run completes, with the raised limit and one
``run.limits_extended`` event) and no step runs twice (each model call made once, each effect
applied once, as the owner counts them).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import safepoint as sp
from safepoint.testing import OwnerService
from safepoint.types import RunStatus

TESTS = str(Path(__file__).parents[1])
TRIALS = 40
TURNS = 6  # the runs' turn limit is 3 (limit_flows.turns)

# A worker process: two slots, claiming the runs of limit_flows.turns until SIGTERM.
_WORKER = """
import sys
sys.path.insert(0, {tests!r})
import limit_flows, safepoint as sp
store = sp.open_store({url!r})
sp.Worker(store, workflows=["limits-turns"], concurrency=2, rescan=0.2).run()
"""


def _worker(url: str, owner: OwnerService, calls: Path) -> subprocess.Popen[str]:
    import limit_flows

    env = {**os.environ, "SAFEPOINT_OWNER_URL": owner.url, limit_flows.CALLS_ENV: str(calls)}
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER.format(tests=TESTS, url=url)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _submitted_until_stopped(store: sp.Store, run_id: str) -> float:
    """Submit a run, wait for it to stop at its limit, raise it: the seconds until it stopped."""
    import limit_flows

    submitted = time.monotonic()
    sp.submit(store, limit_flows.turns, run_id, TURNS, run_id=run_id)
    while store.get_run(run_id).status is not RunStatus.STOPPED:
        assert time.monotonic() - submitted < 60, "no worker took the run"
        time.sleep(0.002)
    took = time.monotonic() - submitted
    sp.extend_limits(store, run_id, model_calls=TURNS, by="ops", reason="the race")
    return took


def test_extend_limits_racing_the_workers_never_loses_the_raise_nor_runs_a_step_twice(
    store_url: str, owner_env: OwnerService, tmp_path: Path
) -> None:
    import limit_flows

    calls = tmp_path / "model-calls.jsonl"
    store = sp.open_store(store_url)
    workers = [_worker(store_url, owner_env, calls) for _ in range(2)]
    rng = random.Random(20261202)
    ids = [f"race-{trial}-{time.monotonic_ns()}" for trial in range(TRIALS)]
    try:
        # How long a run takes from its submission to its stop, once the workers are warm: the
        # first run warms them, the second is timed (both raised once stopped)
        to_stop = [_submitted_until_stopped(store, run_id) for run_id in ids[:2]][-1]
        for run_id in ids[2:]:  # raised at any moment from before it is taken to after it stopped
            sp.submit(store, limit_flows.turns, run_id, TURNS, run_id=run_id)
            time.sleep(rng.uniform(0, 2 * to_stop))
            sp.extend_limits(store, run_id, model_calls=TURNS, by="ops", reason="the race")
        give_up = time.monotonic() + 120
        while unfinished := [r for r in ids if store.get_run(r).status is not RunStatus.COMPLETED]:
            assert all(worker.poll() is None for worker in workers), [w.communicate() for w in workers]
            assert time.monotonic() < give_up, [(r, store.get_run(r).status.value) for r in unfinished]
            time.sleep(0.05)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.communicate(timeout=60)
    asked = [json.loads(line)["asked"] for line in calls.read_text().splitlines()]
    assert sorted(asked) == sorted(f"{r}/{turn}" for r in ids for turn in range(TURNS))  # each once
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (TRIALS * TURNS, 0)
    landed = {"before it stopped": 0, "once it stopped": 0}
    for run_id in ids:
        run = store.get_run(run_id)
        assert (run.model_call_budget, run.model_calls_spent) == (TURNS, TURNS)
        kinds = [event.kind for event in store.events(run_id)]
        assert kinds.count("run.limits_extended") == 1
        landed["once it stopped" if "run.stopped" in kinds else "before it stopped"] += 1
    assert all(landed.values()), landed  # the raise landed both ways: the race was run
    print("limits race figures:", json.dumps({"trials": TRIALS, **landed}))
    store.close()
