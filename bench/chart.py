"""One PNG with a panel per workload, from one run's medians (matplotlib, bench environment only)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .report import NAMES, Measured

COLOURS = {
    "safepoint": "#1f77b4",
    "dbos": "#ff7f0e",
    "langgraph": "#2ca02c",
    "floor": "#7f7f7f",
    "http": "#9467bd",
}


def draw(run: Measured, path: Path, title: str, sizes: dict[str, int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    present = run.systems
    _bars(run, axes[0][0], "w1", "steps_per_s", "steps/s (log)", present, floor=True)
    axes[0][0].set_title(f"W1: {sizes['w1_steps']} sequential trivial steps")
    _storage(run, axes[0][1])
    _bars(run, axes[0][2], "w2", "last_over_first", "per-step cost, last 100 / first 100", present, log=False)
    axes[0][2].axhline(1.1, color="red", linestyle=":", linewidth=1)
    axes[0][2].set_title("W2: per-step cost as the state grows (target: 1.1, dotted)")
    _bars(
        run,
        axes[1][0],
        "w3",
        "steps_per_s",
        "steps/s (log)",
        [s for s in present if s in ("safepoint", "dbos")],
    )
    axes[1][0].set_title(
        f"W3: {sizes['w3_runs']} runs x {sizes['w3_steps']} steps at once,"
        f" {sizes['w3_workers']} worker processes"
    )
    _bars(run, axes[1][1], "w4", "recover_s", "seconds (log)", present)
    axes[1][1].set_title(f"W4: recovery after SIGKILL at step {sizes['w4_kill_at']} (lower is better)")
    _effects(run, axes[1][2])
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _labels(run: Measured) -> list[str]:
    return [
        s.replace("sqlite", "SQLite")
        .replace("postgres", "PostgreSQL")
        .replace("/defaults", "\ndefaults")
        .replace("/equal", "\nequal durability")
        for s in run.settings
    ]


def _bars(
    run: Measured,
    ax: Any,
    workload: str,
    metric: str,
    ylabel: str,
    systems: list[str],
    *,
    log: bool = True,
    floor: bool = False,
) -> None:
    settings = run.settings
    width = 0.8 / len(systems)
    for index, system in enumerate(systems):
        values = [run.median(s, system, workload, metric) or 0 for s in settings]
        xs = [i + (index - len(systems) / 2 + 0.5) * width for i in range(len(settings))]
        ax.bar(xs, values, width, label=NAMES[system], color=COLOURS[system])
    if floor:
        for i, setting in enumerate(settings):
            key = run.floor_key(setting, "safepoint")
            value = run.median(setting, "floor", "w0", key) if key else None
            if value:
                ax.hlines(
                    value,
                    i - 0.45,
                    i + 0.45,
                    colors=COLOURS["floor"],
                    linestyles="dashed",
                    label="safepoint's floor (commits/s)" if i == 0 else None,
                )
    ax.set_xticks(range(len(settings)), _labels(run), fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)


def _storage(run: Measured, ax: Any) -> None:
    setting = "sqlite/equal" if "sqlite/equal" in run.settings else run.settings[0]
    for system in run.systems:
        probes = _probes(run, setting, system)
        if probes:
            steps = sorted(probes)[1:]
            base = probes[min(probes)]
            ax.plot(
                steps,
                [max(probes[k] - base, 1) / 1024 for k in steps],
                marker="o",
                label=NAMES[system],
                color=COLOURS[system],
            )
    ax.set_xlabel("steps")
    ax.set_yscale("log")
    ax.set_ylabel("database KiB added (log)")
    ax.set_title(f"W2: growing state, storage ({setting})")
    ax.legend(fontsize=8)


def _effects(run: Measured, ax: Any) -> None:
    rows = []
    for setting in run.settings:
        key = run.floor_key(setting, "safepoint")
        floor = run.median(setting, "floor", "w0", key) if key else None
        rows.append(
            (
                run.median(setting, "safepoint", "w5", "effects_per_s") or 0,
                (floor or 0) / 2,
                run.median(setting, "safepoint", "w5", "http_per_s") or 0,
            )
        )
    xs = list(range(len(rows)))
    for offset, (index, label, colour) in zip(
        (-0.27, 0, 0.27),
        [
            (0, "safepoint effects/s", COLOURS["safepoint"]),
            (1, "half the floor", COLOURS["floor"]),
            (2, "raw HTTP creates/s", COLOURS["http"]),
        ],
        strict=True,
    ):
        ax.bar([x + offset for x in xs], [row[index] for row in rows], 0.27, label=label, color=colour)
    ax.set_xticks(xs, _labels(run), fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("per second (log)")
    ax.set_title("W5: effects against the local owner (safepoint only)")
    ax.legend(fontsize=8)


def _probes(run: Measured, setting: str, system: str) -> dict[int, float]:
    """Median database size at each probe point of W2."""
    samples: dict[int, list[float]] = {}
    for rep in run.reps:
        cell = run.by.get((rep, setting, system))
        probes = cell["results"].get("w2", {}).get("probes") if cell else None
        for key, value in (probes or {}).items():
            samples.setdefault(int(key), []).append(float(value))
    return {key: statistics.median(values) for key, values in samples.items()}
