"""A run's family while the run executes (``_rules.family`` says what a family is): what the
run's fork was told to send again, and by whom (``resends``), and a transaction step another run
of the family committed, taken as this run's (``held_transaction``)."""

from __future__ import annotations

from typing import Any, NoReturn, Protocol, TypeVar

from .._rules.fork import resent_by
from .._rules.records import revised
from .._rules.transactions import is_uncertain
from ..errors import ClaimedInFamily, RunBlocked, RunNotFound, SentBySource
from ..storage.base import Store
from ..types import Claim, RunRecord, StepRecord, StepStatus
from .flow import Flow, io

R = TypeVar("R")


class _Core(Protocol):
    """What these flows need of the run core (``RunCore``)."""

    claim: Claim
    run: RunRecord
    steps: dict[str, StepRecord]
    resent: dict[str, str] | None

    def write(self, request: Flow[R]) -> Flow[R]: ...

    def append_new(self, request: Flow[R], sid: str) -> Flow[R]: ...

    def block(self, error: RunBlocked, *, phase: str, step_id: str | None = None) -> Flow[NoReturn]: ...


def resends(core: _Core) -> Flow[dict[str, str]]:
    """The operations (and transaction steps) a person named in ``resend`` when this run — or
    the first run of its chain, or a run it was forked from — was forked, and which fork sends
    each again (``_rules.fork.resent_by``). Read once per run."""
    if core.resent is None:
        fork = core.run
        if fork.parent_run_id is not None and fork.chain_id is not None:
            fork = yield from io(Store.get_run, fork.chain_id)
        core.resent = resent_by(fork)
    return core.resent


def held_transaction(core: _Core, base: StepRecord, held: ClaimedInFamily) -> Flow[Any]:
    """The store refused a transaction step another run of the family holds (``held``): that
    run committed it — its value is this step's, recorded as this run's and never run again —
    or may have (the run blocks until a person resolves it there)."""
    sid, holder = base.step_id, held.holder_run_id
    try:
        found = (yield from io(Store.load_ledger, holder)).steps.get(held.holder_operation_id)
    except RunNotFound:  # pruned: the family keeps its claim, not the run's record of it
        found = None
    if found is None or found.status is not StepStatus.COMPLETED:
        why = (
            f"run {holder!r} of its family may have committed it — resolve it there"
            f" (`safepoint resolve {holder}`), then resume this run"
            if found is not None and is_uncertain(found)
            else f"run {holder!r} of its family committed it, and its record of it is no longer there"
        )
        yield from core.block(SentBySource(core.run.run_id, sid, sid, holder, why), phase="forked_effect")
    assert found is not None
    step = revised(base, result=found.result)
    yield from core.append_new(core.write(io(Store.record_step, core.claim, step)), sid)
    core.steps[sid] = step
    return step.result
