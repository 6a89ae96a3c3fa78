"""Effects: how a change in another system is described, and the dispatch rules as pure functions.

The rules here decide; they never do I/O. ``_engine/dispatch.py`` carries them out against the store and
the effect owner. Reading order: ``Effect`` (what users declare), then
``one_commit_to_dispatching`` (when "prepared" and "dispatching" are one commit),
``next_action`` (what durable evidence allows) and ``after_reconcile`` (what the owner's
answer allows).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic

from ..types import JSON, EffectState, LedgerIdentity, OperationRecord, RunRecord
from .canonical import sha256_hex
from .secrets import refuse_secrets

# What an effect's execute returns (its receipt): ``run.effect`` returns the same type. A bare
# ``Effect`` annotation means ``Effect[Any]`` (a default, which typing has from Python 3.13).
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    ReceiptT_co = TypeVar("ReceiptT_co", covariant=True, default=Any)
else:
    from typing import TypeVar

    ReceiptT_co = TypeVar("ReceiptT_co", covariant=True)


@dataclass(frozen=True, slots=True)
class EffectKey:
    """The idempotency key of one operation, handed to ``execute`` and ``reconcile``.

    ``str(key)`` is the key to send to the owner (e.g. an ``Idempotency-Key`` header). ``fence``
    is the dispatching worker's fence token, for owners that refuse stale writers.
    """

    key: str
    operation_id: str
    run_id: str
    fence: int

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True, slots=True)
class Applied:
    """Reconcile's answer: the owner has the operation; ``receipt`` is what execute would return."""

    receipt: JSON


@dataclass(frozen=True, slots=True)
class NotApplied:
    """Reconcile's answer: the owner authoritatively has no such operation."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """Reconcile's answer: the owner cannot tell (yet). The run blocks rather than guess."""

    reason: str = "the effect owner could not say"


Reconciled = Applied | NotApplied | Unknown


class NotSent(Exception):
    """Raise from ``execute`` only when the request provably never left (connection refused).

    It is the one failure that releases an operation to be dispatched again directly; any other
    exception makes the outcome ``unknown`` and sends it to reconciliation.
    """


class Rejected(Exception):
    """Raise from ``execute`` when the owner definitively refused: nothing was applied."""

    def __init__(self, evidence: JSON) -> None:
        super().__init__(str(evidence))
        self.evidence = evidence


@dataclass(frozen=True, slots=True, weakref_slot=True)  # weak: see declared.py
class Effect(Generic[ReceiptT_co]):
    """A change in another system, made at most once per operation id.

    ``execute(payload, key) -> receipt`` performs it, passing ``str(key)`` to the owner as the
    idempotency key. ``reconcile(key) -> Applied | NotApplied | Unknown`` asks the owner what
    happened to that key; without it, an uncertain outcome always blocks the run.
    ``dedup_retention`` is how long the owner remembers a key: a re-dispatch after ``NotApplied``
    is only allowed inside it (set it a little shorter than the owner's documented window). That
    window must also exceed the longest pause a worker may survive in the middle of a call
    (plus the lease and a takeover): a request sent before the pause still arrives after it, and
    only an owner that still remembers the key — or that refuses a stale ``key.fence`` — absorbs
    it (the documentation's "Fencing and leases": "What a paused worker can still do").
    ``verify(receipt) -> bool`` optionally confirms an applied outcome; a failure blocks, and so
    does a verifier that has not answered within ``verify_timeout`` (a timedelta or seconds) —
    never another dispatch (with a timeout, a plain verifier runs on a thread of its own, left
    behind if it hangs; an async one is cancelled). ``target_state(payload) -> JSON`` optionally
    reads the current state of what the effect changes (the balance a refund comes out of): an
    approval of the effect is bound to its digest too, so a change of that state since the
    approval withdraws it. An error it raises comes out of ``run.effect``; nothing is sent.

    Each effect is known to its process by its name, so that ``resolve`` can ask its owner
    before a person's "not applied" sends it again: give each effect a name of its own.

    >>> charges = Effect("charge", execute=lambda payload, key: {"id": "ch_1"})
    """

    # The payload each callable gets is the one recorded, read back: plain dicts and lists.
    name: str
    execute: Callable[[Any, EffectKey], ReceiptT_co]  # an async execute: ReceiptT_co is awaitable
    reconcile: Callable[[EffectKey], Reconciled | Awaitable[Reconciled]] | None = None
    verify: Callable[[Any], bool | Awaitable[bool]] | None = None
    dedup_retention: timedelta | None = None
    max_dispatches: int = 3
    target_state: Callable[[Any], JSON | Awaitable[JSON]] | None = None
    verify_timeout: timedelta | float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("an Effect needs a non-empty name")
        refuse_secrets(self.name, "the effect's name")  # recorded with each operation
        if self.max_dispatches < 1:
            raise ValueError("max_dispatches must be at least 1")
        if self.dedup_retention is not None and not (
            isinstance(self.dedup_retention, timedelta) and self.dedup_retention > timedelta(0)
        ):
            # Read only when a crash is reconciled: a wrong one must be said now, not then.
            raise ValueError(
                f"dedup_retention={self.dedup_retention!r}: give how long the"
                " owner remembers a key as a positive timedelta (e.g."
                " timedelta(hours=23)), or None"
            )
        if self.verify_timeout is not None and seconds(self.verify_timeout) <= 0:
            raise ValueError("verify_timeout must be a positive duration")
        declare(self)

    @property
    def verify_timeout_s(self) -> float | None:
        """``verify_timeout`` in seconds (None: the verifier may take as long as it takes)."""
        return None if self.verify_timeout is None else seconds(self.verify_timeout)


