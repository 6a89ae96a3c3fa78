"""Moments and durations as a person reads them: ``2030-01-31T17:00:05Z (in 25s)``.

The ledger keeps times as integer epoch milliseconds; everything safepoint shows a person — error
messages, the command line, the dashboard — says them in these words, never as a number.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def instant(ms: int, *, millis: bool = False) -> str:
    """Epoch milliseconds as an ISO 8601 UTC instant: ``2030-01-31T17:00:05Z``."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if millis:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def span(ms: int) -> str:
    """A duration as a person says it: ``25s``, ``3m``, ``2h``, ``4d`` (never negative)."""
    seconds = max(0, ms) // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def relative(ms: int, now: int) -> str:
    """How far ``ms`` is from ``now``: ``in 25s``, ``3m ago``."""
    return f"in {span(ms - now)}" if ms > now else f"{span(now - ms)} ago"


def when(ms: int, now: int | None = None) -> str:
    """A moment as a person reads it: ``2030-01-31T17:00:05Z (in 25s)``; ``now`` defaults to
    this machine's clock (for messages written where no store's clock is at hand)."""
    now = time.time_ns() // 1_000_000 if now is None else now
    return f"{instant(ms)} ({relative(ms, now)})"
