"""Replay recorded runs against the code you have now: before a deploy, in a test, in an eval.

``replay(store, run_id)`` runs the current code of the run's workflow with every step answered
from what the run recorded — no model request, no read, no effect, no transaction, nothing
written anywhere — and says how far it got: to the run's end, to where the run is now, or to
the first step where the code and the record part, with what a real resume would do there::

    report = replay(store, "order-1")
    assert report.ok, report.why

``replay_file("run.json")`` does the same from a run exported with ``safepoint export`` — a
production run turned into a regression test. ``check_deploy(store)`` replays every run the
new code would take over. ``live_from="step-id"`` replays the steps before that step and runs
the rest for real, in a scratch ledger in memory, with effects sent only to ``effects=`` (a
mapping from an effect's name to the stub that stands for its owner): last Tuesday's
conversation, asked again of your new prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._engine.flow import Flow, adrive, drive, require_store
from .._engine.replay import LiveStore, RecordedStore, replay_flow, scratch_run, watch_for
from .._engine.workflow import Workflow, workflow_of
from .._rules.replay import Reached, ReplayReport, Resume
from .._rules.run_file import RecordedRun, recorded_run
from ..errors import UsageError
from ..types import RunStatus

__all__ = [
    "DeployCheck",
    "ReplayReport",
    "check_deploy",
    "recorded",
    "replay",
    "replay_async",
    "replay_file",
    "replay_file_async",
    "replay_recorded",
]

Stub = Callable[..., Any]  # an effect's execute(payload, key) -> receipt, in a live replay

# The runs a deploy takes over: every run a worker may still carry on.
TAKEN_OVER = (
    RunStatus.RUNNING,
    RunStatus.PENDING,
    RunStatus.WAITING,
    RunStatus.STOPPED,
    RunStatus.BLOCKED,
)


def recorded(store: Any, run_id: str) -> RecordedRun:
    """Everything ``store`` holds of one run, as a replay reads it."""
    from .._engine.exported import export_flow

    require_store(store, "testing.recorded")
    return drive(store, export_flow(run_id))


def replay(
    store: Any,
    run_id: str,
    workflow: Workflow | None = None,
    *,
    live_from: str | None = None,
    effects: Mapping[str, Stub] | None = None,
) -> ReplayReport:
    """Replay run ``run_id`` of ``store`` under ``workflow`` (default: the workflow registered
    under the name the run recorded) — see the module docstring."""
    return replay_recorded(
        recorded(store, run_id), workflow, live_from=live_from, effects=effects, source=store
    )


async def replay_async(
    store: Any,
    run_id: str,
    workflow: Workflow | None = None,
    *,
    live_from: str | None = None,
    effects: Mapping[str, Stub] | None = None,
) -> ReplayReport:
    """``replay`` from async code: an async test, or a store opened with ``open_async_store``.
    The replay runs in a thread of its own (its async workflow in a loop of its own there);
    the reads it makes of the store — the run, and any other run of its family a resume would
    read — are carried out on this loop."""
    from .._engine.exported import export_flow

    require_store(store, "testing.replay_async")
    run = await adrive(store, export_flow(run_id))
    source = _OnLoop(store, asyncio.get_running_loop())
    return await asyncio.to_thread(
        replay_recorded, run, workflow, live_from=live_from, effects=effects, source=source
    )


async def replay_file_async(
    path: str | Path,
    workflow: Workflow | None = None,
    *,
    live_from: str | None = None,
    effects: Mapping[str, Stub] | None = None,
) -> ReplayReport:
    """``replay_file`` from async code."""
    return await asyncio.to_thread(replay_file, path, workflow, live_from=live_from, effects=effects)


class _OnLoop:
    """A store's operations called from a replay's thread, each carried out on the loop the
    store belongs to (an async store's connections serve that loop only), the thread waiting."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._store, self._loop = store, loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            async def on_loop() -> Any:
                done = method(*args, **kwargs)
                return await done if inspect.isawaitable(done) else done

            return asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result()

        return call


def replay_file(
    path: str | Path,
    workflow: Workflow | None = None,
    *,
    live_from: str | None = None,
    effects: Mapping[str, Stub] | None = None,
) -> ReplayReport:
    """Replay the run a file written by ``safepoint export`` holds."""
    try:
        document = json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the run file {str(path)!r}: {exc}") from exc
    return replay_recorded(recorded_run(document), workflow, live_from=live_from, effects=effects)


def replay_recorded(
    run: RecordedRun,
    workflow: Workflow | None = None,
    *,
    live_from: str | None = None,
    effects: Mapping[str, Stub] | None = None,
    source: Any = None,
) -> ReplayReport:
    """Replay a recorded run (``recorded``, or ``recorded_run`` of a file's document);
    ``source``: the store it was read from, whose other runs a replay may read (a fork's
    source, an earlier run of its chain), as a resume would."""
    wf = workflow if workflow is not None else workflow_of(run.run)
    if not isinstance(wf, Workflow):
        raise UsageError(f"workflow= takes a function decorated with @safepoint.workflow, not {wf!r}")
    if live_from is None:
        if effects is not None:
            raise UsageError("effects= stands for owners in a live replay: give live_from= too")
        watch = watch_for(wf, run)
        store = RecordedStore(run, watch, source)
        return _carried_out(wf, store, replay_flow(store, wf, run, watch))
    return _live(run, wf, live_from, effects or {})


def _live(run: RecordedRun, wf: Workflow, live_from: str, effects: Mapping[str, Stub]) -> ReplayReport:
    from ..storage.sqlite import SqliteStore

    scratch = SqliteStore(":memory:")
    refused: list[UsageError] = []
    try:
        watch = watch_for(wf, run, live_from)
        watch.stubs = frozenset(effects)
        store = LiveStore(scratch, run.payloads)
        claim = drive(scratch, scratch_run(wf, run, live_from))
        flow = replay_flow(store, wf, run, watch, claim=claim, owners=_stubs(effects, refused))
        done = _carried_out(wf, store, flow)
    finally:
        scratch.close()
    if watch.refused is not None or refused:
        # Raised inside the dispatch (or caught by agent code), the refusal would read as an
        # owner call that failed, or not at all: the replay's caller is told what is missing.
        raise watch.refused or refused[0]
    return done


def _stubs(
    effects: Mapping[str, Stub], refused: list[UsageError]
) -> Callable[[Any, str], Callable[..., Any]]:
    """The owner calls of a live replay: each effect's stub (the watch refuses an effect without
    one before anything is sent), and for a stub without the reconcile or verify a dispatch
    asks for, a refusal — kept in ``refused`` and raised by the replay, since raised inside the
    dispatch it would read as an owner call that failed."""

    def owner_call(effect: Any, what: str) -> Callable[..., Any]:
        stub = effects[effect.name]  # the watch refused an effect without one before it was sent
        found: Callable[..., Any] | None = stub if what == "execute" else getattr(stub, what, None)
        if found is not None:  # execute / reconcile / verify
            return found
        refusal = UsageError(f"the stub for effect {effect.name!r} has no {what}: give it one")
        refused.append(refusal)
        raise refusal

    return owner_call


def _carried_out(wf: Workflow, store: Any, flow: Flow[ReplayReport]) -> ReplayReport:
    if not wf.is_async:
        return drive(store, flow)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrive(store, flow))
    flow.close()
    raise UsageError(
        "an async workflow is replayed from inside a running event loop: await replay_async(…)"
        " (or replay_file_async) there, or call replay from sync code"
    )