def seconds(duration: timedelta | float) -> float:
    """A duration given as a timedelta or a number of seconds, in seconds."""
    if isinstance(duration, timedelta):
        return duration.total_seconds()
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"a duration is a timedelta or a number of seconds, not {duration!r}")
    return float(duration)


def retention_ms(dedup_retention: timedelta | None) -> int | None:
    """An effect's ``dedup_retention`` in milliseconds, as each of its operations records it
    (None: none declared) — what a prune reads to know when the owner has forgotten a key."""
    if dedup_retention is None:
        return None
    return int(dedup_retention.total_seconds() * 1000)


def mint_effect_key(ledger_id: str, scope: str, operation_id: str) -> str:
    """Derive an operation's idempotency key from the ledger's id, the run (or chain) that
    names the operation, and its operation id. Called once, at prepare; the key is then stored
    and only ever read back — never minted again for the same operation.

    The ledger's id makes the key unique to its ledger: two ledgers that use the same run ids
    (dev and prod, two tenants, a database created again) never send one key to one owner,
    which would hand the second run the first run's receipt. The key is a digest, so it tells
    the owner nothing about the ledger, the run or the operation."""
    return "sp_" + sha256_hex(f"{ledger_id}\x00{scope}\x00{operation_id}".encode())[:40]


def attempt_key(minted: str, key_attempt: int) -> str:
    """The key of attempt ``key_attempt`` of an operation whose first key was ``minted``: that
    key itself for the first attempt; for a later one (a person had an operation its owner
    rejected sent again, ``safepoint.retry(resend=…)``), a key derived from the minted key and
    the attempt — new to the owner, so that it does not answer with the rejection it keeps for
    the first key, and still bound to the one operation of the one ledger."""
    if key_attempt == 1:
        return minted
    return "sp_" + sha256_hex(f"{minted}\x00attempt\x00{key_attempt}".encode())[:40]


def _minted_keys(op: OperationRecord, run: RunRecord, identity: LedgerIdentity) -> set[str]:
    scopes = {run.run_id, run.chain_id or run.run_id}
    return {mint_effect_key(identity.ledger_id, scope, op.operation_id) for scope in scopes}


def key_is_minted(op: OperationRecord, run: RunRecord, identity: LedgerIdentity) -> bool:
    """Whether ``op``'s stored key is the key that was minted for it: the key of its operation
    id in its run (or in its run's chain, for an operation id the caller chose) in this ledger —
    for a later attempt of the operation (``key_attempt`` above 1), exactly the key derived from
    that one for that attempt (``attempt_key``), and not the first. A key altered after it was
    recorded (a hand edit, a corrupted row) is none of these: it must not be reconciled nor
    sent, since the owner knows the operation by the key minted."""
    if isinstance(op.key_attempt, bool) or not isinstance(op.key_attempt, int) or op.key_attempt < 1:
        return False
    return op.effect_key in {attempt_key(m, op.key_attempt) for m in _minted_keys(op, run, identity)}


