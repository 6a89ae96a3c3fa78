"""When an idle worker's wait for work ends (``Store.wait_for_work``), decided apart from how a
store hears news (NOTIFY, a changed ``data_version``) and from its clock (any monotonic one).

A wait ends at its timeout; at the moment the next waiting run falls due, which no news
announces; or at news — but news heard sooner than ``quiet`` is held until then, so that a
worker whose wake-ups kept bringing nothing asks the store less often. A due time is never held:
news heard while held may say that a run began waiting (a sleep, a wait with a timeout), so the
due time is read again, at most every ``DUE_REREAD_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

# A wait for a due run ends this much after its due time: the claim that follows must find the
# run due — one a hair early finds nothing, and the next wait no longer sees a due time ahead
# (it looks only forward: a run overdue for want of a worker of its workflow must not wake
# workers of others again and again), so the run would wait out the rescan interval.
DUE_MARGIN_S = 0.002
# How often news heard during ``quiet`` has the due time read again: a run that began waiting
# meanwhile is taken no later than this after it falls due, and a storm of news costs an idle
# worker no more than this many small reads.
DUE_REREAD_S = 0.05


@dataclass
class WorkWait:
    deadline: float  # the timeout
    quiet_until: float
    due: float  # the next waiting run falls due (never after the deadline)
    heard: bool = False
    read_at: float = 0.0  # when the due time was last read
    reread: float | None = None  # news asks for the due time again: read it then

    @classmethod
    def begin(cls, now: float, timeout: float, quiet: float, due_in: float | None) -> WorkWait:
        """A wait from ``now``; ``due_in``: seconds until the next waiting run falls due."""
        wait = cls(deadline=now + timeout, quiet_until=now + quiet, due=now + timeout, read_at=now)
        wait.due_read(now, due_in)
        return wait

    def end(self) -> float:
        """The instant the wait ends, as things stand."""
        return min(self.due, self.quiet_until) if self.heard else self.due

    def next_look(self) -> float:
        """The instant to look again: the end, or sooner to read the due time again."""
        return self.end() if self.reread is None else min(self.end(), self.reread)

    def news(self, now: float) -> None:
        """News was heard at ``now``."""
        self.heard = True
        if now < self.quiet_until and self.reread is None:
            self.reread = max(now, self.read_at + DUE_REREAD_S)

    def due_read(self, now: float, due_in: float | None) -> None:
        """The due time, read just before ``now`` (take ``now`` once the read returned: the
        wait must not end before the instant it names)."""
        self.read_at, self.reread = now, None
        if due_in is not None:
            self.due = min(self.deadline, now + max(0.0, due_in) + DUE_MARGIN_S)

    def rereading(self, now: float) -> bool:
        """Whether the due time is to be read again now."""
        return self.reread is not None and now >= self.reread
