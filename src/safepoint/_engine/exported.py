"""A run read out of its store whole, as the portable document ``safepoint export`` writes.

``export_flow`` reads the run's ledger, its approvals, messages, events and the payload of each
operation, as one flow, so that a sync and an async store are read alike; ``export_run`` (and
``export_run_async``) make the document of it (``_rules.run_file``).

The reads are several statements, not one snapshot: a run a worker moves meanwhile (a step
recorded, an event appended) is read again, until its state revision and its count of events
are the same after the reads as before them — so the file's steps, operations and events belong
to one moment of the run. A run that keeps moving is read at most ``_TRIES`` times, and then
the last read is what the file holds: export a run that has ended, or stands still, for a file
of one moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._rules.ids import check_run_id
from .._rules.run_file import RecordedRun, run_document
from ..storage.base import Store
from .flow import Flow, adrive, drive, io, require_store

if TYPE_CHECKING:
    from ..storage.base import AsyncStore

_TRIES = 5


def export_flow(run_id: str) -> Flow[RecordedRun]:
    """Everything the ledger holds of one run, as records (``RunNotFound`` for no such run)."""
    for _ in range(_TRIES):
        ledger = yield from io(Store.load_ledger, run_id)
        approvals = yield from io(Store.approvals, run_id)
        messages = yield from io(Store.messages, run_id)
        events = yield from io(Store.events, run_id)
        payloads: dict[str, bytes] = {}
        for op in ledger.operations.values():
            if op.payload_ref not in payloads:
                payloads[op.payload_ref] = yield from io(Store.get_artifact, op.payload_ref)
        after = yield from io(Store.get_run, run_id)
        if (after.state_revision, after.event_count) == (ledger.run.state_revision, ledger.run.event_count):
            break
    return RecordedRun(
        run=ledger.run,
        steps=ledger.steps,
        operations=ledger.operations,
        attempts=ledger.attempts,
        approvals=approvals,
        messages=messages,
        events=events,
        payloads=payloads,
    )


def export_run(store: Store, run_id: str, /) -> dict[str, Any]:
    """A run as a portable, versioned JSON document — what ``safepoint export`` writes: the
    run, its steps, operations (each with its payload), failed attempts, approvals, messages
    and events, as the ledger holds them. A sealed store's values come out as plain values
    (opened with its keyring). ``json.dumps`` writes it; the documentation's "The run file"
    says what each part holds and how versions are read. ``RunNotFound`` for no such run.

    >>> document = export_run(store, "triage-8472")  # doctest: +SKIP
    >>> document["format"], document["version"]  # doctest: +SKIP
    ('safepoint.run', 1)
    """
    require_store(store, "export_run")
    return run_document(drive(store, export_flow(check_run_id(run_id))))


async def export_run_async(store: Store | AsyncStore, run_id: str, /) -> dict[str, Any]:
    """``export_run`` from async code."""
    require_store(store, "export_run_async")
    return run_document(await adrive(store, export_flow(check_run_id(run_id))))
