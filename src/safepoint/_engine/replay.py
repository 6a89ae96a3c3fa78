"""Replay a recorded run against this code: the workflow function runs as on a resume, every
step answered from the record, and nothing new is carried out — no model request, no read, no
effect, no transaction, no write.

It is the engine of a resume with a watch installed on its core (``RunCore.replaying``): each
step the record answers is counted off in its lane (``_rules.replay.Order``); where the record
answers another question, the watch records the divergence and what a resume would do about
it, instead of blocking or re-planning; where the code asks for something new, the replay has
reached the run's frontier — unless recorded steps remain, and then the code added a step. The
store it talks to is the record itself (``RecordedStore``): the few reads a replay makes, and
nothing else — a write reaching it would be one the watch did not stop, and stops the replay.

Pure steps are the exception: computing one is no I/O, so at the frontier it is computed as a
resume would.

A *live* replay (``live_from``, for evals) replays the steps recorded before the cut and runs
the rest for real, against a scratch ledger in memory (``LiveStore``), with every effect sent
to the caller's stubs (``RunCore.owners``) and nothing to the effects' real owners.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .._rules.compat import changes
from .._rules.replay import (
    Divergence,
    Reached,
    ReplayReport,
    Resume,
    on_resume,
    other_ending,
    recorded_asked,
)
from .._rules.run_file import RecordedRun
from ..errors import (
    ArtifactMissing,
    Cancelled,
    ContinueAsNew,
    RunWaiting,
    UsageError,
)
from ..storage.base import Store
from ..types import (
    Claim,
    Compatibility,
    EffectState,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepRecord,
)
from . import host
from .core import RunCore
from .current import running
from .flow import Call, Flow, io
from .lifecycle import new_run
from .ownership import worker_id
from .replaying import Replaying, ReplayStop
from .run import AsyncRun, Run
from .workflow import Workflow

_SETTLED = (EffectState.ACCEPTED, EffectState.REJECTED)


# What a replay from a store may read of other runs there (a fork's source, an earlier run of
# the chain): their records answer some of this run's steps, as they do on a resume.
_OTHER_RUNS = frozenset({"get_run", "find_run", "load_ledger", "chain_operation", "family_operation"})


class RecordedStore:
    """The store a replay's engine talks to: the recorded run, read-only, and (replaying from
    a store) the reads of other runs a resume makes. A request it does not answer stops the
    replay there (``Replaying.unanswerable``)."""

    def __init__(self, recorded: RecordedRun, watch: Replaying, source: Any = None) -> None:
        self._recorded = recorded
        self._watch = watch
        self._source = source
        self.url = "replay:"
        watch.family_readable = source is not None

    def now(self) -> int:
        """The run's own clock: when it was last written (a replay answers as it was then)."""
        return self._recorded.run.updated_at

    def get_artifact(self, digest: str) -> bytes:
        found = self._recorded.payloads.get(digest)
        if found is None:
            if self._source is not None:
                return bytes(self._source.get_artifact(digest))
            raise ArtifactMissing(digest)
        return found

    def approvals(self, run_id: str) -> list[Any]:
        return list(self._recorded.approvals)

    def events(self, run_id: str) -> list[Any]:
        return list(self._recorded.events)

    def messages(self, run_id: str) -> list[Any]:
        return list(self._recorded.messages)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _OTHER_RUNS and self._source is not None:
            read = getattr(self._source, name)

            def from_the_family(*args: Any, **kwargs: Any) -> Any:
                found = read(*args, **kwargs)
                if found is not None:  # another run answered: the family as it stands now
                    self._watch.family_read = True
                return found

            return from_the_family

        def unanswered(*args: Any, **kwargs: Any) -> Any:
            raise self._watch.unanswerable(name)

        return unanswered


class LiveStore:
    """A live replay's store: a scratch ledger (in memory) holding the run from the cut on,
    with the payloads of the operations recorded before it."""

    def __init__(self, scratch: Any, payloads: Mapping[str, bytes]) -> None:
        self._scratch = scratch
        self._payloads = payloads

    def get_artifact(self, digest: str) -> bytes:
        found = self._payloads.get(digest)
        return found if found is not None else self._scratch.get_artifact(digest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scratch, name)


def watch_for(wf: Workflow, recorded: RecordedRun, live_from: str | None = None) -> Replaying:
    """The watch a replay of ``recorded`` under ``wf`` installs (a live one: up to the cut)."""
    steps, operations = dict(recorded.steps), dict(recorded.operations)
    if live_from is not None:
        steps, operations = before_cut(recorded, live_from)
    replans = wf.compatibility is Compatibility.REPLAN
    return Replaying(steps, operations, replans=replans, live_from=live_from)


