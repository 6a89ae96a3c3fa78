"""From the cells of one run to medians, ratios pair by pair, the targets, and Markdown tables.

A ratio safepoint/peer is computed within each repetition — from two cells run one right after
the other — and the median of those ratios is reported; medians of values are reported beside
them. Nothing is compared across runs.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from . import targets as _targets
from .common import BACKENDS, MODES
from .targets import Target, effect_bound

__all__ = ["Measured", "Target", "ratios", "settings_table", "summary", "tables", "targets"]
targets = _targets.targets

PEERS = ("dbos", "langgraph")
NAMES = {"safepoint": "safepoint", "dbos": "DBOS", "langgraph": "LangGraph"}
FLOOR_LABELS = {
    "wal_normal": "WAL, NORMAL",
    "wal_full": "WAL, FULL",
    "delete_full": "DELETE journal, FULL",
    "pg_on": "synchronous_commit=on",
}


def _median(values: list[float]) -> float | None:
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(clean) if clean else None


def _dig(tree: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


class Measured:
    """The cells of one run, indexed by repetition, setting and system."""

    def __init__(self, cells: list[dict[str, Any]]) -> None:
        self.cells = cells
        self.by: dict[tuple[int, str, str], dict[str, Any]] = {}
        for cell in cells:
            self.by[(cell["rep"], f"{cell['backend']}/{cell['mode']}", cell["system"])] = cell
        self.reps = sorted({cell["rep"] for cell in cells})
        self.settings = [
            f"{b}/{m}"
            for b in BACKENDS
            for m in MODES
            if any(c["backend"] == b and c["mode"] == m for c in cells)
        ]
        self.systems = [s for s in ("safepoint", *PEERS) if any(c["system"] == s for c in cells)]

    def value(self, rep: int, setting: str, system: str, *path: str) -> float | None:
        cell = self.by.get((rep, setting, system))
        if cell is None:
            return None
        found = _dig(cell["results"], *path)
        return float(found) if isinstance(found, int | float) else None

    def raw(self, setting: str, system: str, *path: str) -> Any:
        """What the first repetition that has it recorded at ``path``, whatever its type (the
        settings a connection ran with are text)."""
        for rep in self.reps:
            cell = self.by.get((rep, setting, system))
            found = _dig(cell["results"], *path) if cell else None
            if found is not None:
                return found
        return None

    def floor(self, rep: int, setting: str, system: str) -> float | None:
        """The floor measured with the driver and durability of ``system`` in ``setting``."""
        key = self.floor_key(setting, system)
        return self.value(rep, setting, "floor", "w0", key) if key else None

    def floor_key(self, setting: str, system: str) -> str | None:
        for rep in self.reps:
            cell = self.by.get((rep, setting, system))
            if cell and "settings" in cell:
                key: str = cell["settings"]["floor"]
                return key
        return None

    def settings_of(self, setting: str, system: str) -> dict[str, Any]:
        for rep in self.reps:
            cell = self.by.get((rep, setting, system))
            if cell and "settings" in cell:
                found: dict[str, Any] = cell["settings"]
                return found
        return {}

    def median(self, setting: str, system: str, *path: str) -> float | None:
        return _median([self.value(r, setting, system, *path) for r in self.reps])  # type: ignore[misc]

    def samples(self, setting: str, system: str, *path: str) -> list[float]:
        return [v for r in self.reps if (v := self.value(r, setting, system, *path)) is not None]

    def ratio(self, setting: str, top: tuple[str, ...], bottom: tuple[str, ...]) -> float | None:
        """Median over repetitions of value(top)/value(bottom); a path starting with "floor"
        means that system's floor."""
        ratios = []
        for rep in self.reps:
            a, b = self._term(rep, setting, top), self._term(rep, setting, bottom)
            if a is not None and b:
                ratios.append(a / b)
        return _median(ratios)

    def _term(self, rep: int, setting: str, term: tuple[str, ...]) -> float | None:
        if term[0] == "floor":
            return self.floor(rep, setting, term[1])
        if term[0] == "half_floor":
            floor = self.floor(rep, setting, term[1])
            return floor / 2 if floor else None
        if term[0] == "w5_bound":  # two floor commits and one HTTP call, both of this repetition
            http = self.value(rep, setting, term[1], "w5", "http_per_s")
            return effect_bound(self.floor(rep, setting, term[1]), http)
        return self.value(rep, setting, *term)


