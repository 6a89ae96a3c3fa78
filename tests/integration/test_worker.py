"""Workers on SQLite: submitted runs are claimed once, executed, and survive SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import safepoint as sp
from safepoint.errors import RunConflict
from safepoint.testing import OwnerService
from safepoint.types import RunStatus

TESTS = str(Path(__file__).parents[1])


def _worker_process(url: str, owner: OwnerService, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SAFEPOINT_OWNER_URL": owner.url,
        "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
    }
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
            "1",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_submit_is_idempotent_per_run_id(memory_store: sp.Store) -> None:
    import flows

    assert sp.submit(memory_store, flows.many_steps, 3, run_id="job") == "job"
    assert sp.submit(memory_store, flows.many_steps, 3, run_id="job") == "job"
    with pytest.raises(RunConflict):
        sp.submit(memory_store, flows.many_steps, 4, run_id="job")
    assert memory_store.get_run("job").status is RunStatus.PENDING


def test_worker_in_process_drains_the_queue(file_store: sp.Store) -> None:
    import flows

    for index in range(10):
        sp.submit(file_store, flows.many_steps, index, run_id=f"job-{index}")
    stats = sp.Worker(file_store, concurrency=3, workflows=["many-steps"]).run(
        until_idle=True, handle_signals=False
    )
    assert stats.completed == 10
    assert [file_store.get_run(f"job-{i}").result for i in range(10)] == [sum(range(i)) for i in range(10)]


def test_workers_in_processes_survive_sigkill(tmp_path: Path, owner_env: OwnerService) -> None:
    """Two worker processes; one is SIGKILLed mid-way; the other finishes everything once."""
    import flows

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = sp.open_store(url)
    owner_env.client.set_faults(delay=0.1)
    for index in range(12):
        sp.submit(store, flows.every_kind, f"case-{index}", run_id=f"job-{index}")
    doomed = _worker_process(url, owner_env)
    # killed once it holds a run (a loaded machine may take seconds to start a process)
    holding = time.monotonic() + 60
    while time.monotonic() < holding and not any(
        run.status is RunStatus.RUNNING for run in store.list_runs(limit=100)
    ):
        time.sleep(0.02)
    time.sleep(0.15)  # mid-run: past its first steps, inside a slow effect
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()
    interrupted = [run.run_id for run in store.list_runs(limit=100) if run.status is RunStatus.RUNNING]
    assert len(interrupted) == 1  # killed mid-run, holding exactly one
    # not --until-idle: the killed worker's run becomes runnable only when its lease expires,
    # and nothing announces that; so wait for every run to end, then drain the survivor
    survivor = _worker_process(url, owner_env, "--concurrency", "2")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = store.list_runs(limit=100)
        if all(run.status.terminal for run in runs):
            break
        time.sleep(0.2)
    survivor.send_signal(signal.SIGTERM)
    survivor.wait(timeout=60)
    owner_env.client.set_faults(delay=0)
    runs = store.list_runs(limit=100)
    assert all(run.status is RunStatus.COMPLETED for run in runs), [(r.run_id, r.status) for r in runs]
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (24, 0)
    assert store.get_run(interrupted[0]).resume_count == 1  # taken over after the lease


def test_sigterm_drains(tmp_path: Path, owner_env: OwnerService) -> None:
    import flows

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = sp.open_store(url)
    owner_env.client.set_faults(delay=0.2)
    for index in range(3):
        sp.submit(store, flows.every_kind, f"case-{index}", run_id=f"job-{index}")
    worker = _worker_process(url, owner_env)
    deadline = time.monotonic() + 30
    while store.get_run("job-0").status is RunStatus.PENDING and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    owner_env.client.set_faults(delay=0)
    assert worker.returncode == 0, err
    assert "draining" in err
    assert store.get_run("job-0").status is RunStatus.COMPLETED  # finished, not abandoned
    assert store.get_run("job-2").status is RunStatus.PENDING  # never claimed


def test_an_idle_worker_told_to_stop_leaves_at_once_not_after_its_rescan(store: sp.Store) -> None:
    import threading

    import flows

    worker = sp.Worker(store, workflows=[flows.every_kind.name], rescan=30.0)
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(worker.run(handle_signals=False)))
    thread.start()
    time.sleep(0.5)  # idle, inside its 30 s wait for work
    stopped = time.monotonic()
    worker.stop()
    thread.join(timeout=20)
    assert done, "the worker is still waiting"
    assert time.monotonic() - stopped < 5.0  # woken, not the 30 s rescan


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_idle_worker_process_leaves_at_once_on_a_signal(
    store_url: str, owner_env: OwnerService, signum: signal.Signals
) -> None:
    """``safepoint worker`` with nothing to do, told to stop by SIGTERM (a deploy) or Ctrl-C:
    its wait for work is woken, it prints what it did and exits 0 — it neither sleeps out its
    wait nor dies of the signal. (The command's rescan is its default, 1 s: this holds the
    signal's path to the wait; the 30 s wait itself is the test above's.)"""
    worker = _worker_process(store_url, owner_env)
    assert worker.stderr is not None
    banner = worker.stderr.readline()  # printed once the store is open, as the slots start
    assert banner.startswith("worker "), banner
    time.sleep(0.5)  # its handlers installed, its one slot idle inside its wait
    signalled = time.monotonic()
    worker.send_signal(signum)
    _, err = worker.communicate(timeout=30)
    assert time.monotonic() - signalled < 5.0, err
    assert worker.returncode == 0, err
    assert "draining" in err
    assert "worker stopped: claimed 0," in err
