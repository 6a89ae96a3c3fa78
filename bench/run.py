"""The benchmark, in one command: ``python -m bench.run`` (``make bench`` sets up its environment).

Runs W0 to W5 for safepoint, DBOS and LangGraph, on SQLite and PostgreSQL, in both settings
("defaults against defaults" and "equal durability"), repetition after repetition: within a
repetition every system runs one right after another, in an order that rotates, so that each
ratio safepoint/peer is taken between neighbours in time. Writes the JSON results, a PNG chart,
and (with ``--doc``) the tables into the docs page between its markers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import report
from .common import BACKENDS, MODES, PG_ADMIN_URL, SYSTEMS, Sizes, drop_leftover_databases
from .procs import ROOT

WORKLOADS = {
    "safepoint": ["w1", "w2", "w3", "w4", "w5", "w5tx", "w6", "w7"],
    "dbos": ["w1", "w2", "w3", "w4"],
    "langgraph": ["w1", "w2", "w4"],
}
# (workload, backend, mode, steps): where W1's time goes on each backend, and what explains the
# W2, W4 (the replay of a resume) and W5 figures.
PROFILES = [
    ("w1", "sqlite", "defaults", 20000),
    ("w1", "sqlite", "equal", 3000),
    ("w1", "postgres", "defaults", 3000),
    ("w2", "sqlite", "defaults", 1000),
    ("w4", "postgres", "equal", 1000),
    ("w5", "sqlite", "equal", 500),
]
PACKAGES = [
    "safepoint",
    "dbos",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "psycopg-pool",
    "SQLAlchemy",
    "matplotlib",
    "pyinstrument",
    "anthropic",
    "openai",
]
RESULTS_START, RESULTS_END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"
PROFILES_START, PROFILES_END = "<!-- bench:profiles:start -->", "<!-- bench:profiles:end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition: for development")
    parser.add_argument("--repeat", type=int, help="repetitions (default 5; 1 with --quick)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON results go"
    )
    parser.add_argument("--chart", type=Path, help="the PNG to draw (default: beside the JSON)")
    parser.add_argument("--no-chart", action="store_true")
    parser.add_argument("--doc", type=Path, help="a Markdown page whose marked sections to refresh")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="measure nothing: redraw the chart and tables of a saved run",
    )
    opts = parser.parse_args(argv)
    if opts.report:
        saved = json.loads(opts.report.read_text())
        _outputs(opts, saved["meta"], report.Measured(saved["cells"]), saved["profiles"], opts.report)
        return 0

    sizes = Sizes.quick() if opts.quick else Sizes.full()
    repeat = opts.repeat or (1 if opts.quick else 5)
    systems = _pick(opts.systems, SYSTEMS, "system")
    backends = _pick(opts.backends, BACKENDS, "backend")
    modes = _pick(opts.modes, MODES, "mode")
    _check_ready(systems, backends, profile=not opts.no_profile)
    if "postgres" in backends:
        left = drop_leftover_databases()
        if left:
            _say(f"dropped {len(left)} database(s) left by an interrupted run")

    started = time.time()
    meta = _machine(sizes, repeat, opts.quick)
    cells = _measure(sizes, repeat, systems, [(b, m) for b in backends for m in modes])
    scale = 10 if opts.quick else 1
    profiles = [] if opts.no_profile else [_profile(w, b, m, steps // scale) for w, b, m, steps in PROFILES]
    meta["duration_s"] = time.time() - started
    meta["loadavg_end"] = os.getloadavg()
    _write(opts, meta, cells, profiles)
    return 1 if any(c.get("errors") for c in cells) else 0


def _measure(
    sizes: Sizes, repeat: int, systems: list[str], settings: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Every cell, repetition after repetition; within one, the systems (and the floor) run one
    right after another in an order that rotates: ABC, BCA, CAB, ..."""
    cells: list[dict[str, Any]] = []
    total = repeat * len(settings) * (len(systems) + 1)
    for rep in range(repeat):
        for backend, mode in settings:
            order = ["floor", *systems]
            shift = rep % len(order)
            for system in order[shift:] + order[:shift]:
                spec = {
                    "system": system,
                    "backend": backend,
                    "mode": mode,
                    "workloads": WORKLOADS.get(system, []),
                    "sizes": sizes.as_dict(),
                }
                cell = _run_cell(spec)
                cell["rep"] = rep
                cells.append(cell)
                errors = "; ".join(f"{k}: {v}" for k, v in cell.get("errors", {}).items())
                _say(
                    f"[{len(cells)}/{total}] rep {rep + 1} {backend}/{mode} {system}: "
                    f"{cell['wall_s']:.1f}s" + (f"  ERRORS {errors}" if errors else "")
                )
    return cells