def replay_flow(
    store: Any,
    wf: Workflow,
    recorded: RecordedRun,
    watch: Replaying,
    *,
    claim: Claim | None = None,
    owners: Callable[[Any, str], Callable[..., Any]] | None = None,
) -> Flow[ReplayReport]:
    """Run ``wf``'s code against ``recorded`` under ``watch`` (see the module docstring) and
    report how it went. A live replay's ``claim`` of its scratch run, and its ``owners``."""
    run = recorded.run
    if claim is None:
        claim = Claim(run.run_id, run.owner or "replay", run.fence, run.state_revision, 0, 0)
    as_claimed = replace(run, status=RunStatus.RUNNING, fence=claim.fence)
    core = RunCore(
        store,
        claim,
        as_claimed,
        dict(watch.recorded),
        dict(watch.operations),
        is_async=wf.is_async,
        replans=watch.replans,
        attempts=dict(recorded.attempts),
        default_retry=run.step_attempts if run.step_attempts is not None else wf.step_attempts,
    )
    core.owners = owners
    core.replaying = watch
    handle = AsyncRun(core) if wf.is_async else Run(core)
    args, kwargs = run.inputs["args"], run.inputs["kwargs"]
    ended: tuple[str, Any]
    try:
        with running(handle):
            result = yield Call(wf.fn, (handle, *args), kwargs)
        if watch.live:
            yield from core.flush()
    except ReplayStop:
        ended = ("stopped", None)
    except ContinueAsNew as signal:
        ended = ("continued", signal.inputs)
    except (Cancelled, RunWaiting):  # asked to stop; a live replay waits for what never came
        ended = ("stopped", None)
    except UsageError as exc:
        if watch.refused is not None:
            raise  # the live replay met an effect it has no stub for
        ended = ("raised", exc)  # the workflow's own misuse: how a resume would end the run
    except (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError):
        raise  # the process (or the task) is stopping, not the run
    except BaseException as exc:  # the workflow raised: compared with how the run ended
        ended = ("raised", exc)
    else:
        ended = ("returned", result)
    finally:
        core.close()
    live: tuple[StepRecord, ...] = ()
    if watch.live:
        ledger = yield from io(Store.load_ledger, run.run_id)
        live = tuple(sorted(ledger.steps.values(), key=lambda s: s.seq))
    return report(wf, recorded, watch, ended, live)


def before_cut(
    recorded: RecordedRun, live_from: str
) -> tuple[dict[str, StepRecord], dict[str, OperationRecord]]:
    """The steps a live replay answers from the record (those recorded before ``live_from``)
    and their operations; ``UsageError`` if the cut is not a recorded step, or if an operation
    before it is still open (its outcome unknown: the run must be settled, or cut earlier)."""
    cut = recorded.steps.get(live_from)
    if cut is None:
        known = ", ".join(sorted(recorded.steps, key=lambda s: recorded.steps[s].seq)[:20])
        raise UsageError(
            f"live_from={live_from!r} is not a step run {recorded.run.run_id!r} recorded; its steps: {known}"
        )
    steps = {sid: step for sid, step in recorded.steps.items() if step.seq < cut.seq}
    named = {step.operation_id for step in steps.values() if step.operation_id}
    operations = {op_id: op for op_id, op in recorded.operations.items() if op_id in named}
    for op in operations.values():
        if op.state not in _SETTLED:
            raise UsageError(
                f"operation {op.operation_id!r} (step {op.step_id!r}) is {op.state.value} before"
                f" the cut at {live_from!r}: its outcome is not known, so nothing after it can"
                " go live — cut at an earlier step, or settle the run first"
            )
    return steps, operations


def scratch_run(wf: Workflow, recorded: RecordedRun, live_from: str) -> Flow[Claim]:
    """A live replay's run in its scratch ledger: the recorded run's id, inputs and limits,
    claimed by this process."""
    run = recorded.run
    made = new_run(wf, tuple(run.inputs["args"]), dict(run.inputs["kwargs"]), run.run_id, worker_id(), 60_000)
    # Budgets are the run's, counted from nothing; its deadline (an instant, long passed for
    # last week's run) is not: a live replay is a new attempt at the run's rest.
    made = replace(
        made,
        deadline_at=None,
        deadline_ms=None,
        token_budget=run.token_budget,
        cost_budget=run.cost_budget,
        model_call_budget=run.model_call_budget,
    )
    _, claim = yield from io(Store.create_run, made)
    assert claim is not None  # a ledger of its own: the run is new there
    # The messages the run received after the cut (and any still queued) are sent again, in
    # their order: the conversation goes on as it went, whatever the new code asks.
    answered = {step.step_id for step in recorded.steps.values() if step.seq < cut_seq(recorded, live_from)}
    for message in sorted(recorded.messages, key=lambda m: m.seq):
        if message.taken_by is not None and message.taken_by in answered:
            continue
        if message.for_wait is not None:
            yield from io(Store.answer_wait, run.run_id, message.for_wait, message.name, message.payload)
        else:
            yield from io(Store.send_message, run.run_id, message.name, message.payload)
    return claim


