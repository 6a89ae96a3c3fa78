"""The benchmark harness must not rot: its quickest mode runs here, safepoint alone, on SQLite.

The full benchmark (with DBOS and LangGraph) is `make bench`; it is never part of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from safepoint._engine.core import PURE_BATCH

ROOT = Path(__file__).resolve().parents[2]
# The harness is a folder of the repository, not a package of the library: its pure functions
# are imported from there.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.mark.slow
@pytest.mark.timeout(240)  # the subprocess has its own timeout, 180 s: a busy machine is slow
def test_the_quickest_benchmark_measures_every_safepoint_workload_and_writes_its_results(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--systems",
            "safepoint",
            "--backends",
            "sqlite",
            "--modes",
            "defaults",
            "--no-chart",
            "--no-profile",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [written] = tmp_path.glob("quick-*.json")
    results = json.loads(written.read_text())
    assert {c["system"] for c in results["cells"]} == {"floor", "safepoint"}
    medians = results["summary"]["sqlite/defaults"]
    figures = medians["safepoint"]
    assert figures["w1"]["steps_per_s"] > 0
    assert figures["w2"]["bytes"] > 0
    assert figures["w2"]["last_over_first"] > 0
    assert figures["w3"]["steps_per_s"] > 0
    # pure steps are written in batches: what the SIGKILL caught unwritten is computed again
    kill_at = results["meta"]["sizes"]["w4_kill_at"]
    assert figures["w4"]["replayed"] == kill_at - kill_at % PURE_BATCH
    assert figures["w4"]["reexecuted"] == kill_at % PURE_BATCH + 1
    assert figures["w4"]["replay_cpu_steps_per_s"] > 0
    assert figures["w5"]["effects_per_s"] > 0
    assert figures["w5"]["owner_stats"]["duplicates"] == 0
    for sdk in ("anthropic", "openai"):
        assert figures["w6"][sdk]["raw_ms"] > 0
        assert figures["w6"][sdk]["recorded_ms"] > 0
    assert figures["w7"]["turns"] == results["meta"]["sizes"]["w7_turns"]
    assert figures["w7"]["cpu"]["last_ms"] > 0
    assert set(medians["floor"]["w0"]) == {"wal_normal", "wal_full", "delete_full"}
    # what the durable steps' connections ran with, read back from them: safepoint's default
    [cell] = [c for c in results["cells"] if c["system"] == "safepoint"]
    assert cell["results"]["w1"]["durable_ran_with"] == {"journal_mode": "WAL", "synchronous": "NORMAL"}
    [floor] = [c for c in results["cells"] if c["system"] == "floor"]
    assert floor["results"]["w0"]["ran_with"]["wal_full"] == {"journal_mode": "WAL", "synchronous": "FULL"}
    assert "| W1 | steps/s |" in done.stdout
    assert "| target | setting | measured | threshold | met? |" in done.stdout
    named = {t["name"] for t in results["targets"]}
    assert "W5 effects/s of its bound (2 floor commits + 1 raw HTTP call)" in named
    assert "W4 replay, recorded steps per CPU second, over the baseline" in named


# -- the report's logic, on made-up cells -------------------------------------------------------


def _cell(rep: int, setting: str, system: str, results: dict[str, Any], floor: str = "") -> dict[str, Any]:
    backend, mode = setting.split("/")
    cell: dict[str, Any] = {
        "rep": rep,
        "backend": backend,
        "mode": mode,
        "system": system,
        "results": results,
    }
    if floor:
        cell["settings"] = {"floor": floor}
    return cell


def test_an_effects_bound_is_two_floor_commits_and_one_http_call() -> None:
    from bench.targets import effect_bound

    # 1000 commits/s and 500 calls/s: 2 ms + 2 ms per effect
    assert effect_bound(1000, 500) == pytest.approx(250)
    assert effect_bound(None, 500) is None
    assert effect_bound(1000, 0) is None


def test_equal_durability_compares_what_both_connections_read_back() -> None:
    from bench.targets import same_durability

    ours = {"journal_mode": "WAL", "synchronous": "FULL"}
    assert same_durability(ours, {"journal_mode": "wal", "synchronous": "FULL"}) is True
    assert same_durability(ours, {"journal_mode": "WAL", "synchronous": "NORMAL"}) is False
    assert (
        same_durability({"synchronous_commit": "on", "fsync": "on"}, {"synchronous_commit": "off"}) is False
    )
    assert same_durability(ours, {}) is None
    assert same_durability(ours, {"synchronous_commit": "on"}) is None


def test_a_target_is_met_by_its_threshold_in_its_direction() -> None:
    from bench.targets import Target, shown, threshold

    assert Target("t", "s", 25.0, 25, True).met is True
    assert Target("t", "s", 24.9, 25, True).met is False
    assert Target("t", "s", 1.2, 1.1, higher_is_better=False).met is False
    assert Target("t", "s", None, 1.1).met is None
    reported = Target("t", "s", 3.0, None, unit="ms")
    assert reported.met is None
    assert threshold(reported) == "reported"
    assert shown(0.6, "%") == "60%"
    assert shown(27.34, "x") == "27.3x"
    assert threshold(Target("t", "s", 1.0, 1.1, higher_is_better=False)) == "≤ 1.10x"


def test_the_replay_baseline_is_taken_for_as_many_replayed_steps() -> None:
    from bench.targets import replay_baseline

    baseline = {"w4_replay_cpu_steps_per_s": {"commit": "abc", "by_backend": {"sqlite": {"448": 30000.0}}}}
    assert replay_baseline(baseline, "sqlite", 448.0) == 30000.0
    assert replay_baseline(baseline, "sqlite", 192.0) is None
    assert replay_baseline(baseline, "postgres", 448.0) is None
    assert replay_baseline({}, "sqlite", 448.0) is None


def test_the_stored_baseline_covers_both_stores_at_both_sizes() -> None:
    from bench.common import Sizes
    from bench.targets import load_baseline, replay_baseline

    baseline = load_baseline()
    for sizes in (Sizes.full(), Sizes.quick()):
        replayed = sizes.w4_kill_at - sizes.w4_kill_at % PURE_BATCH
        for backend in ("sqlite", "postgres"):
            found = replay_baseline(baseline, backend, replayed)
            assert found is not None
            assert found > 0


def test_the_targets_take_each_ratio_within_a_repetition() -> None:
    from bench.report import Measured
    from bench.targets import targets

    defaults, equal = "sqlite/defaults", "sqlite/equal"
    ran_with = {"journal_mode": "WAL", "synchronous": "FULL"}
    cells = []
    # repetition 0 on a fast hour, 1 on a slow one: each ratio is taken within its repetition
    for rep, speed in ((0, 2.0), (1, 1.0)):
        w7 = {"turns": 200, "cpu": {"overhead_first_ms": 1.0, "overhead_last_ms": 1.0 + rep * 0.5}}
        cells += [
            _cell(rep, defaults, "floor", {"w0": {"wal_normal": 10000 * speed}}),
            _cell(rep, defaults, "dbos", {"w1": {"steps_per_s": 100 * speed}}, floor="delete_full"),
            _cell(
                rep,
                defaults,
                "safepoint",
                {
                    "w1": {"durable_steps_per_s": 2600 * speed},
                    "w4": {"replayed": 448, "replay_cpu_steps_per_s": 70000 + rep * 10000},
                    "w5": {"effects_per_s": 150 * speed, "http_per_s": 500 * speed},
                    "w6": {"anthropic": {"overhead_ms": 1.0 + rep}},
                    "w7": w7,
                },
                floor="wal_normal",
            ),
            _cell(
                rep, equal, "floor", {"w0": {"wal_full": 1000 * speed, "ran_with": {"wal_full": ran_with}}}
            ),
            _cell(
                rep,
                equal,
                "safepoint",
                {"w1": {"durable_steps_per_s": 550 * speed, "durable_ran_with": ran_with}},
                floor="wal_full",
            ),
        ]
    baseline = {"w4_replay_cpu_steps_per_s": {"commit": "abc", "by_backend": {"sqlite": {"448": 35000.0}}}}
    found = {(t.name.split(",")[0].split(" (")[0], t.setting): t for t in targets(Measured(cells), baseline)}
    durable = found["W1 every step durable: safepoint/DBOS steps/s", defaults]
    assert durable.measured == pytest.approx(26)
    assert durable.met is True
    of_floor = found["W1 every step durable: of the commit floor", equal]
    assert of_floor.measured == pytest.approx(0.55)
    assert of_floor.met is False
    assert of_floor.note == "both ran with journal_mode=WAL, synchronous=FULL"
    # the bound: 1 / (2/10000 + 1/500) = 454.5/s at speed 1; 150/454.5 = 33% in either hour
    w5 = found["W5 effects/s of its bound", defaults]
    assert w5.measured == pytest.approx(150 / (1 / (2 / 10000 + 1 / 500)))
    assert w5.met is False
    w4 = found["W4 replay", defaults]
    assert w4.measured == pytest.approx(75000 / 35000)
    assert w4.met is True
    [w6] = [
        t
        for t in targets(Measured(cells), baseline)
        if t.name.endswith("Anthropic Messages") and t.setting == defaults
    ]
    assert w6.measured == pytest.approx(1.5)
    assert w6.met is None  # reported, with no threshold
    w7 = found["W7 200-turn loop", defaults]
    assert w7.measured == pytest.approx(1.25)
    assert w7.met is False
    assert found["W4 replay", equal].measured is None  # no W4 measured there: no figure, no verdict


def test_an_agent_loops_windows_leave_its_first_turn_out() -> None:
    from bench.workloads.models import windows

    assert windows([100.0, 1, 1, 2, 2], 2) == (1, 2)
    assert windows([100.0, 1, 3], 10) == (1, 3)  # the window shrinks to fit half the turns each


def _bench(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench.<module> ARGS`` from the repository, which must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_prune_benchmark_prunes_every_run_it_made_and_measures_the_sizes() -> None:
    done = _bench("prune", "--runs", "30", "--batch", "7", "--backend", "sqlite", "--vacuum")
    figures = json.loads(done.stdout)
    assert (figures["pruned_runs"], figures["batches"], figures["kept"]) == (30, 5, 0)
    assert figures["rows"]["steps"] == 4 * 30
    assert figures["rows"]["operations"] == 30
    assert figures["bytes_before"] >= figures["bytes_after"] > figures["bytes_after_vacuum"] > 0
    assert "sqlite: pruned 30 runs in" in done.stderr


def test_the_replay_benchmark_replays_every_run_and_splits_reading_from_replaying() -> None:
    done = _bench("replay", "--runs", "12", "--reads", "3", "--rounds", "1", "--backend", "sqlite")
    figures = json.loads(done.stdout)
    assert (figures["backend"], figures["runs"], figures["steps_a_run"]) == ("sqlite", 12, 8)
    assert figures["runs_per_s"] > 0
    assert figures["read_ms_a_run"] > 0
    assert figures["replay_ms_a_run"] > 0
    assert 0 < figures["read_share"] < 1
    assert figures["store_calls"]["load_ledger"] == 1
    assert "sqlite: " in done.stderr
    assert "runs/s replayed by check_deploy" in done.stderr


def test_the_replay_benchmarks_ratios_are_postgresql_over_sqlite() -> None:
    from bench.replay import ratios

    sqlite = {"runs_per_s": 800, "ms_a_run": 1.25, "read_ms_a_run": 0.7, "replay_ms_a_run": 0.5}
    postgres = {"runs_per_s": 200, "ms_a_run": 5.0, "read_ms_a_run": 4.2, "replay_ms_a_run": 0.6}
    assert ratios(sqlite, postgres) == {
        "postgres_over_sqlite": {
            "runs_per_s": 0.25,
            "ms_a_run": 4.0,
            "read_ms_a_run": 6.0,
            "replay_ms_a_run": 1.2,
        }
    }
