"""Run families: a run, its forks and its continue-as-new successors, and the one rule they
share — an operation is applied at most once across the family, unless a person names it to be
sent again (DESIGN, "Families of runs").

Every run names its family (``RunRecord.family_id``: the run the family grew from) and its
generation there (``family_generation``: its place in a continue-as-new chain, counted from the
family's first run; a fork stands where its source stands, since it replays its source's code
from the same place). Every operation names what it is within the family — its *family key*:

- an operation id the caller chose names one operation across the family (as it does across a
  chain): ``op <id>``;
- a step's own id names one operation per generation: the fork of a run re-asks its source's
  steps, and a fork's successor its source's successor's, at the same generation; two runs of
  one chain ask them anew: ``step <generation> <id>``;
- an operation a fork was told to send again (``resend``) is that fork's own: the key says who
  sent it again (``… resent <fork>``), so it is claimed once more, and once.

The claim on a family key is taken by the store in the very transaction that marks the operation
dispatching (``safepoint.storage.families``): whichever member sends first holds it, in whatever
order the members carry on, and any other member's dispatch is refused (``ClaimedInFamily``) and
answered from the holder's outcome — or the member blocks until the holder settles it. The
holder keeps the claim when its operation is found not applied (by a person, or by its owner):
it alone sends it again, under its own key, the only one that lets the owner absorb a request
of it still on its way. Only a dispatch that provably never left gives the claim back.
Everything here is I/O-free.
"""

from __future__ import annotations

from ..types import RunRecord


def family_key(run: RunRecord, operation_id: str, *, chosen: bool, resent_by: str | None) -> str:
    """What ``operation_id`` of ``run`` is within its family (see the module docstring):
    ``chosen``, an id the caller gave the effect; ``resent_by``, the fork that was told to send
    it again — this run's, or one it was forked from (``_rules.fork.resent_by``)."""
    key = f"op {operation_id}" if chosen else f"step {run.family_generation} {operation_id}"
    if resent_by is not None:
        key += f" resent {resent_by}"
    return key


def transaction_key(run: RunRecord, step_id: str, *, resent_by: str | None) -> str:
    """What a transaction step of ``run`` is within its family: one per generation and step id,
    as a step's own operation is (a committed transaction step is an effect that happened)."""
    key = f"transaction {run.family_generation} {step_id}"
    if resent_by is not None:
        key += f" resent {resent_by}"
    return key


def in_a_family(run: RunRecord) -> bool:
    """Whether ``run`` grew from another (a fork, a successor, or theirs): what it sends may
    already have been sent by a run it grew from, which it looks up before preparing it. (The
    first run of a family learns it at the dispatch, from the store's refusal.)"""
    return run.family_id is not None and run.family_id != run.run_id
