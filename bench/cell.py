"""One cell of the benchmark: one system's workloads in one setting, in a process of its own.

``python -m bench.cell '{"system": …, "backend": …, "mode": …, "workloads": […], "sizes": {…}}'``
prints one JSON line: the settings the system ran with and each workload's figures. A process
per cell keeps the systems apart (DBOS is a process-wide singleton; nothing warmed by one system
helps another) and each workload gets a fresh database.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from typing import Any

from .common import Setting, Sizes, quiet_logging


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    setting = Setting(spec["backend"], spec["mode"])
    sizes = Sizes(**spec["sizes"])
    system = spec["system"]
    out: dict[str, Any] = {
        "system": system,
        "backend": setting.backend,
        "mode": setting.mode,
        "results": {},
        "errors": {},
    }
    if system == "floor":
        from . import floor

        out["results"]["w0"] = floor.measure(setting.backend, sizes)
        return out
    module = importlib.import_module(f"bench.workloads.{system}")
    out["settings"] = module.settings(setting)
    for workload in spec["workloads"]:
        try:
            out["results"][workload] = module.measure(workload, setting, sizes)
        except Exception as exc:  # one broken workload must not hide the others' figures
            out["errors"][workload] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    return out


if __name__ == "__main__":
    quiet_logging()
    print(json.dumps(run_cell(json.loads(sys.argv[1]))), flush=True)