def next_attempt_key(op: OperationRecord, run: RunRecord, identity: LedgerIdentity) -> str | None:
    """The key the next attempt of ``op`` is sent under (``key_attempt + 1``), derived from the
    key minted for it; None when its stored key is not the one minted (then nothing may be
    derived from it, nor sent)."""
    if not key_is_minted(op, run, identity):
        return None
    keys = _minted_keys(op, run, identity)
    minted = next(m for m in keys if attempt_key(m, op.key_attempt) == op.effect_key)
    return attempt_key(minted, op.key_attempt + 1)


# Operations a new dispatch must not go out beside, when the code no longer reaches them: one
# that may have happened or did happen would be done twice under a fresh key if the code now
# asks for the same change under another name. Under ``replan`` an accepted operation is part
# of the kept effect ledger that a new plan may knowingly diverge from.
_MAY_HAVE_HAPPENED = frozenset({EffectState.DISPATCHING, EffectState.UNKNOWN, EffectState.APPLIED})
_HAPPENED = _MAY_HAVE_HAPPENED | {EffectState.ACCEPTED}


def orphaned(
    unreached: Iterable[OperationRecord], open_branches: Iterable[str], here: str, *, replans: bool
) -> list[OperationRecord]:
    """The operations of a run that forbid a new dispatch at ``here`` (the step-id prefix of
    the code asking, "" outside a fan-out), among those the code resuming the run has not
    reached yet: ones that may have happened (or, under ``refuse``, did) — unless they belong
    to a fan-out branch still open that ``here`` is not inside: that sibling may reach them
    yet. Deterministic code reaches every operation it recorded before it asks for a new one,
    so an orphan means the code changed under the run (an effect step renamed, moved, its
    operation id changed)."""
    kept = _MAY_HAVE_HAPPENED if replans else _HAPPENED
    siblings = [branch for branch in open_branches if not here.startswith(branch)]
    return [
        op for op in unreached if op.state in kept and not any(op.step_id.startswith(b) for b in siblings)
    ]


class Action(StrEnum):
    DISPATCH = "dispatch"
    RECONCILE = "reconcile"
    RECORD_APPLIED = "record_applied"
    VERIFY = "verify"
    ACCEPT = "accept"
    REPLAY = "replay"
    REPLAY_REJECTION = "replay_rejection"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class Next:
    action: Action
    reason: str = ""


def one_commit_to_dispatching(effect: Effect, *, approval: bool) -> bool:
    """Whether a new operation of ``effect`` is prepared and committed "dispatching" in one
    commit (DESIGN §3: "where no gate stands between 1 and 2 they may be one commit"), which
    spares each dispatch a commit.

    Only when nothing stands between the two, and recovery always gets through a crash between
    that one commit and the call without a person. An approval is a gate (the run may wait at
    it), so "prepared" must be durable on its own. A crash after the commit leaves the operation
    "dispatching", which recovery settles only by asking the owner (``reconcile``); on
    ``NotApplied`` it dispatches again under the same key, which needs ``dedup_retention`` and a
    dispatch left (``max_dispatches`` above one: the first is counted at the commit). Lacking
    any of these, "dispatching" would block the run for a person where a separate "prepared"
    commit lets recovery simply dispatch: such an effect keeps the two commits.
    (An owner that answers ``Unknown``, or a resume past the retention, still blocks — as after
    a crash between a separate "dispatching" commit and the call.)
    """
    return (
        not approval
        and effect.reconcile is not None
        and effect.dedup_retention is not None
        and effect.max_dispatches > 1
    )


def next_action(state: EffectState, *, can_reconcile: bool, can_verify: bool) -> Next:
    """What the durable state of an operation allows next (DESIGN §3, "on resume")."""
    if state is EffectState.PREPARED:
        return Next(Action.DISPATCH)
    if state in (EffectState.DISPATCHING, EffectState.UNKNOWN):
        if can_reconcile:
            return Next(Action.RECONCILE)
        return Next(
            Action.BLOCK,
            "the dispatch may have happened and the effect has no reconcile function to ask its owner",
        )
    if state is EffectState.APPLIED:
        return Next(Action.VERIFY) if can_verify else Next(Action.ACCEPT)
    if state is EffectState.ACCEPTED:
        return Next(Action.REPLAY)
    return Next(Action.REPLAY_REJECTION)


