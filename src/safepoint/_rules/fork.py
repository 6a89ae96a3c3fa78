"""Forks: a new run that starts with a copy of another run's ledger up to a step, and carries
on from there — the decisions both stores and the engine share.

``safepoint.fork(store, run_id, from_step=…)`` makes a pending run of the same workflow and
inputs whose ledger holds copies of the source's steps recorded before ``from_step`` (by seq),
with the operations of the copied effect steps as they are (settled: accepted or rejected).
Its workflow replays that prefix and executes the rest — ``from_step`` and everything after
it — again. Storage stays linear: the copy is a prefix, nothing else.

Effects in that tail keep the ledger safe across the fork: a fork and its source are one
family, which sends an operation once (``_rules.family``). When the fork's effect step asks for
an operation the family already sent with the same payload, the fork takes that outcome (as a
continue-as-new successor takes one its chain settled), found by the family's claim on it
(``Store.family_operation``); with another payload, or an outcome not settled there, the fork
blocks (``SentBySource``) — unless the operator named the operation in ``resend``: then it is
the fork's own operation, under the fork's own key. Keys are minted from the
ledger's id, the run (or chain) that names the operation and the operation id; a fork is its
own chain, named by its own run id, and run ids are unique in a ledger, so no key of a fork can
be a key of its source at the owner.

Everything here is I/O-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..errors import ForkRefused
from ..types import EffectState, OperationRecord, RunRecord, RunStatus
from .ids import MAX_ID_LENGTH
from .kinds import MODEL_CALLS, WITH_OPERATION
from .moments import when

_SETTLED = frozenset({EffectState.ACCEPTED, EffectState.REJECTED})
_MAY_HAVE_HAPPENED = frozenset({EffectState.DISPATCHING, EffectState.UNKNOWN, EffectState.APPLIED})
_LISTED = 10  # steps named at each end of a long list of what a fork can start from


@dataclass(frozen=True, slots=True)
class SourceStep:
    """What a fork needs of one recorded step of its source: where it stands, what it spent."""

    step_id: str
    seq: int
    kind: str
    operation_id: str | None
    tokens: int | None
    cost: float | None
    recorded_at: int


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What a fork copies: the steps with a seq below ``from_seq`` (``steps`` of them), the
    operations of the copied effect steps, and what the copied steps spent."""

    from_seq: int
    steps: int
    operations: frozenset[str]
    tokens: int
    cost: float
    model_calls: int


def refuse_live(source: RunRecord, now: int) -> None:
    """A run a live worker is carrying on cannot be forked: its ledger moves while it would be
    copied. Any other run can — pending, waiting, blocked, stopped, or ended."""
    lease = source.lease_expires_at
    if source.status is RunStatus.RUNNING and source.owner is not None and lease is not None and lease > now:
        raise ForkRefused(
            source.run_id,
            f"it is running, held by worker {source.owner!r} until {when(lease, now)}: fork it once"
            " its worker has let it go (it ends, waits, blocks or stops, or its lease runs out)"
            " — or cancel it first",
        )


