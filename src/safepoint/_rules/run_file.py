"""A recorded run as a portable document: what ``safepoint export`` writes and a replay reads.

``RecordedRun`` is everything a replay needs of one run, as records: the run, its steps,
operations (with the payload each carries), failed attempts, approvals, messages and events.
``run_document`` makes the versioned JSON document of it (``schemas/run-file.v1.schema.json``
describes it); ``recorded_run`` reads such a document back, checked, or says what is wrong.
No I/O here: the store is read elsewhere (``_engine.replay``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..types import (
    ApprovalRecord,
    AttemptRecord,
    EventRecord,
    MessageRecord,
    OperationRecord,
    RunRecord,
    StepRecord,
)

FORMAT = "safepoint.run"
VERSION = 1


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """One run as its ledger holds it."""

    run: RunRecord
    steps: Mapping[str, StepRecord] = field(default_factory=dict)
    operations: Mapping[str, OperationRecord] = field(default_factory=dict)
    attempts: Mapping[str, list[AttemptRecord]] = field(default_factory=dict)
    approvals: list[ApprovalRecord] = field(default_factory=list)
    messages: list[MessageRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    payloads: Mapping[str, bytes] = field(default_factory=dict)  # payload_ref -> the bytes stored


def run_document(recorded: RecordedRun) -> dict[str, Any]:
    """The JSON-ready document of ``recorded`` (format ``FORMAT``, version ``VERSION``)."""
    raise NotImplementedError


def recorded_run(document: Any) -> RecordedRun:
    """The run a document holds; ``RunFileInvalid`` naming what is wrong and where."""
    raise NotImplementedError