def after_reconcile(
    answer: Any,
    *,
    now: int,
    first_dispatched_at: int | None,
    dedup_retention: timedelta | None,
    dispatch_count: int,
    max_dispatches: int,
) -> Next:
    """What the owner's answer allows. Never a fresh key; re-dispatch only under the old one,
    only after an authoritative ``NotApplied``, and only while the owner still remembers it."""
    if isinstance(answer, Applied):
        return Next(Action.RECORD_APPLIED)
    if isinstance(answer, Unknown):
        return Next(Action.BLOCK, f"reconcile could not settle it: {answer.reason}")
    if not isinstance(answer, NotApplied):
        return Next(
            Action.BLOCK, f"reconcile returned {type(answer).__name__}, not Applied, NotApplied or Unknown"
        )
    if dedup_retention is None:
        return Next(
            Action.BLOCK,
            "the owner reports it not applied, but the effect declares no"
            " dedup_retention, so a re-dispatch could apply it twice if"
            " that report lags",
        )
    remembered_ms = retention_ms(dedup_retention)
    if (
        first_dispatched_at is not None
        and remembered_ms is not None
        and now - first_dispatched_at >= remembered_ms
    ):
        return Next(
            Action.BLOCK,
            f"the owner reports it not applied, but the first dispatch was"
            f" {(now - first_dispatched_at) / 1000:.0f}s ago, past the"
            f" owner's dedup retention of {dedup_retention}: the key may be"
            " forgotten, so a re-dispatch is not safe",
        )
    if dispatch_count >= max_dispatches:
        return Next(Action.BLOCK, f"dispatched {dispatch_count} times without an outcome")
    return Next(Action.DISPATCH)


# -- declarations -----------------------------------------------------------------------------
#
# The effects declared in this process, by name: how an operator verb finds an effect's owner.
#
# A ledger names an operation's effect by its name only; the ``Effect`` — with the ``reconcile``
# that asks its owner — lives in the user's code. Every ``Effect`` is entered here when it is
# constructed, so that ``resolve`` in a process that imported that code (``safepoint resolve
# --import myapp``, or ``sp.resolve`` inside the application) can ask the owner before a person's
# "not applied" sends the effect again.
#
# Entries are weak: an effect nobody uses any more drops out. Two effects under one name are one
# declaration when their ``reconcile`` is the same code (a module imported twice, a factory
# called again, ``dataclasses.replace``): the newest stands for them. Under one name with another
# ``reconcile`` (or one with and one without) they are ambiguous: nobody can say which owner holds
# the operation, and ``lookup`` says so instead of choosing.

_lock = threading.Lock()
# name -> {origin of its reconcile (None: it has none) -> the newest such effect}
_declared: dict[str, dict[str | None, weakref.ref[Effect]]] = {}


def declare(effect: Effect) -> None:
    """Enter ``effect`` (called by ``Effect`` itself, once constructed)."""
    with _lock:
        _declared.setdefault(effect.name, {})[origin(effect.reconcile)] = weakref.ref(effect)


@dataclass(frozen=True, slots=True)
class Declared:
    """What this process knows of the effect named ``name``."""

    name: str
    effect: Effect | None  # the one declaration, when there is exactly one
    origins: tuple[str, ...] = ()  # where each reconcile was defined, when ambiguous

    @property
    def known(self) -> bool:
        return self.effect is not None or bool(self.origins)

    @property
    def ambiguous(self) -> bool:
        return bool(self.origins)


def lookup(name: str) -> Declared:
    """The live declaration(s) of the effect called ``name`` in this process."""
    with _lock:
        entries = _declared.get(name, {})
        live = {key: found for key, ref in list(entries.items()) if (found := ref()) is not None}
        if not live:
            _declared.pop(name, None)
        else:
            _declared[name] = {key: entries[key] for key in live}
    if len(live) == 1:
        return Declared(name, next(iter(live.values())))
    return Declared(name, None, tuple(sorted(key or "(no reconcile)" for key in live)))


def origin(fn: Any) -> str | None:
    """Where a reconcile function was written (file and line), so that the same code reached
    twice counts once; None for no function."""
    if fn is None:
        return None
    target = getattr(fn, "func", fn)  # functools.partial: the function it calls
    target = getattr(target, "__func__", target)  # a bound method: its function
    code = getattr(target, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}"
    kind = type(target)  # a callable object: its class
    return f"{kind.__module__}.{kind.__qualname__}"
