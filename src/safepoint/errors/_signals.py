"""The signals derived from ``BaseException`` (so that ``except Exception`` in agent code cannot
swallow them), and ``HistoryWarning``.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from typing import Any

from ._base import Declared, error


@error
class LostOwnership(Declared, BaseException):
    """This worker's fence token is stale: another worker owns the run. Stop at once.

    Derived from ``BaseException`` so that agent code's ``except Exception`` cannot swallow it.
    """

    run_id: str
    fence: int

    def _message(self) -> str:
        return (
            f"worker lost ownership of run {self.run_id!r} (its fence {self.fence} is stale);"
            " another worker took the run over — this worker must stop without writing or"
            " dispatching"
        )


@error
class Cancelled(Declared, BaseException):
    """The run was asked to stop: this worker may settle what is in flight but starts nothing
    new. A ``BaseException``, so that agent code's ``except Exception`` cannot swallow it."""

    run_id: str

    def _message(self) -> str:
        return f"run {self.run_id!r} was asked to stop; nothing new is started"


@error
class ContinueAsNew(Declared, BaseException):
    """Raised by ``run.continue_as_new(...)``: the run ends (status ``continued``) and its
    successor starts with ``inputs`` as its arguments. A ``BaseException``, so that agent code's
    ``except Exception`` cannot swallow it; there is nothing to catch — let it pass."""

    run_id: str
    inputs: dict[str, Any]

    def _message(self) -> str:
        return f"run {self.run_id!r} continues as new; its successor carries on"


@error
class SliceEnded(Declared, BaseException):
    """The slice of time the call was given (``resume(..., slice=...)``, ``start``, a worker's
    ``run``) was spent: the run stops at this step boundary — before ``step_id``, which did not
    start — and is released at once, for the next call to carry on. The call returns
    ``safepoint.types.Unfinished``; this signal never reaches its caller. A ``BaseException``,
    so that agent code's ``except Exception`` cannot swallow it; there is nothing to catch."""

    run_id: str
    step_id: str | None
    slice_s: float
    elapsed_s: float

    def _message(self) -> str:
        before = f" before step {self.step_id!r}" if self.step_id is not None else ""
        return (
            f"run {self.run_id!r}: the slice of {self.slice_s:g}s was spent ({self.elapsed_s:.2f}s"
            f" since the call began); it stops{before} and is released for the next call to"
            " carry on"
        )


class HistoryWarning(UserWarning):
    """A run's history crossed its soft limit (``HistoryLimit.soft``): it should continue as new
    before it reaches the hard limit, where it would stop. Recorded once per run as a
    ``run.history_warning`` event too."""
