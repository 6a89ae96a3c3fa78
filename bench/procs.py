"""Child processes of the benchmark: W3's workers, W4's victim and its recovery.

A child is ``python -m bench.workloads.<system> <role> <json>``. It prints ``ready`` once it can
work (workers) and its result as one JSON line last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def spawn(
    system: str, role: str, args: dict[str, Any], *, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", f"bench.workloads.{system}", role, json.dumps(args)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_ready(process: subprocess.Popen[str], timeout: float = 60.0) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.strip() == "ready":
            return
        if not line and process.poll() is not None:
            raise RuntimeError(f"child exited before it was ready: {stderr_of(process)}")
    raise RuntimeError("child not ready in time")


def finish(process: subprocess.Popen[str], timeout: float = 300.0) -> dict[str, Any]:
    """Wait for a child and return the JSON it printed last."""
    out, err = process.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({process.returncode}): {err.strip()[-2000:]}")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def stop(processes: list[subprocess.Popen[str]], timeout: float = 30.0) -> None:
    """SIGTERM each child, then reap it (SIGKILL past the timeout)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def stderr_of(process: subprocess.Popen[str]) -> str:
    if process.stderr is None:
        return ""
    try:
        return process.stderr.read()[-2000:]
    except ValueError:
        return ""


def emit(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)
