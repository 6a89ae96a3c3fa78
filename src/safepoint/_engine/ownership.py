"""Who may advance a run: worker identity, liveness and the heartbeat that keeps a lease.

A claim is a compare-and-set on ``state_revision`` that bumps the fence (see the store's
``claim_run``). This module decides *whether* to try: a run may be taken when nobody holds it,
when its lease has expired on the store's clock, or when its holder is a process on this very
machine that no longer exists — a SIGKILLed worker need not be waited out.
"""

from __future__ import annotations

import inspect
import os
import socket
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ..errors import LostOwnership
from ..types import Claim
from . import host

DEFAULT_LEASE_MS = 30_000

_HOST = socket.gethostname()


def _pid_namespace() -> str:
    """Two containers may share a host name and both run pid 1: the pid namespace tells them
    apart, so a pid is only ever checked inside the namespace it belongs to."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


_PIDNS = _pid_namespace()


def _boot_id() -> str:
    """Names this machine's current boot. Host names repeat (cloned VMs, "localhost") and the
    root pid namespace has the same inode on every Linux host; the boot id does not."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as source:
            return source.read().strip().replace("-", "")[:12]
    except OSError:
        return "-"


_BOOT = _boot_id()
_token = uuid.uuid4().hex[:8]


def _new_token() -> None:
    global _token
    _token = uuid.uuid4().hex[:8]


os.register_at_fork(after_in_child=_new_token)


def worker_id() -> str:
    """This process's identity as an owner: ``host:boot:pidns:pid:token`` (no fork keeps the
    token)."""
    return host.current.worker_id(f"{_HOST}:{_BOOT}:{_PIDNS}:{os.getpid()}:{_token}")


def owner_is_gone(owner: str) -> bool:
    """True only when ``owner`` is provably dead: a process of this host that no longer runs.

    Anything uncertain (another host, a live pid that may be reused) answers False, which only
    means waiting for the lease — the safe direction.
    """
    known = host.current.owner_gone(owner)  # a simulation knows its processes
    if known is not None:
        return known
    parts = owner.split(":")
    if len(parts) != 5 or "-" in (_BOOT, _PIDNS):  # without both, "this machine" is unknowable
        return False
    host_name, boot, pidns, pid_text, token = parts
    if (host_name, boot, pidns) != (_HOST, _BOOT, _PIDNS) or not pid_text.isdigit():
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


class Heartbeat:
    """Keeps a claim's lease alive while the worker is busy in a long step (a slow model call),
    so nobody takes the run over from a live worker. A renewal refused by the fence means the
    run was taken over anyway; the worker's next write then raises ``LostOwnership``."""

    def __init__(self, store: Any, claim: Claim) -> None:
        self._claim = claim
        self._halt: Callable[[], None] | None = None
        self.lost = False
        # The beat must not depend on the event loop: a loop busy in a blocking call would let
        # the lease lapse under a live worker. An async store offers a blocking renewal on a
        # connection of its own for this.
        renew = getattr(store, "renew_lease_blocking", None) or store.renew_lease
        if inspect.iscoroutinefunction(renew):
            raise TypeError(
                f"{type(store).__name__} has no blocking renew_lease_blocking() for the heartbeat"
            )
        self._renew: Callable[[Claim], None] = renew

    def __enter__(self) -> Heartbeat:
        if self._claim.lease_ms >= 300:  # shorter leases are for tests that expire them on purpose
            self._halt = host.current.beat(self._claim.lease_ms / 3000, self._beat, "safepoint-heartbeat")
        return self

    def _beat(self) -> bool:
        """One renewal; False once the run was taken over (no more beats)."""
        try:
            self._renew(self._claim)
        except LostOwnership:
            self.lost = True
            return False
        except Exception:  # the store failing for a moment: the next beat tries again
            pass
        return True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._halt is not None:
            self._halt()
