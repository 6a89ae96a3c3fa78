"""Kill-test children forked from a zygote (``safepoint.testing.zygote``): each is a process of
its own, killed with SIGKILL at its armed crash point, with its own environment and output; a
trial whose first process and resumes come from zygotes ends as one of fresh interpreters does;
and the zygotes of the two roles are two interpreters, so a resume shares nothing — not even
the hash seed — with the process that was killed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from safepoint.errors import UsageError
from safepoint.testing import KillHarness, OwnerService, run_child, spawn_child
from safepoint.testing.zygote import ForkedChild, shared_zygote

TESTS = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def kill_owner() -> Iterator[OwnerService]:
    with OwnerService() as service:
        yield service


PROBE = """
import os
import safepoint as sp

@sp.workflow("zygote-probe")
def probe(run: sp.Run) -> dict:
    return {"pid": os.getpid(), "hash": str(hash("a string")), "marker": os.environ.get("ZYGOTE_MARKER")}
"""


def test_a_forked_child_is_a_process_of_its_own_with_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe_flows.py").write_text(PROBE)
    zygote = shared_zygote(("safepoint",), [str(tmp_path)])
    url = f"sqlite:///{tmp_path / 'probe.db'}"
    monkeypatch.setenv("ZYGOTE_MARKER", "one")
    first = run_child(
        "probe_flows:probe", store_url=url, run_id="a", pythonpath=[str(tmp_path)], zygote=zygote
    )
    monkeypatch.setenv("ZYGOTE_MARKER", "two")
    second = run_child(
        "probe_flows:probe", store_url=url, run_id="b", pythonpath=[str(tmp_path)], zygote=zygote
    )
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert first.outcome is not None
    assert second.outcome is not None
    ran = [first.outcome["result"], second.outcome["result"]]
    assert [r["marker"] for r in ran] == ["one", "two"]  # the environment of the call, not the zygote's
    assert len({ran[0]["pid"], ran[1]["pid"], os.getpid()}) == 3
    resumer = shared_zygote(("safepoint",), [str(tmp_path)], role="resume")
    third = run_child(
        "probe_flows:probe", store_url=url, run_id="c", pythonpath=[str(tmp_path)], zygote=resumer
    )
    assert third.outcome is not None
    assert third.outcome["result"]["hash"] != ran[0]["hash"]  # another interpreter: another hash seed


def test_a_forked_child_dies_at_its_crash_point_and_by_a_signal(
    kill_owner: OwnerService, tmp_path: Path
) -> None:
    zygote = shared_zygote(("safepoint",), [TESTS])
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    child = {"store_url": url, "owner_url": kill_owner.url, "pythonpath": [TESTS], "zygote": zygote}
    killed = run_child("flows:lines", run_id="k", args=[2], crash_at="effect.after_dispatching@2", **child)  # type: ignore[arg-type]
    assert killed.killed, killed.stderr
    assert killed.outcome is None
    resumed = run_child("flows:lines", run_id="k", resume=True, **child)  # type: ignore[arg-type]
    assert resumed.outcome is not None, resumed.stderr
    assert resumed.outcome["status"] == "completed"
    frozen = spawn_child(
        "flows:lines", run_id="s", args=[1], crash_at="effect.after_dispatching", crash_mode="stop", **child
    )  # type: ignore[arg-type]
    assert isinstance(frozen, ForkedChild)
    try:
        with pytest.raises(Exception, match="forked child"):
            frozen.wait(timeout=3)  # stopped, not ended
    finally:
        frozen.send_signal(signal.SIGKILL)
    assert frozen.wait(timeout=30) == -signal.SIGKILL
    with pytest.raises(UsageError, match="preload="):
        shared_zygote(("no_such_module_anywhere",), [TESTS], role="misnamed")
    bad = run_child("flows:nothing_here", run_id="x", **child)  # type: ignore[arg-type]
    assert bad.returncode != 0
    assert "nothing_here" in bad.stderr  # its traceback reaches the caller


def test_a_trial_from_zygotes_ends_as_one_from_fresh_interpreters(
    kill_owner: OwnerService, tmp_path: Path
) -> None:
    fresh = KillHarness("flows:lines", [3], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS])
    forked = KillHarness(
        "flows:lines", [3], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS], preload=("safepoint",)
    )
    for harness in (fresh, forked):
        report = harness.trial(crash_at="effect.after_receiver_commit@2")
        assert report.killed
        assert report.resumes == 1
        report.check()  # the result of an uninterrupted run, each charge applied once
    assert fresh.reference() == forked.reference()
