"""What a step of each kind does: one row a kind, read by every place that asks.

A step's kind (``StepKind``) is what the workflow said the call is; everything that follows from
it — whether a failed call is tried again, whether it spends the model budget, whether a
re-plan may abandon it, whether the store counts it — is a column of ``KINDS`` below, never a
test of one kind written where the question comes up. Adding a kind is adding its member to
``StepKind`` and its row here (a test checks every kind has one), then the ``Run`` method that
makes steps of it. The SQL never names a kind to decide anything: a statement that needs a
column of this table is given the kinds it applies to as a parameter (``kinds_where``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..types import StepKind

__all__ = ["KEPT_ON_REPLAN", "KINDS", "MODEL_CALLS", "WITH_OPERATION", "KindPolicy", "kinds_where"]


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """How a step of one kind behaves. Each field is a question some part of the engine or the
    store asks; the comment says who asks it and why the answer is what it is."""

    # A failed call is tried again under the step's ``retry=`` (``limits.step_policy``): an
    # observation, a model call, or a transaction (it rolled back whole). A pure step would fail
    # the same way, a decision is recorded once, and an effect has its own protocol.
    retried: bool = False
    # The call is a model call: checked against the run's budgets before it is made, its usage
    # counted into the run's totals in the commit that records it (the store does it too), and
    # its result redacted with its opaque reasoning kept (a model needs it back as it came).
    model_call: bool = False
    # The call observes the world at an instant: stamped with the store's clock
    # (``observed_at``), so that ``max_age`` can expire it.
    observed: bool = False
    # The run's deadline is checked before the call (observations and the planner's calls can
    # take long; a recomputation or a recorded value cannot).
    before_deadline: bool = False
    # Kept by a re-plan: what it did is done in the world or in the ledger's own database, so a
    # change of code never abandons it (``compat.stale_tail``, the store's re-plan statements).
    kept_on_replan: bool = False
    # Recorded lazily, batched with the next step that is recorded on its own: losing its
    # record costs a recomputation, not a repeat.
    batched: bool = False
    # Its result names the step the workflow goes to next (``next_step_id``).
    picks_next: bool = False
    # It carries an operation of the effect ledger: a fork copies the operation with the step,
    # and pages show its state and key.
    has_operation: bool = False
    # Its call is the store's transaction, committed with its record: a lost connection may
    # leave the commit uncertain, and a retry may reconnect.
    commits_with_record: bool = False


# Every recorded step replays its recorded outcome on a resume (an effect's outcome is its
# operation's, reconciled with its owner when a crash left it uncertain); the rows say the rest.
KINDS: dict[StepKind, KindPolicy] = {
    StepKind.PURE: KindPolicy(batched=True),
    StepKind.READ: KindPolicy(retried=True, observed=True, before_deadline=True),
    StepKind.MODEL: KindPolicy(retried=True, model_call=True, before_deadline=True),
    StepKind.DECISION: KindPolicy(before_deadline=True, picks_next=True),
    StepKind.EFFECT: KindPolicy(kept_on_replan=True, has_operation=True),
    StepKind.VALUE: KindPolicy(),
    StepKind.WAIT: KindPolicy(),
    StepKind.TRANSACTION: KindPolicy(retried=True, kept_on_replan=True, commits_with_record=True),
}


def kinds_where(question: Callable[[KindPolicy], bool]) -> list[str]:
    """The kinds (their stored values) whose row answers ``question`` with yes: what a SQL
    statement is given instead of naming kinds itself
    (``kinds_where(lambda kind: kind.kept_on_replan)``)."""
    return sorted(kind.value for kind, policy in KINDS.items() if question(policy))


# What the store's statements are given (see the module docstring).
KEPT_ON_REPLAN = kinds_where(lambda kind: kind.kept_on_replan)
WITH_OPERATION = kinds_where(lambda kind: kind.has_operation)
MODEL_CALLS = kinds_where(lambda kind: kind.model_call)
