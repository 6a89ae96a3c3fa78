"""What must hold after any schedule, whatever the order, the crashes and the people did.

- ``once per family`` — each business operation applied at most once at its owner across a run,
  its forks and successors, unless a person named it for resend (once more per naming); each
  transaction step's writes committed at most once across the family;
- ``stale fence`` — no write accepted from a worker whose fence was no longer the run's;
- ``tool calls answered`` — no model request carried a tool call without its result;
- ``budget`` — no run spent more tokens than its budget and one call in flight;
- ``nothing lost`` — every receipt a run recorded is the owner's, and every operation the owner
  applied for a run that completed is recorded as applied there;
- ``actionable`` — once time settles, every run has completed, failed, been cancelled, is waiting,
  stopped or blocked with a recovery record — never pending or running with nobody on it;
- ``engine error`` — a failed run failed with an error its workflow may raise (``Config``'s
  ``expected_failures``), not one of the engine's own;
- ``replays`` — a replay of a run under the code that recorded it, racing its workers, sent
  nothing, wrote nothing, and asked what the run recorded in the order it was recorded.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection
from typing import Any

from .world import Violation, World


def check(w: World, *, settled: bool, expected_failures: Collection[str] | None) -> list[Violation]:
    """Every invariant, on the world as it now stands."""
    found: list[Violation] = []
    found += _once_per_family(w)
    found += [Violation("stale fence", s) for s in w.store.stale_writes]
    found += [Violation("tool calls answered", s) for s in w.unanswered]
    found += _budgets(w)
    found += _nothing_lost(w)
    if expected_failures is not None:
        found += _engine_errors(w, expected_failures)
    if settled:
        found += _actionable(w)
        found += _replays(w)
    return found


def allowed_resends(w: World) -> Counter[tuple[str, str]]:
    """Per family and business operation: how many times a person named it for resend."""
    allowed: Counter[tuple[str, str]] = Counter()
    for family, operation_id in w.resends:
        for business in w.business_of.get((family, operation_id), ()):
            allowed[(family, business)] += 1
    return allowed


def _once_per_family(w: World) -> list[Violation]:
    allowed = allowed_resends(w)
    senders: dict[tuple[str, str], list[str]] = {}
    for applied in w.owner.applications:
        senders.setdefault((applied.family, applied.business), []).append(applied.run_id)
    found = [
        Violation(
            "once per family",
            f"{business} applied {len(runs)} times at its owner (resends named:"
            f" {allowed[(family, business)]}) — by {', '.join(sorted(set(runs)))}",
        )
        for (family, business), runs in sorted(senders.items())
        if len(runs) > 1 + allowed[(family, business)]
    ]
    committed: dict[tuple[str, str], list[str]] = {}
    for run_id, family_key, step_id in w.store.commits:
        committed.setdefault((w.family_of(run_id), family_key or step_id), []).append(run_id)
    for (_, key), runs in sorted(committed.items()):
        if len(runs) > 1:
            found.append(
                Violation("once per family", f"{key} committed {len(runs)} times, by {', '.join(runs)}")
            )
    booked: dict[str, list[str]] = {}  # the catalog's own rows: counted without the store's keys
    if w.books:
        for business, run_id in w.connection.execute(
            "SELECT business, run_id FROM sim_bookings ORDER BY run_id"
        ):
            booked.setdefault(business, []).append(run_id)
    for business, runs in sorted(booked.items()):
        if len(runs) > 1:
            found.append(
                Violation("once per family", f"{business} booked {len(runs)} times, by {', '.join(runs)}")
            )
    return found


def _budgets(w: World) -> list[Violation]:
    return [
        Violation(
            "budget",
            f"run {run_id} spent {spent} tokens of a budget of {budget} (its largest call: {largest})",
        )
        for run_id, spent, budget, largest in w.connection.execute(
            "SELECT r.run_id, r.tokens_spent, r.token_budget,"
            " (SELECT coalesce(max(s.tokens), 0) FROM safepoint_steps s WHERE s.run_id = r.run_id)"
            " FROM safepoint_runs r WHERE r.token_budget IS NOT NULL"
        )
        if spent > budget + largest
    ]


def _receipt(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _nothing_lost(w: World) -> list[Violation]:
    found: list[Violation] = []
    receipts = {a.receipt["id"] for a in w.owner.applications}
    recorded: dict[tuple[str, str], str] = {}
    for run_id, operation_id, state, key, text in w.connection.execute(
        "SELECT run_id, operation_id, state, effect_key, receipt FROM safepoint_operations"
    ):
        receipt = _receipt(text)
        recorded[(run_id, key)] = state
        if (
            state in ("applied", "accepted")
            and isinstance(receipt, dict)
            and receipt.get("id") not in receipts
        ):
            found.append(
                Violation(
                    "nothing lost",
                    f"run {run_id} recorded {operation_id} applied with a receipt the owner"
                    f" never gave: {receipt}",
                )
            )
    completed = {
        row[0] for row in w.connection.execute("SELECT run_id FROM safepoint_runs WHERE status = 'completed'")
    }
    for applied in w.owner.applications:
        if applied.run_id in completed and recorded.get((applied.run_id, applied.key)) not in (
            None,
            "applied",
            "accepted",
        ):
            found.append(
                Violation(
                    "nothing lost",
                    f"the owner applied {applied.business} for run {applied.run_id}, which completed"
                    f" with the operation recorded {recorded[(applied.run_id, applied.key)]}",
                )
            )
    return found


def _engine_errors(w: World, expected: Collection[str]) -> list[Violation]:
    found = []
    for run_id, error in w.connection.execute(
        "SELECT run_id, error FROM safepoint_runs WHERE status = 'failed'"
    ):
        detail = _receipt(error) or {}
        kind = str(detail.get("type", "?")) if isinstance(detail, dict) else "?"
        if kind.rsplit(".", 1)[-1] not in expected:
            found.append(
                Violation(
                    "engine error",
                    f"run {run_id} failed with {kind}: {str(detail.get('message', error))[:300]}",
                )
            )
    return found


def _actionable(w: World) -> list[Violation]:
    found = []
    for run_id, status, recovery, owner in w.connection.execute(
        "SELECT run_id, status, recovery_record, owner FROM safepoint_runs ORDER BY run_id"
    ):
        if status in ("pending", "running"):
            found.append(
                Violation("actionable", f"run {run_id} is still {status} (owner {owner}) once time settled")
            )
        elif status == "blocked" and not recovery:
            found.append(Violation("actionable", f"run {run_id} is blocked with no recovery record"))
    return found


def _replays(w: World) -> list[Violation]:
    """Every run, replayed under its own code. The same code may still part from a run's record
    where a resume would block too: a fork whose copied step asked about its source (an input
    naming the run, say) is checked as a resume checks it; a fork told to send again an
    operation its source recorded before the steps it copied holds those steps without it, and
    blocks there — the replay finding the step "added" where the run blocked, with the same
    phase, agrees with it. And a run whose steps are answered by its family (a fork's source, an
    earlier run of its chain) reads the family as it stands now (``ReplayReport.family_read``):
    a rejection there since sent again, say, and the run ends, or asks, otherwise today. Any
    other order, step added or left out, or a request to an owner, is the replay's own mistake
    about unchanged code."""
    from ..._engine.host import Host, hosted_by
    from ..._rules.replay import Resume
    from ..replays import replay

    found: list[Violation] = []
    blocked = {
        run_id: json.loads(recovery).get("phase")
        for run_id, recovery in w.connection.execute(
            "SELECT run_id, recovery_record FROM safepoint_runs WHERE status = 'blocked'"
        )
        if recovery
    }
    for (run_id,) in w.connection.execute("SELECT run_id FROM safepoint_runs ORDER BY run_id"):
        requests = w.owner.requests
        with hosted_by(Host()):  # outside the schedule: a fan-out's branches on threads of their own
            report = replay(w.store, run_id)
        if w.owner.requests != requests:
            found.append(Violation("replays", f"a replay of {run_id} sent a request to the effect owner"))
        gone = report.divergence
        if (
            gone is not None
            and not report.family_read
            and not (
                gone.resume is Resume.BLOCK and gone.phase is not None and blocked.get(run_id) == gone.phase
            )
            and (
                gone.kind in ("order", "added", "unasked")
                or (gone.kind in ("changed", "mismatch") and gone.resume is not Resume.BLOCK)
            )
        ):
            found.append(
                Violation("replays", f"{run_id} replays under its own code to {gone.kind}: {gone.reason}")
            )
    return found
