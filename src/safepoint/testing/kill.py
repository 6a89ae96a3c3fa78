"""The kill test: SIGKILL a real process running a workflow, resume it in a fresh one, and check
the two things that matter — the same result as an uninterrupted run, and the same number of
side effects, as counted by the effect owner itself.

Either assertion alone is not enough: equal results pass while a customer is charged twice;
equal effect counts pass for a run that quietly produced the wrong answer.

    with OwnerService() as owner:
        harness = KillHarness("myapp.flows:checkout", ["order-1"], owner=owner, workdir=tmp)
        report = harness.trial(crash_at="effect.after_dispatching")
        report.check()          # raises AssertionError with the evidence
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .effects import OWNER_URL_ENV
from .owner import OwnerService
from .zygote import PACKAGE_PARENT, ForkedChild, Zygote, shared_zygote


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one child process ended: its exit code and the JSON line it printed, if any."""

    returncode: int
    outcome: dict[str, Any] | None
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def spawn_child(
    workflow: str,
    *,
    store_url: str,
    run_id: str,
    args: Sequence[Any] = (),
    resume: bool = False,
    crash_at: str | None = None,
    crash_mode: str = "kill",
    owner_url: str | None = None,
    pythonpath: Sequence[str] = (),
    lease_ms: int | None = None,
    slice: float | None = None,
    zygote: Zygote | None = None,
) -> subprocess.Popen[str] | ForkedChild:
    """Start (or resume) ``run_id`` in a new Python process and return it, running.

    ``crash_at`` arms a crash point; ``crash_mode`` is ``kill`` (the child SIGKILLs itself
    there), ``stop`` (it freezes with SIGSTOP: a zombie-to-be) or ``raise``. ``slice``: the
    seconds the child's ``start`` / ``resume`` may spend (its outcome is then ``unfinished``
    when the run goes on). ``zygote``: fork the process from one that has imported the heavy
    modules already (``safepoint.testing.zygote``) instead of starting an interpreter.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("SAFEPOINT_CRASH_AT", "SAFEPOINT_CRASH_MODE")}
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, *pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    if crash_at:
        env["SAFEPOINT_CRASH_AT"] = crash_at
        env["SAFEPOINT_CRASH_MODE"] = crash_mode
    if owner_url:
        env[OWNER_URL_ENV] = owner_url
    command = [
        sys.executable,
        "-m",
        "safepoint.testing.child",
        "--store",
        store_url,
        "--workflow",
        workflow,
        "--run-id",
        run_id,
        "--args",
        json.dumps(list(args)),
    ]
    if resume:
        command.append("--resume")
    if lease_ms is not None:
        command += ["--lease-ms", str(lease_ms)]
    if slice is not None:
        command += ["--slice", repr(float(slice))]
    if zygote is not None:
        return zygote.spawn(command[3:], env)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_child(
    workflow: str,
    *,
    store_url: str,
    run_id: str,
    args: Sequence[Any] = (),
    resume: bool = False,
    crash_at: str | None = None,
    kill_after: float | None = None,
    owner_url: str | None = None,
    pythonpath: Sequence[str] = (),
    timeout: float = 60.0,
    slice: float | None = None,
    lease_ms: int | None = None,
    zygote: Zygote | None = None,
) -> ChildOutcome:
    """Start or resume ``run_id`` in a new Python process, wait for it; optionally kill it.

    ``crash_at`` arms a crash point (the child SIGKILLs itself exactly there); ``kill_after``
    sends SIGKILL from here after that many seconds, at whatever the child is doing; ``slice``,
    ``lease_ms`` and ``zygote`` as for ``spawn_child``.
    """
    process = spawn_child(
        workflow,
        store_url=store_url,
        run_id=run_id,
        args=args,
        resume=resume,
        crash_at=crash_at,
        owner_url=owner_url,
        pythonpath=pythonpath,
        slice=slice,
        lease_ms=lease_ms,
        zygote=zygote,
    )
    if kill_after is not None:
        deadline = time.monotonic() + kill_after
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"child did not finish in {timeout}s: {stderr[-2000:]}") from None
    return child_outcome(process.wait(), stdout, stderr)


def child_outcome(returncode: int, stdout: str, stderr: str) -> ChildOutcome:
    """How a child process of ``spawn_child`` ended, from its exit code and what it printed
    (the outcome is the last JSON line of ``stdout``; none if it was killed first)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return ChildOutcome(returncode, json.loads(lines[-1]) if lines else None, stderr)


