"""Transaction steps: what their function may not do with the step's transaction.

A transaction step (``Run.transaction``) hands its function the ledger's own connection inside
the one transaction that fences the run, runs the function's statements and records the step.
That transaction is the step's: were the function to commit it, its writes would be durable
without the step record, and a resume would run it again — the one outcome the step exists to
rule out. So each statement is looked at before it is sent (``transaction_control``), and a
misuse is refused with ``misused``, the same words on every store.
"""

from __future__ import annotations

import re

from ..errors import UsageError

# Statements that begin or end a transaction, by their first word (after comments and blanks).
# ``ROLLBACK TO [SAVEPOINT]`` undoes part of the step's work and leaves the transaction open, so
# savepoints stay the function's to use.
_CONTROL = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "PREPARE"})
_LEADING = re.compile(r"\s*(?:(?:--[^\n]*(?:\n|$)|/\*.*?\*/)\s*)*", re.DOTALL)
_WORDS = re.compile(r"([A-Za-z]+)(?:\s+([A-Za-z]+))?")


def transaction_control(query: str) -> str | None:
    """The statement's first word when it begins or ends a transaction (``COMMIT``,
    ``ROLLBACK``, ``BEGIN`` …); None for any other statement."""
    match = _WORDS.match(query, _LEADING.match(query).end())  # type: ignore[union-attr]
    if match is None:
        return None
    first = match.group(1).upper()
    if first not in _CONTROL:
        return None
    second = (match.group(2) or "").upper()
    if first == "ROLLBACK" and second == "TO":
        return None
    if first == "PREPARE" and second != "TRANSACTION":
        return None  # PREPARE name AS …: a prepared statement, not a two-phase commit
    return first


def misused(step_id: str, what: str) -> UsageError:
    """The error for a transaction step's function that tried to end its own transaction."""
    return UsageError(
        f"transaction step {step_id!r}: its function {what}; the step's transaction is"
        " committed by safepoint together with the step record (that is what makes it"
        " exactly once) — return from the function instead, or raise to roll it back."
        " Nothing of it was committed",
        step_id=step_id,
    )
