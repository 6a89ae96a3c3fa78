"""Transaction steps: what their function may not do with the step's transaction, and what
the ledger concludes when it did it all the same.

A transaction step (``Run.transaction``) hands its function the ledger's own connection inside
the one transaction that fences the run, runs the function's statements and records the step.
That transaction is the step's: were the function to commit it, its writes would be durable
without the step record, and a resume would run it again — the one outcome the step exists to
rule out.

Two lines hold it. The first is a courtesy: each statement sent through the step's connection
is looked at before it is sent (``transaction_control``), and one that begins or ends a
transaction is refused with ``misused`` — nothing of it was sent, so nothing was committed, and
the function's author learns it at once. It cannot be the guarantee: a statement can hide a
COMMIT from any filter (comments PostgreSQL nests, two statements in one), and a library handed
the driver's connection commits without sending anything through the step. The second line is
the guarantee: after the function, the store checks that the transaction it opened is still
the one open. When it is not, the step *may have committed* (``uncertain_record``): it is never
reported as "nothing committed" and never run again blindly — the run blocks until a person
resolves it. The record that says so is written first in the step's own transaction, so a
commit the function makes commits it too: a process killed right after such a commit leaves the
step recorded as uncertain, never as not run.

A lost connection is the store's failure, not the step's: nothing of the transaction committed
(or the step record committed with it, which the next attempt finds), so the step is tried
again, each loss counted as an attempt (``reconnecting``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import StoreUnavailable, UsageError
from ..types import Retry, StepRecord, StepStatus
from .kinds import KINDS
from .records import revised

# Statements that begin or end a transaction, by their first word (after comments and blanks).
# ``ROLLBACK TO [SAVEPOINT]`` undoes part of the step's work and leaves the transaction open, so
# savepoints stay the function's to use.
_CONTROL = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "PREPARE"})
_LEADING = re.compile(r"\s*(?:(?:--[^\n]*(?:\n|$)|/\*.*?\*/)\s*)*", re.DOTALL)
_WORDS = re.compile(r"([A-Za-z]+)(?:\s+([A-Za-z]+))?")

# The error type of a transaction step recorded as uncertain (see ``uncertain_record``).
UNCERTAIN = "TransactionUncertain"
# What the uncertain record says when it is found committed: only a commit the function made
# (or a library it called) commits it without the step's own record overwriting it.
COMMITTED_UNDER_THE_STEP = (
    "its transaction was committed before safepoint recorded the step — by its function or a"
    " library it handed the connection to"
)
# Attempts a lost connection gets when the step's own policy tries it once (the default).
RECONNECT_ATTEMPTS = 3


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
    """The error for a transaction step's function that tried to end its own transaction and
    was refused before anything was sent (the store raises it only once it found the step's
    transaction still the one open)."""
    return UsageError(
        f"transaction step {step_id!r}: its function {what}; the step's transaction is"
        " committed by safepoint together with the step record (that is what makes it"
        " exactly once) — return from the function instead, or raise to roll it back."
        " Nothing of it was committed",
        step_id=step_id,
    )


def uncertain_record(step: StepRecord, how: str = COMMITTED_UNDER_THE_STEP) -> StepRecord:
    """``step`` recorded as uncertain: its transaction may have committed without its record.
    Failed, so that nothing replays a value it never recorded, with an error of type
    ``UNCERTAIN`` saying ``how`` — the engine blocks on it instead of raising the failure."""
    return revised(step, status=StepStatus.FAILED, result=None, error={"type": UNCERTAIN, "message": how})


def is_uncertain(step: StepRecord) -> bool:
    """Whether ``step`` is a transaction step recorded as uncertain (``uncertain_record``)."""
    return (
        KINDS[step.kind].commits_with_record
        and step.status is StepStatus.FAILED
        and isinstance(step.error, dict)
        and step.error.get("type") == UNCERTAIN
    )


def is_lost_connection(error: dict[str, Any] | None) -> bool:
    """Whether a transaction step's failed attempt (its error evidence) lost its connection."""
    return isinstance(error, dict) and error.get("type") == StoreUnavailable.__name__


def reconnecting(policy: Retry) -> Retry:
    """The attempts of a transaction step whose connection was lost: its own ``retry=``, or
    ``RECONNECT_ATTEMPTS`` when that tries it once — a lost connection is tried again whatever
    the step's exceptions to retry say. Used up, they stop the run resumably (a person raises
    the step's attempts), never fail it: nothing of the step committed."""
    attempts = policy.attempts if policy.attempts > 1 else RECONNECT_ATTEMPTS
    return replace(policy, attempts=attempts, retry_on=(StoreUnavailable,))
