"""Run one workflow step of a kill test in this process: ``python -m safepoint.testing.child``.

Starts (or resumes) a run and prints one JSON line describing how it ended, so the harness in
another process can compare outcomes (``--slice SECONDS``: for at most so long; a run the slice
left unfinished prints ``{"status": "unfinished", ...}``). Crash points are armed through the environment
(``SAFEPOINT_CRASH_AT``), so this process may die by SIGKILL anywhere.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from .. import errors
from .._engine.ownership import DEFAULT_LEASE_MS
from .._engine.verbs import resume, start
from .._engine.workflow import Workflow
from ..storage import open_store
from ..types import Unfinished


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m safepoint.testing.child")
    parser.add_argument("--store", required=True)
    parser.add_argument("--workflow", required=True, help="module:attribute of a @workflow")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--args", default="[]", help="JSON list of workflow arguments")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS)
    parser.add_argument("--slice", type=float, default=None, help="seconds this call may spend")
    opts = parser.parse_args(argv)
    module, _, attr = opts.workflow.partition(":")
    wf = getattr(importlib.import_module(module), attr)
    if not isinstance(wf, Workflow):
        parser.error(f"{opts.workflow} is not a @workflow")
    store = open_store(opts.store)
    try:
        if opts.resume:
            result = resume(store, opts.run_id, lease_ms=opts.lease_ms, slice=opts.slice)
        else:
            result = start(
                store,
                wf,
                *json.loads(opts.args),
                run_id=opts.run_id,
                lease_ms=opts.lease_ms,
                slice=opts.slice,
            )
        outcome: dict[str, Any]
        if isinstance(result, Unfinished):
            outcome = {"status": "unfinished", "run_id": result.run_id, "reason": result.reason}
        else:
            outcome = {"status": "completed", "result": result}
    except errors.RunBlocked as exc:
        outcome = {
            "status": "blocked",
            "error": type(exc).__name__,
            "message": exc.message,
            "record": exc.record,
        }
    except errors.LimitReached as exc:  # stopped, resumably, until a person raises the limit
        outcome = {
            "status": "stopped",
            "error": type(exc).__name__,
            "message": exc.message,
            "record": exc.record,
        }
    except errors.SafepointError as exc:
        outcome = {"status": "error", "error": type(exc).__name__, "message": exc.message}
    except errors.LostOwnership as exc:
        outcome = {"status": "lost", "error": "LostOwnership", "fence": exc.fence}
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
