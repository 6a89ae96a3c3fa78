"""What the systems' workloads share: W2's messages and where W2 measures the database."""

from __future__ import annotations

import base64
import random

from ..common import W2_CHUNK


def chunk(index: int) -> str:
    """Step ``index``'s 200-byte message: random text, so that no database compresses it away
    (PostgreSQL compresses large values, and a repeated character would hide their size)."""
    raw = random.Random(index).randbytes(W2_CHUNK * 3 // 4)
    return base64.b64encode(raw).decode("ascii")


def probe_points(count: int) -> list[int]:
    """Steps before which W2 measures the database (and once more after the last)."""
    return [count // 4, count // 2, 3 * count // 4]


def recovery_figures(
    started: float,
    opened: float,
    ended: float,
    entered: list[float],
    calls: list[tuple[int, float]],
    kill_at: int,
) -> dict[str, float | int]:
    """W4's figures, from the recovery process's own clock.

    ``started``: before the store is opened (after imports); ``opened``: when the resume is
    asked for (the store is open); ``ended``: the result is in hand; ``entered``: when the
    workflow function began (systems that replay it); ``calls``: (step index, time) of every
    step body that ran. The first body that ran is the first step not taken from the record:
    every step before it was replayed (or restored).
    """
    first_index, first_at = calls[0]
    figures: dict[str, float | int] = {
        "recover_s": ended - started,
        "open_s": opened - started,
        "replayed": first_index,
        "replay_s": first_at - opened,
        "replay_steps_per_s": first_index / (first_at - opened),
        # steps the killed process had already begun, run again here (the one in flight counts)
        "reexecuted": sum(1 for index, _ in calls if index <= kill_at),
    }
    if entered:
        figures["replay_from_entry_s"] = first_at - entered[0]
        figures["replay_from_entry_steps_per_s"] = first_index / (first_at - entered[0])
    return figures