# -- summary (for the JSON) ---------------------------------------------------------------------


def summary(run: Measured) -> dict[str, Any]:
    """Medians of every figure, by setting, system and workload."""
    out: dict[str, Any] = defaultdict(dict)
    for cell in run.cells:
        setting = f"{cell['backend']}/{cell['mode']}"
        out[setting].setdefault(cell["system"], {})
    for setting, systems in out.items():
        for system in systems:
            leaves: dict[tuple[str, ...], list[float]] = defaultdict(list)
            for rep in run.reps:
                cell = run.by.get((rep, setting, system))
                if cell:
                    _leaves(cell["results"], (), leaves)
            tree: dict[str, Any] = {}
            for path, values in leaves.items():
                node = tree
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = _median(values)
            systems[system] = tree
    return dict(out)


def _leaves(tree: Any, path: tuple[str, ...], into: dict[tuple[str, ...], list[float]]) -> None:
    if isinstance(tree, dict):
        for key, value in tree.items():
            _leaves(value, (*path, str(key)), into)
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        into[path].append(float(tree))


def ratios(run: Measured) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    sp = "safepoint"
    for setting in run.settings:
        row: dict[str, float | None] = {}
        for system in run.systems:
            row[f"w1 {system}/floor"] = run.ratio(setting, (system, "w1", "steps_per_s"), ("floor", system))
        row["w1 durable safepoint/floor"] = run.ratio(
            setting, (sp, "w1", "durable_steps_per_s"), ("floor", sp)
        )
        for peer in PEERS:
            row[f"w1 safepoint/{peer}"] = run.ratio(
                setting, (sp, "w1", "steps_per_s"), (peer, "w1", "steps_per_s")
            )
            row[f"w1 durable safepoint/{peer}"] = run.ratio(
                setting, (sp, "w1", "durable_steps_per_s"), (peer, "w1", "steps_per_s")
            )
            row[f"w2 bytes safepoint/{peer}"] = run.ratio(setting, (sp, "w2", "bytes"), (peer, "w2", "bytes"))
            row[f"w4 recover_s safepoint/{peer}"] = run.ratio(
                setting, (sp, "w4", "recover_s"), (peer, "w4", "recover_s")
            )
        row["w3 safepoint/dbos"] = run.ratio(
            setting, (sp, "w3", "steps_per_s"), ("dbos", "w3", "steps_per_s")
        )
        row["w5 safepoint/(floor/2)"] = run.ratio(setting, (sp, "w5", "effects_per_s"), ("half_floor", sp))
        row["w5 safepoint/bound"] = run.ratio(setting, (sp, "w5", "effects_per_s"), ("w5_bound", sp))
        out[setting] = row
    return out


# -- Markdown -----------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def tables(run: Measured) -> str:
    lines: list[str] = []
    for setting in run.settings:
        lines += _setting_table(run, setting)
    lines += _targets.tables(run)
    return "\n".join(lines)