@dataclass(frozen=True)
class DeployCheck:
    """What a deploy of this code does to the runs it takes over."""

    reports: list[ReplayReport] = field(default_factory=list)
    unreplayable: dict[str, str] = field(default_factory=dict)  # run id -> why it could not be replayed

    def count(self, resume: Resume) -> int:
        return sum(1 for report in self.reports if report.resume is resume)

    @property
    def ok(self) -> bool:
        """This code fits every run (``ReplayReport.fits``: no divergence, nothing changed that
        would block or re-plan it), and every one was replayed. A run blocked or stopped for
        its own reasons is reported as it stands and does not fail the check."""
        return not self.unreplayable and all(r.fits for r in self.reports)

    def summary(self) -> str:
        parts = [f"{len(self.reports) + len(self.unreplayable)} runs"]
        parts += [f"{self.count(resume)} {resume.value}" for resume in Resume if self.count(resume)]
        diverged = sum(1 for r in self.reports if r.reached is Reached.DIVERGED)
        if diverged:
            parts.append(f"{diverged} diverged")
        if self.unreplayable:
            parts.append(f"{len(self.unreplayable)} not replayable")
        return ", ".join(parts)


def check_deploy(
    store: Any,
    *,
    statuses: Iterable[RunStatus] = TAKEN_OVER,
    workflows: Iterable[str] | None = None,
    limit: int = 10_000,
) -> DeployCheck:
    """Replay every run of ``store`` in ``statuses`` (the runs a deploy takes over) under the
    workflows this process registered, and say what resuming each would do."""
    from ..errors import SafepointError

    wanted = set(workflows) if workflows is not None else None
    check = DeployCheck()
    for status in statuses:
        for run in store.list_runs(status, limit):
            if not hasattr(run, "workflow") or (wanted is not None and run.workflow not in wanted):
                continue
            try:
                check.reports.append(replay(store, run.run_id))
            except SafepointError as exc:
                check.unreplayable[run.run_id] = exc.message
    return check