def plan_fork(
    source: RunRecord, steps: Sequence[SourceStep], operations: Iterable[OperationRecord], from_step: str
) -> ForkPlan:
    """What a fork of ``source`` from ``from_step`` copies, or ``ForkRefused``: ``from_step``
    must be a step the source recorded (the refusal lists them), and the copied prefix must hold
    no operation left unsettled — neither one of a copied step, nor one that may have happened
    (dispatching, unknown, applied) and was prepared before ``from_step`` was recorded: the fork
    would never ask its owner about it."""
    by_id = {step.step_id: step for step in steps}
    start = by_id.get(from_step)
    if start is None:
        ordered = [step.step_id for step in sorted(steps, key=lambda s: s.seq)]
        raise ForkRefused(
            source.run_id,
            f"it recorded no step {from_step!r}; a fork starts from a step the run recorded"
            f" ({_listing(ordered)})",
            choices=tuple(ordered),
        )
    copied = [step for step in steps if step.seq < start.seq]
    copied_ops = frozenset(
        step.operation_id for step in copied if step.kind in WITH_OPERATION and step.operation_id
    )
    ops = {op.operation_id: op for op in operations}
    for op_id in sorted(copied_ops):
        # (An effect step with no operation of its own took its outcome from a run this one
        # was forked from: its receipt is copied with it.)
        op = ops.get(op_id)
        if op is not None and op.state not in _SETTLED:
            raise ForkRefused(
                source.run_id,
                f"operation {op_id!r}, of a step before {from_step!r}, is {op.state.value}, not"
                " settled: settle it in that run first (`safepoint record RUN`), or fork from"
                " its step",
                operation_id=op_id,
            )
    for op in sorted(ops.values(), key=lambda o: (o.prepared_at, o.operation_id)):
        if (
            op.state in _MAY_HAVE_HAPPENED
            and op.operation_id not in copied_ops
            and op.prepared_at < start.recorded_at
        ):
            raise ForkRefused(
                source.run_id,
                f"operation {op.operation_id!r} (step {op.step_id!r}, effect {op.effect!r}) was"
                f" prepared before step {from_step!r} and is {op.state.value}: it may have"
                " happened, and a fork from here would never settle it — resolve it in that run"
                " first (`safepoint record RUN`), then fork; or fork from an earlier step",
                operation_id=op.operation_id,
            )
    return ForkPlan(
        from_seq=start.seq,
        steps=len(copied),
        operations=copied_ops,
        tokens=sum(step.tokens or 0 for step in copied),
        cost=float(sum(step.cost or 0.0 for step in copied)),
        model_calls=sum(1 for step in copied if step.kind in MODEL_CALLS),
    )


def check_resend(
    source: RunRecord,
    resend: Sequence[str],
    plan: ForkPlan,
    held: Mapping[str, bool],
    tail: Iterable[str],
) -> tuple[str, ...]:
    """The operations named in ``resend``, each once, or ``ForkRefused``: each must be one the
    source (or a run it was forked from) holds — ``held`` says, by name — and not one of the
    copied prefix, which the fork replays as the source settled it. ``tail``: the source's
    operations a fork from here may ask for again (listed in the refusal)."""
    for name in resend:
        if name in plan.operations:
            raise ForkRefused(
                source.run_id,
                f"resend names operation {name!r}, which is in the copied prefix: the fork"
                " replays it as the run settled it — fork from its step (or an earlier one)"
                " to send it again",
                operation_id=name,
            )
        if not held.get(name):
            choices = tuple(sorted(set(tail) - plan.operations))
            listed = ", ".join(repr(c) for c in choices) if choices else "none"
            raise ForkRefused(
                source.run_id,
                f"resend names {name!r}, which is no operation of this run nor of a run it was"
                f" forked from: resend names operations the fork's tail asks for again"
                f" (this run's: {listed})",
                choices=choices,
                operation_id=name,
            )
    return tuple(dict.fromkeys(resend))


def forked_from(
    source_run_id: str, from_step: str, resend: Sequence[str], fork_run_id: str, inherited: Mapping[str, str]
) -> dict[str, Any]:
    """A fork's ``forked_from``, as recorded with it: the run and step it was forked from, the
    operations it sends under its own key although that run sent them (when any), and which
    run of its ancestry sent each such operation again (``resent_by``: what the source's chain
    inherited, ``inherited``, and this fork's own) — a fork of a fork that sent one again takes
    that run's outcome, not the first."""
    recorded: dict[str, Any] = {"run_id": source_run_id, "step_id": from_step}
    if resend:
        recorded["resend"] = list(resend)
    resent = {**inherited, **{name: fork_run_id for name in resend}}
    if resent:
        recorded["resent_by"] = dict(sorted(resent.items()))
    return recorded


def resend_of(run: RunRecord) -> frozenset[str]:
    """The operations ``run`` (a fork) was told to send under its own key."""
    named = (run.forked_from or {}).get("resend") or []
    return frozenset(str(name) for name in named) if isinstance(named, list) else frozenset()