def _write(
    opts: argparse.Namespace,
    meta: dict[str, Any],
    cells: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
) -> None:
    measured = report.Measured(cells)
    results = {
        "meta": meta,
        "summary": report.summary(measured),
        "ratios": report.ratios(measured),
        "targets": [t.as_dict() for t in report.targets(measured)],
        "profiles": profiles,
        "cells": cells,
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    stem = f"{'quick-' if opts.quick else ''}{meta['date']}-{meta['host']}"
    json_path = opts.out / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    _say(f"results: {_rel(json_path)}")
    _outputs(opts, meta, measured, profiles, json_path)


def _outputs(
    opts: argparse.Namespace,
    meta: dict[str, Any],
    measured: report.Measured,
    profiles: list[dict[str, Any]],
    json_path: Path,
) -> None:
    """The chart, the tables on stdout, and the page's marked sections."""
    if not opts.no_chart:
        chart_path = opts.chart or json_path.with_suffix(".png")
        try:
            from . import chart

            chart.draw(measured, chart_path, _title(meta), meta["sizes"])
            _say(f"chart: {_rel(chart_path)}")
        except ImportError:
            _say("chart skipped: matplotlib is not installed here (make bench installs it)")
    tables = report.tables(measured)
    print(tables)
    if opts.doc:
        _refresh_doc(opts.doc, meta, measured, tables, profiles, json_path)
        _say(f"doc: {_rel(opts.doc)}")


def _pick(raw: str, allowed: tuple[str, ...], what: str) -> list[str]:
    chosen = [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}(s) {unknown}; choose from {', '.join(allowed)}")
    return [x for x in allowed if x in chosen]  # the canonical order


def _check_ready(systems: list[str], backends: list[str], *, profile: bool) -> None:
    # the model SDKs for W6 and W7, the integrations' cost
    modules = {
        "dbos": "dbos",
        "langgraph": "langgraph.checkpoint.sqlite",
        "anthropic": "anthropic",
        "openai": "openai",
    }
    if "postgres" in backends:
        modules["psycopg"] = "psycopg"
        if "langgraph" in systems:
            modules["langgraph-pg"] = "langgraph.checkpoint.postgres"
    if profile:
        modules["pyinstrument"] = "pyinstrument"
    missing = []
    for name, module in modules.items():
        if name in ("dbos", "langgraph") and name not in systems:
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SystemExit(
            f"not installed here: {', '.join(missing)}. `make bench` installs the peers"
            " into bench/.venv; or pass --systems safepoint --no-profile"
        )
    if "postgres" in backends:
        import psycopg

        try:
            psycopg.connect(PG_ADMIN_URL, connect_timeout=5).close()
        except psycopg.Error as exc:
            raise SystemExit(
                f"cannot reach PostgreSQL at {PG_ADMIN_URL} ({exc}); set BENCH_PG_URL"
                " or pass --backends sqlite"
            ) from exc


def _run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bench.cell", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        cell = {
            "system": spec["system"],
            "backend": spec["backend"],
            "mode": spec["mode"],
            "results": {},
            "errors": {"cell": done.stderr.strip()[-3000:]},
        }
    else:
        cell = json.loads(lines[-1])
        if cell.get("errors"):
            cell["stderr"] = done.stderr.strip()[-3000:]
    cell["wall_s"] = time.perf_counter() - started
    return cell