def _setting_table(run: Measured, setting: str) -> list[str]:
    backend, mode = setting.split("/")
    title = {"defaults": "defaults against defaults", "equal": "equal durability"}[mode]
    systems = run.systems
    peers = [p for p in PEERS if p in systems]
    blank = ["" for _ in peers]
    lines = [
        f"### {'SQLite' if backend == 'sqlite' else 'PostgreSQL'}: {title}",
        "",
        "| workload | figure | "
        + " | ".join(NAMES[s] for s in systems)
        + "".join(f" | safepoint/{NAMES[p]}" for p in peers)
        + " |",
        "|" + "---|" * (2 + len(systems) + len(peers)),
    ]

    def row(workload: str, figure: str, cells: list[str], ratios: list[str]) -> None:
        lines.append(
            f"| {workload} | {figure} | " + " | ".join(cells) + "".join(f" | {r}" for r in ratios) + " |"
        )

    def med(system: str, *path: str, digits: int = 0) -> str:
        return _n(run.median(setting, system, *path), digits)

    def vs_peers(*path: str, only: tuple[str, ...] = PEERS) -> list[str]:
        return [_x(run.ratio(setting, ("safepoint", *path), (p, *path))) if p in only else "" for p in peers]

    def floor_cell(system: str) -> str:
        key = run.floor_key(setting, system)
        if key is None:
            return "-"
        return f"{_n(run.median(setting, 'floor', 'w0', key))} ({FLOOR_LABELS.get(key, key)})"

    row("W0", "floor, commits/s (each system's setting)", [floor_cell(s) for s in systems], blank)
    row("W1", "steps/s", [med(s, "w1", "steps_per_s") for s in systems], vs_peers("w1", "steps_per_s"))
    row(
        "W1",
        "of its own floor",
        [_pct(run.ratio(setting, (s, "w1", "steps_per_s"), ("floor", s))) for s in systems],
        blank,
    )
    row(
        "W1",
        "steps/s, each step durable before the next (safepoint: `run.read`)",
        [med(s, "w1", "durable_steps_per_s") if s == "safepoint" else "" for s in systems],
        [
            _x(run.ratio(setting, ("safepoint", "w1", "durable_steps_per_s"), (p, "w1", "steps_per_s")))
            for p in peers
        ],
    )
    row(
        "W1",
        "... of its own floor",
        [
            _pct(run.ratio(setting, (s, "w1", "durable_steps_per_s"), ("floor", s)))
            if s == "safepoint"
            else ""
            for s in systems
        ],
        blank,
    )
    row(
        "W2",
        "ms/step, first 100 → last 100 (safepoint: a `Transcript`)",
        [f"{med(s, 'w2', 'first_ms', digits=2)} → {med(s, 'w2', 'last_ms', digits=2)}" for s in systems],
        blank,
    )
    row("W2", "last/first", [med(s, "w2", "last_over_first", digits=2) for s in systems], blank)
    row(
        "W2",
        "... safepoint with the state as a plain list: ms/step, last/first",
        [
            f"{med(s, 'w2', 'list_first_ms', digits=2)} → {med(s, 'w2', 'list_last_ms', digits=2)},"
            f" {med(s, 'w2', 'list_last_over_first', digits=2)}"
            if s == "safepoint"
            else ""
            for s in systems
        ],
        blank,
    )
    row(
        "W2",
        "database bytes after the run",
        [med(s, "w2", "bytes") for s in systems],
        vs_peers("w2", "bytes"),
    )
    row(
        "W2",
        "bytes/step, last quarter over second quarter (1 = linear)",
        [med(s, "w2", "growth", digits=2) for s in systems],
        blank,
    )
    row(
        "W3",
        "steps/s, all runs at once",
        [med(s, "w3", "steps_per_s") for s in systems],
        vs_peers("w3", "steps_per_s", only=("dbos",)),
    )
    row(
        "W4",
        "recovery wall time, s",
        [med(s, "w4", "recover_s", digits=3) for s in systems],
        vs_peers("w4", "recover_s"),
    )
    row(
        "W4",
        "recovery process, spawn to exit, s",
        [med(s, "w4", "process_s", digits=3) for s in systems],
        blank,
    )
    row(
        "W4",
        "recorded steps replayed (or restored) per s, from the resume call",
        [med(s, "w4", "replay_steps_per_s") for s in systems],
        blank,
    )
    row(
        "W4",
        "... counted from the workflow function's start",
        [med(s, "w4", "replay_from_entry_steps_per_s") for s in systems],
        blank,
    )
    row(
        "W4",
        "steps run again (the one in flight at the kill included)",
        [med(s, "w4", "reexecuted") for s in systems],
        blank,
    )
    row(
        "W4",
        "... recorded steps replayed per CPU second of the recovery process",
        [med(s, "w4", "replay_cpu_steps_per_s") for s in systems],
        blank,
    )
    row("W5", "effects/s (HTTP owner on loopback)", [med(s, "w5", "effects_per_s") for s in systems], blank)
    row("W5", "HTTP creates/s, the second floor", [med(s, "w5", "http_per_s") for s in systems], blank)
    row(
        "W5",
        "effects/s over half its floor",
        [
            _pct(run.ratio(setting, (s, "w5", "effects_per_s"), ("half_floor", s)))
            if s == "safepoint"
            else "-"
            for s in systems
        ],
        blank,
    )
    row(
        "W5",
        "effects/s of its bound (2 floor commits + 1 HTTP call)",
        [
            _pct(run.ratio(setting, (s, "w5", "effects_per_s"), ("w5_bound", s))) if s == "safepoint" else "-"
            for s in systems
        ],
        blank,
    )
    for sdk, label in (("anthropic", "Anthropic"), ("openai", "OpenAI chat")):
        row(
            "W6",
            f"{label} turn, ms: raw SDK → recorded (overhead; CPU overhead)",
            [
                f"{med(s, 'w6', sdk, 'raw_ms', digits=2)} → {med(s, 'w6', sdk, 'recorded_ms', digits=2)}"
                f" ({med(s, 'w6', sdk, 'overhead_ms', digits=2)};"
                f" {med(s, 'w6', sdk, 'overhead_cpu_ms', digits=2)})"
                if s == "safepoint"
                else "-"
                for s in systems
            ],
            blank,
        )
    turns, window = (round(run.median(setting, "safepoint", "w7", key) or 0) for key in ("turns", "window"))
    row(
        "W7",
        f"{turns}-turn loop, CPU ms/turn, turns 2-{window + 1} → last {window}:"
        " raw SDK; recorded; safepoint's own",
        [
            f"{med(s, 'w7', 'cpu', 'raw_first_ms', digits=2)}"
            f" → {med(s, 'w7', 'cpu', 'raw_last_ms', digits=2)};"
            f" {med(s, 'w7', 'cpu', 'first_ms', digits=2)} → {med(s, 'w7', 'cpu', 'last_ms', digits=2)};"
            f" {med(s, 'w7', 'cpu', 'overhead_first_ms', digits=2)}"
            f" → {med(s, 'w7', 'cpu', 'overhead_last_ms', digits=2)}"
            if s == "safepoint"
            else "-"
            for s in systems
        ],
        blank,
    )
    row(
        "W7",
        "... wall ms/turn, recorded, the same turns",
        [
            f"{med(s, 'w7', 'wall', 'first_ms', digits=2)} → {med(s, 'w7', 'wall', 'last_ms', digits=2)}"
            if s == "safepoint"
            else "-"
            for s in systems
        ],
        blank,
    )
    row(
        "W5t",
        "transaction steps/s (a row each, written with its step in one commit)",
        [med(s, "w5tx", "transactions_per_s") for s in systems],
        blank,
    )
    row(
        "W5t",
        "transaction steps/s over the commit floor measured beside them",
        [_pct(run.median(setting, s, "w5tx", "floor_ratio")) if s == "safepoint" else "-" for s in systems],
        blank,
    )
    lines.append("")
    return lines


def settings_table(run: Measured) -> str:
    lines = ["| system | setting | what it ran with |", "|---|---|---|"]
    for system in run.systems:
        for setting in run.settings:
            found = run.settings_of(setting, system)
            text = "; ".join(f"{k}: {v}" for k, v in found.items() if k != "floor")
            lines.append(f"| {NAMES[system]} | {setting} | {text} |")
    return "\n".join(lines) + "\n"