def cut_seq(recorded: RecordedRun, live_from: str) -> int:
    cut = recorded.steps.get(live_from)
    return cut.seq if cut is not None else 0


def report(
    wf: Workflow,
    recorded: RecordedRun,
    watch: Replaying,
    ended: tuple[str, Any],
    live: tuple[StepRecord, ...] = (),
) -> ReplayReport:
    """How the replay went, judged against how the run ended as recorded."""
    run = recorded.run
    found = changes(
        run.workflow_version,
        run.workflow_manifest,
        run.workflow_fingerprint,
        wf.version,
        wf.manifest,
        wf.fingerprint,
    )
    how, value = ended
    divergence = watch.divergence
    reached = Reached.NOW
    result: Any = None
    error: dict[str, Any] | None = None
    if how == "returned":
        result, reached = value, Reached.END
    elif how == "raised":
        error, reached = {"type": type(value).__name__, "message": str(value)}, Reached.END
    elif how == "continued":
        result, reached = value, Reached.END
    if divergence is None and not watch.live:
        divergence = _judged(run, watch, how, value, error)
    if divergence is not None:
        reached = Reached.DIVERGED
    resume, why = on_resume(found, watch.replans, divergence)
    if divergence is None and not found:
        resume, why = _as_it_stands(run, watch, resume, why)
    if divergence is None and how in ("raised",) and run.status is not RunStatus.FAILED:
        resume, why = Resume.FAIL, f"the workflow raises {error}"
    return ReplayReport(
        run_id=run.run_id,
        recorded_as=f"{run.workflow}@{run.workflow_version}",
        replayed_as=f"{wf.name}@{wf.version}",
        status=run.status.value,
        reached=reached,
        replayed=watch.answered_count,
        recorded=len(watch.recorded),
        resume=resume,
        why=why,
        changes=tuple(found),
        divergence=divergence,
        next=watch.next if reached is Reached.NOW else None,
        result=result,
        error=error,
        live=live,
        family_read=watch.family_read,
    )


def _as_it_stands(run: RunRecord, watch: Replaying, resume: Resume, why: str) -> tuple[Resume, str]:
    """What a resume does to a run this code fits, for the run's own reasons: a block it would
    record on the way, the block the run stands in (a person resolves it first), the limit it
    stopped at (raised, the run carries on)."""
    if watch.blocked is not None:
        return Resume.BLOCK, f"{watch.blocked[0]}: {watch.blocked[1]}"
    if run.status is RunStatus.BLOCKED:
        phase = (run.recovery_record or {}).get("phase", "blocked")
        return Resume.BLOCK, f"the run is blocked ({phase}): a person resolves it first ({why})"
    if run.status is RunStatus.STOPPED:
        return Resume.STOP, f"the run is stopped at a limit: raise it to carry on ({why})"
    if run.status.terminal:
        return resume, why
    if run.deadline_at is not None and host.current.wall_now().timestamp() * 1000 >= run.deadline_at:
        return Resume.STOP, f"its deadline passed: a resume stops it there ({why})"
    if run.resume_budget is not None and run.resume_count >= run.resume_budget:
        return Resume.STOP, f"its resume budget ({run.resume_budget}) is spent: a resume stops it ({why})"
    return resume, why


def _judged(
    run: RunRecord, watch: Replaying, how: str, value: Any, error: dict[str, Any] | None
) -> Divergence | None:
    """Where a replay that met no divergence on the way ended, against how the run ended."""
    if watch.blocked is not None:
        return None  # where the run stands, not where the code parts: the report says the block
    left = watch.order.left()
    if left:
        first = recorded_asked(watch.recorded[left[0]], watch.operations)
        return Divergence(
            "unasked",
            first.step_id,
            f"the code never asks for {first.described()}"
            + (f" and {len(left) - 1} more recorded step(s)" if len(left) > 1 else "")
            + ", which the run recorded: a step was left out (a resume carries on without it)",
            Resume.CARRY_ON,
            recorded=first,
        )
    differs = other_ending(run.status, run.result, run.error, how, value, error)
    if differs is None:
        return None
    reason, resume = differs
    return Divergence("outcome", None, reason, resume)
