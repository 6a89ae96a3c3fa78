"""The database's clock, estimated between readings of it (PostgreSQL)."""

from __future__ import annotations

import threading
import time


class ClockEstimate:
    """The database's clock without a round trip per reading.

    Every worker takes "now" from the database, so that leases, observations and retention
    windows agree across machines. Asking the server each time costs a round trip per read
    step; instead the offset between this machine's clock and the server's is sampled (the
    midpoint of the round trip) at most once per ``resample_s``, and a reading is this
    machine's clock plus that offset — never earlier than the last reading. Leases and every
    fenced write still use the server's own clock, in SQL.
    """

    def __init__(self, resample_s: float = 1.0) -> None:
        self.resample_s = resample_s
        self._offset_ms: float | None = None
        self._sampled_at = 0.0
        self._last = 0
        self._lock = threading.Lock()

    def due(self) -> bool:
        return self._offset_ms is None or time.monotonic() - self._sampled_at >= self.resample_s

    def sample(self, server_ms: int, before_s: float, after_s: float) -> None:
        with self._lock:
            self._offset_ms = server_ms - (before_s + after_s) * 500
            self._sampled_at = time.monotonic()

    def now(self) -> int:
        with self._lock:
            assert self._offset_ms is not None, "sample the server's clock first"
            self._last = max(self._last, round(time.time() * 1000 + self._offset_ms))
            return self._last
