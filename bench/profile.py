"""Where safepoint's time goes: pyinstrument over one run of a workload (W1, W1 with every step
durable — ``w1.durable``, ``run.read`` steps —, W2 or W5), or over the resume of a run whose
every step is recorded (W4's replay).

``python -m bench.profile '{"workload": "w1", "backend": "sqlite", "mode": "defaults",
"steps": 20000}'`` prints one JSON line: steps/s under the profiler, the call tree, the flat
list of functions by their own time, and ``parts``: the share of the profiled time spent in
each of the per-step parts (``PARTS``: the input scan, canonical encoding and hashing, the
credential scan, record building, the ledger's rows, the store's statements), each counted
with what it calls.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import Any

from .common import Setting, count_statements, fresh_database, quiet_logging


def profile(workload: str, backend: str, mode: str, steps: int) -> dict[str, Any]:
    from pyinstrument import Profiler

    import safepoint as sp

    from .workloads import safepoint as workloads

    durability = workloads.settings(Setting(backend, mode))["durability"]
    with fresh_database(backend, "profile") as db:
        url = db.sqlite_url if backend == "sqlite" else db.pg_url
        store = _Counting(sp.open_store(url, durability=durability))
        flow = {
            "w1": workloads.w1,
            "w1.durable": workloads.w1_durable,
            "w2": workloads.w2,
            "w4": workloads.w1,
            "w5": workloads.w5,
        }[workload]
        extra = (True,) if workload == "w2" else ()  # W2 with a Transcript, as users write it
        if workload == "w4":
            # W1's run, stopped just before it completes: every step is recorded (but the batch
            # of pure steps in progress), and the profiled resume replays them
            _stopped_before_completion(store, flow, steps)
            store.close()
            store = _Counting(sp.open_store(url, durability=durability))
        owner = None
        if workload == "w5":
            import os

            from safepoint.testing.effects import OWNER_URL_ENV
            from safepoint.testing.owner import OwnerService

            owner = OwnerService().start()
            os.environ[OWNER_URL_ENV] = owner.url
        sent = _count_statements() if backend == "postgres" else None
        profiler = Profiler(interval=0.0005)
        try:
            profiler.start()
            started = time.perf_counter()
            if workload == "w4":
                sp.resume(store, "profile")
            else:
                sp.start(store, flow, steps, *extra, run_id="profile")
            elapsed = time.perf_counter() - started
            profiler.stop()
        finally:
            store.close()
            if owner is not None:
                owner.stop()
    return {
        "workload": workload,
        "backend": backend,
        "mode": mode,
        "steps": steps,
        "steps_per_s_profiled": steps / elapsed,
        "store_calls_per_step": {
            name: round(count / steps, 3) for name, count in sorted(store.calls.items())
        },
        **(
            {"statements_per_step": {name: round(count / steps, 3) for name, count in sorted(sent.items())}}
            if sent is not None
            else {}
        ),
        "parts": parts(profiler.last_session.root_frame()),
        "tree": _relative(profiler.output_text(time="percent_of_total", show_all=False)),
        "flat": _relative(profiler.output_text(flat=True, time="percent_of_total")),
    }


# (what it is, the module, the functions): a part's time is that of its functions' calls, with
# what they call (a call inside another of the same part is counted once).
PARTS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("the step flow and its driver (all of a step)", "_engine/run.py", frozenset({"pure", "read"})),
    ("input hash: JSON scan, canonical encoding, sha256", "_engine/records.py", frozenset({"input_hash"})),
    ("credential scan of the step id", "_rules/ids.py", frozenset({"check_step_id"})),
    ("credential scan of the result", "_rules/secrets.py", frozenset({"refuse_secrets"})),
    ("JSON check of the result", "_rules/canonical.py", frozenset({"require_json"})),
    ("step record building", "_rules/records.py", frozenset({"revised"})),
    ("step record building", "dataclasses.py", frozenset({"replace"})),
    ("the store's write of a step", "storage/sqlite/steps.py", frozenset({"record_step", "record_steps"})),
    ("the store's write of a step", "storage/postgres/steps.py", frozenset({"record_step", "record_steps"})),
    ("the ledger's load (rows to records)", "storage/_rows.py", frozenset({"ledger"})),
    ("the ledger's load (statements)", "storage/sqlite/connection.py", frozenset({"_fetch"})),
    (
        "SQLite's own work (statements, commits)",
        "<built-in>",
        frozenset({"Connection.execute", "Cursor.fetchall", "Cursor.fetchone"}),
    ),
)


_ID_SCAN, _RESULT_SCAN = "credential scan of the step id", "credential scan of the result"


def parts(root: Any) -> dict[str, float]:
    """The percentage of the profiled time in each of ``PARTS``."""
    total = root.time or 1.0
    spent: Counter[str] = Counter()

    def walk(frame: Any, inside: frozenset[str]) -> None:
        path = frame.file_path or "<built-in>"
        for label, module, functions in PARTS:
            if (
                frame.function in functions
                and path.endswith(module)
                and label not in inside
                and not (label == _RESULT_SCAN and _ID_SCAN in inside)  # an id's scan calls it too
            ):
                spent[label] += frame.time
                inside = inside | {label}
        for child in frame.children:
            walk(child, inside)

    walk(root, frozenset())
    return {label: round(100 * spent[label] / total, 1) for label, _, _ in PARTS if label in spent}


def _stopped_before_completion(store: Any, flow: Any, steps: int) -> None:
    import safepoint as sp
    from safepoint._engine.crashpoints import SimulatedCrash, arm

    arm("run.before_complete", "raise")
    try:
        sp.start(store, flow, steps, run_id="profile", lease_ms=0)  # lease_ms=0: resumable now
    except SimulatedCrash:
        pass
    finally:
        arm(None)


def _relative(text: str) -> str:
    """Paths in the profile relative to the project, so results name no machine's folders."""
    from .procs import ROOT

    return text.replace(f"{ROOT}/", "")


def _count_statements() -> Counter[str]:
    """Count what psycopg sends, for the rest of the process (``common.count_statements``)."""
    sent: Counter[str] = Counter()
    count_statements(sent)
    return sent


class _Counting:
    """The store, counting the calls made to it (each write is one transaction)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return found(*args, **kwargs)

        return call


if __name__ == "__main__":
    quiet_logging()
    spec = json.loads(sys.argv[1])
    print(json.dumps(profile(spec["workload"], spec["backend"], spec["mode"], spec["steps"])), flush=True)
