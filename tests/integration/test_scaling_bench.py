"""The scaling measurement (``python -m bench.scaling``, docs/scaling.md) must not rot: a small
run on PostgreSQL, with each claim, gives per-step costs that hold for what a step is — a
durable step commits once, a pure one is batched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from postgres_server import SERVER

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("claim", ["default", "per_run"])
def test_the_scaling_measurement_on_postgres_counts_the_database_share_of_each_step(
    pg_url: str, tmp_path: Path, claim: str
) -> None:
    out = tmp_path / "trials.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scaling",
            "--workers",
            "1,2",
            "--runs",
            "4",
            "--steps",
            "20",
            "--repeat",
            "1",
            "--claim",
            claim,
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "BENCH_PG_URL": SERVER},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = json.loads(out.read_text())
    assert {(t["kind"], t["workers"]) for t in trials} == {
        (kind, workers) for kind in ("pure", "durable") for workers in (1, 2)
    }
    for trial in trials:
        assert trial["claim"] == claim
        assert trial["steps_per_s"] > 0
        assert trial["server_cpu_ms_per_step"] >= 0
        if trial["kind"] == "durable":  # one statement and one commit per step, at least
            assert trial["statements_per_step"] >= 1
            assert trial["commits_per_step"] >= 1
        else:  # written 64 to a commit: the run's own statements dominate
            assert trial["statements_per_step"] < 1
