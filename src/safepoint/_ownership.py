"""Who may advance a run: worker identity, liveness, and the claim decision.

A claim is a compare-and-set on ``state_revision`` that bumps the fence (see the store's
``claim_run``). This module decides *whether* to try: a run may be taken when nobody holds it,
when its lease has expired on the store's clock, or when its holder is a process on this very
machine that no longer exists — a SIGKILLed worker need not be waited out.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from .errors import RunOwned
from .types import RunRecord

DEFAULT_LEASE_MS = 30_000

_HOST = socket.gethostname()
_token = uuid.uuid4().hex[:8]


def _new_token() -> None:
    global _token
    _token = uuid.uuid4().hex[:8]


os.register_at_fork(after_in_child=_new_token)


def worker_id() -> str:
    """This process's identity as an owner: ``host:pid:token`` (the token survives no fork)."""
    return f"{_HOST}:{os.getpid()}:{_token}"


def owner_is_gone(owner: str) -> bool:
    """True only when ``owner`` is provably dead: a process of this host that no longer runs.

    Anything uncertain (another host, a live pid that may be reused) answers False, which only
    means waiting for the lease — the safe direction.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, token = rest.partition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return token != _token  # an earlier process that had our pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a killed child its parent has not reaped yet is a zombie: it will never write again
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    dead_owner: str | None = None


def plan_claim(run: RunRecord, now: int, *, owner_gone: bool) -> ClaimPlan:
    """Decide whether a claim may be attempted; raise ``RunOwned`` when a live worker holds it."""
    if run.owner is None or run.lease_expires_at is None or run.lease_expires_at <= now:
        return ClaimPlan()
    if owner_gone:
        return ClaimPlan(dead_owner=run.owner)
    raise RunOwned(run.run_id, run.owner, run.lease_expires_at)