@dataclass(frozen=True, slots=True)
class KillReport:
    """One trial: how the killed run ended after resuming, beside the uninterrupted reference."""

    crash_at: str | None
    kill_after: float | None
    killed: bool
    resumes: int
    final: dict[str, Any] | None
    applied: int
    duplicates: int
    reference: dict[str, Any]
    reference_applied: int
    stderr: list[str] = field(default_factory=list)

    @property
    def result_equal(self) -> bool:
        return self.final == self.reference

    @property
    def effects_equal(self) -> bool:
        return self.applied == self.reference_applied and self.duplicates == 0

    def check(self) -> None:
        """Raise AssertionError unless both kill-test assertions hold."""
        if self.result_equal and self.effects_equal:
            return
        raise AssertionError(
            f"kill test failed at {self.crash_at or f'{self.kill_after}s'}"
            f" (killed={self.killed}, resumes={self.resumes}):\n"
            f"  result    {self.final}\n  reference {self.reference}\n"
            f"  effects applied {self.applied} (reference {self.reference_applied}),"
            f" duplicates {self.duplicates}\n  stderr: {''.join(self.stderr)[-3000:]}"
        )


class KillHarness:
    """Kill trials of one workflow with fixed arguments against one effect owner."""

    def __init__(
        self,
        workflow: str,
        args: Sequence[Any],
        *,
        owner: OwnerService,
        workdir: Path,
        pythonpath: Sequence[str] = (),
        timeout: float = 60.0,
        store_url: str | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        """``store_url``: one store for every trial (each trial uses its own run ids); by
        default each trial gets a fresh SQLite file in ``workdir``. ``preload``: modules (an
        agent SDK, say) imported once in a zygote (``safepoint.testing.zygote``) that forks the
        reference run's process and each trial's first, and once in another that forks the
        resumes: a run is still carried on by a process that shares nothing with the one that
        was killed, and no child imports the SDK again."""
        self.store_url = store_url
        self.preload = tuple(preload)
        self.workflow = workflow
        self.args = list(args)
        self.owner = owner
        self.workdir = Path(workdir)
        self.pythonpath = list(pythonpath)
        self.timeout = timeout
        self._reference: tuple[dict[str, Any], int] | None = None

    def _child(self, store_url: str, run_id: str, **options: Any) -> ChildOutcome:
        return run_child(
            self.workflow,
            store_url=store_url,
            run_id=run_id,
            args=self.args,
            owner_url=self.owner.url,
            pythonpath=self.pythonpath,
            timeout=self.timeout,
            **options,
        )

    def _zygote(self, role: str = "first") -> Zygote | None:
        return shared_zygote(self.preload, self.pythonpath, role) if self.preload else None

    def _fresh_store(self) -> str:
        if self.store_url is not None:
            return self.store_url
        return f"sqlite:///{self.workdir / f'kill-{uuid.uuid4().hex[:12]}.db'}"

    def reference(self) -> tuple[dict[str, Any], int]:
        """The outcome and effect count of an uninterrupted run (computed once)."""
        if self._reference is None:
            self.owner.client.reset()
            ended = self._child(
                self._fresh_store(), f"reference-{uuid.uuid4().hex[:12]}", zygote=self._zygote()
            )
            if ended.outcome is None:
                raise AssertionError(f"the reference run crashed: {ended.stderr[-3000:]}")
            self._reference = (ended.outcome, int(self.owner.client.stats()["applied"]))
        return self._reference

    def trial(
        self,
        *,
        crash_at: str | None = None,
        kill_after: float | None = None,
        max_resumes: int = 3,
        owner_faults: dict[str, float] | None = None,
    ) -> KillReport:
        """Kill one run (at a crash point or after a delay), resume until it ends, compare.
        ``owner_faults`` are set on the owner for the trial (e.g. ``{"delay": 0.05}``, a slow
        owner that widens the windows a random kill can hit); the reset before it clears them."""
        reference, reference_applied = self.reference()
        self.owner.client.reset()
        if owner_faults:
            self.owner.client.set_faults(**owner_faults)
        store_url, run_id = self._fresh_store(), f"trial-{uuid.uuid4().hex[:12]}"
        first = self._child(
            store_url, run_id, crash_at=crash_at, kill_after=kill_after, zygote=self._zygote()
        )
        stderr = [first.stderr] if first.stderr else []
        final, resumes = first.outcome, 0
        while final is None and resumes < max_resumes:
            resumes += 1
            again = self._child(store_url, run_id, resume=True, zygote=self._zygote("resume"))
            if again.outcome and again.outcome.get("error") == "RunNotFound":
                # Killed before the run row was committed: a supervisor simply starts it
                # again under the same run id (a start never creates a second run).
                again = self._child(store_url, run_id, zygote=self._zygote("resume"))
            final = again.outcome
            if again.stderr:
                stderr.append(again.stderr)
        stats = self.owner.client.stats()
        return KillReport(
            crash_at=crash_at,
            kill_after=kill_after,
            killed=first.killed,
            resumes=resumes,
            final=final,
            applied=int(stats["applied"]),
            duplicates=int(stats["duplicates"]),
            reference=reference,
            reference_applied=reference_applied,
            stderr=stderr,
        )