def _profile(workload: str, backend: str, mode: str, steps: int) -> dict[str, Any]:
    spec = {"workload": workload, "backend": backend, "mode": mode, "steps": steps}
    done = subprocess.run(
        [sys.executable, "-m", "bench.profile", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**spec, "error": done.stderr.strip()[-2000:]}
    found: dict[str, Any] = json.loads(lines[-1])
    _say(
        f"profiled {workload.upper()} {backend}/{mode}: {found['steps_per_s_profiled']:,.0f}"
        " steps/s under the profiler"
    )
    return found


def _machine(sizes: Sizes, repeat: int, quick: bool) -> dict[str, Any]:
    now = dt.datetime.now()
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    meta: dict[str, Any] = {
        "date": now.strftime("%Y-%m-%d-%H%M"),
        "started": now.isoformat(timespec="seconds"),
        "host": socket.gethostname().split(".")[0],
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
        "commit": _git_commit(),
        "sizes": sizes.as_dict(),
        "repeat": repeat,
        "quick": quick,
        "loadavg_start": os.getloadavg(),
    }
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=5) as conn:
            meta["postgres"] = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in (
                    "server_version",
                    "synchronous_commit",
                    "fsync",
                    "wal_sync_method",
                    "commit_delay",
                )
            }
    except Exception as exc:
        meta["postgres"] = {"error": str(exc)}
    return meta


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _title(meta: dict[str, Any]) -> str:
    return (
        f"safepoint {meta['versions'].get('safepoint')} vs DBOS {meta['versions'].get('dbos')}"
        f" vs LangGraph {meta['versions'].get('langgraph')} — {meta['started']},"
        f" {meta['cpu_count']} CPUs, medians of {meta['repeat']}"
    )


def _refresh_doc(
    doc: Path,
    meta: dict[str, Any],
    measured: report.Measured,
    tables: str,
    profiles: list[dict[str, Any]],
    json_path: Path,
) -> None:
    pg = meta.get("postgres", {})
    facts = (
        f"Run of {meta['started']} on `{meta['host']}`: {meta['cpu_count']} CPUs"
        f" ({meta['cpu']}), Python {meta['python']}, SQLite {meta['sqlite']}, PostgreSQL"
        f" {pg.get('server_version', '?')} (synchronous_commit={pg.get('synchronous_commit')},"
        f" fsync={pg.get('fsync')}), safepoint commit {meta['commit']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v)
        + "."
        f" Medians of {meta['repeat']} repetitions, {meta['duration_s'] / 60:.1f} minutes;"
        f" load average {meta['loadavg_start'][0]:.1f} at the start,"
        f" {meta['loadavg_end'][0]:.1f} at the end. Raw figures: `{_rel(json_path)}`."
    )
    block = "\n".join([facts, "", "What each system ran with:", "", report.settings_table(measured), tables])
    text = _replace(doc.read_text(), RESULTS_START, RESULTS_END, block)
    if profiles:
        parts = []
        for found in profiles:
            name = f"{found['workload'].upper()}, {found['backend']}/{found['mode']}"
            if "error" in found:
                parts.append(f"{name}: the profile failed")
                continue
            # a run's own calls (create, finish) round to 0 per step; batched ones do not
            calls = (
                ", ".join(f"{k} {v:g}" for k, v in found["store_calls_per_step"].items() if v > 0) or "none"
            )
            if "statements_per_step" in found:
                calls += "; sent to the server per step: " + ", ".join(
                    f"{k} {v:g}" for k, v in found["statements_per_step"].items()
                )
            parts += [
                f"**{name}, {found['steps']} steps**"
                f" ({found['steps_per_s_profiled']:,.0f} steps/s under the profiler);"
                f" store calls per step: {calls}. The call tree (frames of 2% or more),"
                " then functions by their own time:",
                "",
                "```",
                _top(found["tree"], 2.0, 45),
                "```",
                "",
                "```",
                _top(found["flat"], 0.0, 15),
                "```",
                "",
            ]
        text = _replace(text, PROFILES_START, PROFILES_END, "\n".join(parts))
    doc.write_text(text)


def _top(profile: str, least: float, lines: int) -> str:
    """A pyinstrument text profile without its banner, keeping frames of ``least`` % or more."""
    kept = []
    for line in profile.strip().splitlines()[5:]:
        found = re.search(r"(\d+\.\d)%", line)
        if line.strip() and (found is None or float(found.group(1)) >= least):
            kept.append(line.rstrip())
    return "\n".join(kept[:lines])


def _replace(text: str, start: str, end: str, block: str) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"the page lacks the markers {start} … {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block.strip()}\n{end}{tail}"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
