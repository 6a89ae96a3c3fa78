"""(placeholder until the export lands)"""

from __future__ import annotations

from .._rules.run_file import RecordedRun
from ..storage.base import Store
from .flow import Flow, io


def export_flow(run_id: str) -> Flow[RecordedRun]:
    ledger = yield from io(Store.load_ledger, run_id)
    payloads = {}
    for op in ledger.operations.values():
        payloads[op.payload_ref] = yield from io(Store.get_artifact, op.payload_ref)
    approvals = yield from io(Store.approvals, run_id)
    messages = yield from io(Store.messages, run_id)
    events = yield from io(Store.events, run_id)
    return RecordedRun(
        ledger.run, ledger.steps, ledger.operations, ledger.attempts, approvals, messages, events, payloads
    )
