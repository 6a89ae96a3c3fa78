"""Bounded history and continue-as-new: the decisions both stores and the engine share.

A run's history is what it appends to the ledger: its events and its recorded steps
(``RunRecord.history_size``). The stores count both exactly, in the statements that append
them, and enforce a run's limits there too: crossing the soft limit records one
``run.history_warning`` event (and warns here, ``HistoryWarning``); a write that would start
something new past the hard limit matches nothing in its fenced statement and is refused with
``HistoryLimitReached``. A long run stays under its limits by continuing as new: it ends
(``continued``) and a successor with its carried state takes over — same chain, fresh history,
and the chain's effect ledger still reachable by operation id.

Everything here is I/O-free.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import HistoryWarning, UsageError
from ..types import HistoryLimit, RunRecord
from .canonical import require_json
from .secrets import refuse_secrets

DEFAULT_HISTORY_LIMIT = HistoryLimit()


def as_history_limit(value: HistoryLimit | tuple[int | None, int | None] | None) -> HistoryLimit:
    """``@workflow(history_limit=...)``: a ``HistoryLimit``, a ``(soft, hard)`` pair, or None
    for the defaults."""
    if value is None:
        return DEFAULT_HISTORY_LIMIT
    if isinstance(value, HistoryLimit):
        return value
    try:
        soft, hard = value
        return HistoryLimit(soft=soft, hard=hard)
    except (TypeError, ValueError, UsageError) as exc:
        raise UsageError(
            f"history_limit takes HistoryLimit(soft=, hard=) or a (soft, hard) pair: {exc}"
        ) from exc


def warning_due(size: int, soft: int | None, warned_at: int | None) -> bool:
    """Whether a write that brought the history to ``size`` must record the soft limit's
    warning: the first time the history stands at or past it (whatever write got it there)."""
    return soft is not None and warned_at is None and size >= soft


def history_warning(run_id: str, size: int, soft: int | None, hard: int | None) -> HistoryWarning:
    until = f"; at {hard} it stops recording anything new" if hard is not None else ""
    return HistoryWarning(
        f"run {run_id!r} has {size} events and steps, past its soft history limit of {soft}"
        f"{until}: have the workflow call run.continue_as_new(state) to carry on in a fresh"
        " run"
    )


def warn(warning: HistoryWarning | None) -> None:
    """Warn (once the write that recorded the warning event committed)."""
    if warning is not None:
        warnings.warn(warning, stacklevel=3)


def successor_run_id(run: RunRecord) -> str:
    """The id of the run that continues ``run``: its chain's first run id and its place,
    ``case-1~1``, ``case-1~2``, … The same every time it is asked, so a continue retried after
    a crash names the same successor and can never make a second one."""
    return f"{run.chain_id or run.run_id}~{run.chain_index + 1}"


def successor_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The carried state, as the successor's inputs: JSON, and never a credential."""
    inputs = {"args": list(args), "kwargs": kwargs}
    require_json(inputs, "the state passed to continue_as_new", allow_tuples=True)
    refuse_secrets(inputs, "the state passed to continue_as_new")
    return inputs