def resent_by(run: RunRecord) -> dict[str, str]:
    """Which run of ``run``'s ancestry (``run`` being a fork, or the first run of a chain) sent
    each operation again that a person named in ``resend``: that run's claim is the one to
    take or adopt. (A fork recorded before ``resent_by`` was: its own ``resend``.)"""
    recorded = (run.forked_from or {}).get("resent_by")
    if isinstance(recorded, dict):
        return {str(name): str(by) for name, by in recorded.items()}
    return {name: run.run_id for name in resend_of(run)}


def fork_detail(
    source_run_id: str,
    from_step: str,
    plan: ForkPlan,
    resend: Sequence[str],
    *,
    by: str,
    reason: str | None,
    workflow_version: str,
    current_code: bool,
) -> dict[str, Any]:
    """The ``run.forked`` event of a new fork: where from, who and why, what it copied, and
    the code it is recorded under."""
    return {
        "from": {"run_id": source_run_id, "step_id": from_step},
        "by": by,
        "reason": reason,
        "steps_copied": plan.steps,
        "operations_copied": sorted(plan.operations),
        "resend": list(resend),
        "workflow_version": workflow_version,
        "current_code": current_code,
    }


def fork_made_detail(fork_run_id: str, from_step: str, *, by: str, reason: str | None) -> dict[str, Any]:
    """The ``run.fork_made`` event of the source: which fork, from which step, who and why."""
    return {"fork": fork_run_id, "step_id": from_step, "by": by, "reason": reason}


class Forked(StrEnum):
    """What a fork's effect step does with an operation id not in its own ledger, given what
    its ancestry holds under that id (``forked_effect``)."""

    SEND = "send"  # the fork's own operation, under its own key
    ADOPT = "adopt"  # accepted there with this very payload: that receipt stands for the fork
    REJECTED = "rejected"  # rejected there with this very payload: that rejection stands
    OTHER_EFFECT = "other_effect"  # another effect under that id: the code path changed
    OTHER_PAYLOAD = "other_payload"  # sent there with another payload
    UNSETTLED = "unsettled"  # there, it may have happened and is not settled


def forked_effect(found: OperationRecord | None, *, effect: str, payload_ref: str) -> Forked:
    """The decision for an effect step asking for an operation its own ledger lacks: ``found``
    is the operation as another run of its family holds it (``Store.family_operation``; one
    named in ``resend`` has a family key of its own, and none there).

    Nothing there, or only prepared (never sent): sent, as this run's own. Otherwise never sent
    again: an accepted or rejected outcome of the same effect with the same payload is this
    run's; anything else blocks it."""
    if found is None or found.state is EffectState.PREPARED:
        return Forked.SEND
    if found.effect != effect:
        return Forked.OTHER_EFFECT
    if found.state in _MAY_HAVE_HAPPENED:
        return Forked.UNSETTLED
    if found.payload_ref != payload_ref:
        return Forked.OTHER_PAYLOAD
    return Forked.ADOPT if found.state is EffectState.ACCEPTED else Forked.REJECTED


def _listing(step_ids: Sequence[str]) -> str:
    """The steps a fork can start from, as a sentence: all of them, or both ends of a long run."""
    if not step_ids:
        return "it recorded none yet"
    shown = [repr(s) for s in step_ids]
    if len(shown) > 2 * _LISTED:
        hidden = len(shown) - 2 * _LISTED
        shown = [*shown[:_LISTED], f"… {hidden} more …", *shown[-_LISTED:]]
    return f"it recorded {len(step_ids)}: " + ", ".join(shown)


def fork_run_id(source_run_id: str, token: str) -> str:
    """The id minted for a fork that was given none: its source's id and ``token`` (a random
    hex string), ``case-8472-fork-3f2a1b9c`` — or ``fork-<token>`` when that would be too long
    for an id."""
    minted = f"{source_run_id}-fork-{token}"
    return minted if len(minted) <= MAX_ID_LENGTH else f"fork-{token}"
