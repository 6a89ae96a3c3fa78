"""The benchmark harness must not rot: its quickest mode runs here, safepoint alone, on SQLite.

The full benchmark (with DBOS and LangGraph) is `make bench`; it is never part of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from safepoint._engine.core import PURE_BATCH

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
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
        timeout=90,
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
    assert figures["w5"]["effects_per_s"] > 0
    assert figures["w5"]["owner_stats"]["duplicates"] == 0
    assert set(medians["floor"]["w0"]) == {"wal_normal", "wal_full", "delete_full"}
    assert "| W1 | steps/s |" in done.stdout


def test_the_prune_benchmark_prunes_every_run_it_made_and_measures_the_sizes() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.prune",
            "--runs",
            "30",
            "--batch",
            "7",
            "--backend",
            "sqlite",
            "--vacuum",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert (figures["pruned_runs"], figures["batches"], figures["kept"]) == (30, 5, 0)
    assert figures["rows"]["steps"] == 4 * 30
    assert figures["rows"]["operations"] == 30
    assert figures["bytes_before"] >= figures["bytes_after"] > figures["bytes_after_vacuum"] > 0
    assert "sqlite: pruned 30 runs in" in done.stderr
