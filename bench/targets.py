"""The targets of one run, each with its threshold and whether it is met, and the facts they rest
on: W5's bound, W4's baseline, the durability each side of a floor ratio ran with.

``TARGETS`` are the goals the benchmark is held to now (issue 16, item 1); ``STANDING`` are the
earlier goals, still measured so that a change cannot lose them unnoticed. Every figure is taken
from the one run: ratios between cells run one right after the other, within a repetition, and
their median over the repetitions — except W4's, which is set against a baseline measured once
(``bench/baseline.json``), in CPU time so that the machine's hour moves it as little as can be.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .report import Measured

BASELINE = Path(__file__).resolve().parent / "baseline.json"
SP = "safepoint"


@dataclass
class Target:
    """One goal in one setting: ``measured`` against ``goal`` (``None``: a figure reported, with no
    threshold to meet). ``unit`` says how both read: ``x`` a ratio, ``%`` a share, ``ms``, ``/s``."""

    name: str
    setting: str
    measured: float | None
    goal: float | None
    higher_is_better: bool = True
    unit: str = "x"
    note: str = ""
    group: str = "targets"

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.goal is None or math.isnan(self.measured):
            return None
        return self.measured >= self.goal if self.higher_is_better else self.measured <= self.goal

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "setting": self.setting,
            "measured": self.measured,
            "goal": self.goal,
            "higher_is_better": self.higher_is_better,
            "unit": self.unit,
            "note": self.note,
            "group": self.group,
            "met": self.met,
        }


# -- the facts the targets rest on -----------------------------------------------------------------


def effect_bound(floor_per_s: float | None, http_per_s: float | None) -> float | None:
    """Effects/s if an effect cost nothing but two floor commits and one raw HTTP call."""
    if not floor_per_s or not http_per_s or floor_per_s <= 0 or http_per_s <= 0:
        return None
    return 1 / (2 / floor_per_s + 1 / http_per_s)


def same_durability(ours: dict[str, str] | None, floor: dict[str, str] | None) -> bool | None:
    """Whether safepoint's connections and the floor's committed with the same settings (every
    setting both read back; ``None`` when either side read nothing)."""
    if not ours or not floor:
        return None
    shared = set(ours) & set(floor)
    if not shared:
        return None
    return all(ours[key].upper() == floor[key].upper() for key in shared)


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return found


def replay_baseline(baseline: dict[str, Any], backend: str, replayed: float | None) -> float | None:
    """W4's recorded steps per CPU second at the baseline, for a resume that replays as many steps
    (the fixed cost of opening and claiming weighs less the more steps follow it)."""
    if replayed is None:
        return None
    entry = baseline.get("w4_replay_cpu_steps_per_s", {}).get("by_backend", {}).get(backend, {})
    found = entry.get(str(round(replayed)))
    return float(found) if isinstance(found, int | float) else None


def durability_note(run: Measured, setting: str) -> str:
    """What the floor ratio's two sides ran with, read back from their connections."""
    key = run.floor_key(setting, SP)
    ours = run.raw(setting, SP, "w1", "durable_ran_with")
    floor = run.raw(setting, "floor", "w0", "ran_with", key) if key else None
    same = same_durability(ours, floor)
    if same is None:
        return "settings not read back"
    text = ", ".join(f"{k}={v}" for k, v in sorted(ours.items()))
    return f"both ran with {text}" if same else f"NOT the same: safepoint {ours}, floor {floor}"


# -- the targets ----------------------------------------------------------------------------------


def targets(run: Measured, baseline: dict[str, Any] | None = None) -> list[Target]:
    baseline = load_baseline() if baseline is None else baseline
    return issue16(run, baseline) + standing(run)


def issue16(run: Measured, baseline: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for setting in run.settings:
        backend, mode = setting.split("/")
        if mode == "defaults":
            out.append(
                Target(
                    "W1 every step durable: safepoint/DBOS steps/s",
                    setting,
                    run.ratio(setting, (SP, "w1", "durable_steps_per_s"), ("dbos", "w1", "steps_per_s")),
                    25 if backend == "sqlite" else 6,
                    note="each as its documentation sets it up",
                )
            )
        else:
            out.append(
                Target(
                    "W1 every step durable: of the commit floor",
                    setting,
                    run.ratio(setting, (SP, "w1", "durable_steps_per_s"), ("floor", SP)),
                    0.6,
                    unit="%",
                    note=durability_note(run, setting),
                )
            )
    for setting in run.settings:
        out.append(
            Target(
                "W5 effects/s of its bound (2 floor commits + 1 raw HTTP call)",
                setting,
                run.ratio(setting, (SP, "w5", "effects_per_s"), ("w5_bound", SP)),
                0.6,
                unit="%",
            )
        )
    for setting in run.settings:
        backend = setting.split("/")[0]
        replayed = run.median(setting, SP, "w4", "replayed")
        before = replay_baseline(baseline, backend, replayed)
        rate = run.median(setting, SP, "w4", "replay_cpu_steps_per_s")
        out.append(
            Target(
                "W4 replay, recorded steps per CPU second, over the baseline",
                setting,
                rate / before if rate is not None and before else None,
                2,
                note=(
                    f"{_n(rate)}/s against {_n(before)}/s at"
                    f" {baseline['w4_replay_cpu_steps_per_s']['commit']}"
                    if before
                    else f"no baseline for {_n(replayed)} replayed steps on {backend}"
                ),
            )
        )
    for setting in run.settings:
        for sdk, label in (("anthropic", "Anthropic Messages"), ("openai", "OpenAI Chat Completions")):
            out.append(
                Target(
                    f"W6 a recorded model turn over the raw SDK call, {label}",
                    setting,
                    run.median(setting, SP, "w6", sdk, "overhead_ms"),
                    None,
                    unit="ms",
                    note=f"CPU time: {_n(run.median(setting, SP, 'w6', sdk, 'overhead_cpu_ms'), 2)} ms",
                )
            )
    for setting in run.settings:
        turns = _n(run.median(setting, SP, "w7", "turns"))
        out.append(
            Target(
                f"W7 {turns}-turn loop, safepoint's own per-turn cost (CPU), turn {turns} over turn 2",
                setting,
                run.ratio(
                    setting,
                    (SP, "w7", "cpu", "overhead_last_ms"),
                    (SP, "w7", "cpu", "overhead_first_ms"),
                ),
                1.1,
                higher_is_better=False,
                note=(
                    "the whole turn: "
                    f"{_n(run.median(setting, SP, 'w7', 'cpu', 'last_over_first'), 2)}, the raw SDK's"
                    f" {_n(run.median(setting, SP, 'w7', 'cpu', 'raw_last_over_first'), 2)}"
                ),
            )
        )
    return out


def standing(run: Measured) -> list[Target]:
    """The earlier goals, in every setting they were set for."""
    out: list[Target] = []
    for setting in run.settings:
        backend, mode = setting.split("/")

        def add(name: str, measured: float | None, goal: float, better: bool = True, unit: str = "x") -> None:
            out.append(Target(name, setting, measured, goal, better, unit, group="standing"))  # noqa: B023

        if mode == "defaults":
            add(
                "W1 safepoint/DBOS steps/s",
                run.ratio(setting, (SP, "w1", "steps_per_s"), ("dbos", "w1", "steps_per_s")),
                20 if backend == "sqlite" else 4,
            )
        else:
            add(
                "W1 safepoint steps/s of its floor",
                run.ratio(setting, (SP, "w1", "steps_per_s"), ("floor", SP)),
                0.5 if backend == "sqlite" else 0.6,
                unit="%",
            )
        add("W2 per-step cost, last/first", run.median(setting, SP, "w2", "last_over_first"), 1.1, False)
        add("W2 storage growth (1 = linear)", run.median(setting, SP, "w2", "growth"), 1.25, False)
        add(
            "W3 safepoint/DBOS steps/s",
            run.ratio(setting, (SP, "w3", "steps_per_s"), ("dbos", "w3", "steps_per_s")),
            4,
        )
        add(
            "W4 safepoint/DBOS recovery wall time",
            run.ratio(setting, (SP, "w4", "recover_s"), ("dbos", "w4", "recover_s")),
            0.2,
            False,
        )
        add(
            "W4 replayed steps/s (wall time)",
            run.median(setting, SP, "w4", "replay_steps_per_s"),
            20000,
            unit="/s",
        )
    return out


# -- Markdown -------------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def shown(value: float | None, unit: str) -> str:
    """A measured value or a threshold as the table shows it."""
    if value is None or math.isnan(value):
        return "-"
    if unit == "%":
        return f"{value * 100:.0f}%"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "/s":
        return f"{_n(value)}/s"
    return f"{value:.2f}x" if abs(value) < 10 else f"{value:.1f}x"


def threshold(target: Target) -> str:
    if target.goal is None:
        return "reported"
    return f"{'≥' if target.higher_is_better else '≤'} {shown(target.goal, target.unit)}"


def table(found: list[Target]) -> list[str]:
    lines = ["| target | setting | measured | threshold | met? | note |", "|---|---|---|---|---|---|"]
    for target in found:
        met = {True: "yes", False: "**no**", None: "-"}[target.met]
        lines.append(
            f"| {target.name} | {target.setting} | {shown(target.measured, target.unit)}"
            f" | {threshold(target)} | {met} | {target.note} |"
        )
    return lines


def tables(run: Measured, baseline: dict[str, Any] | None = None) -> list[str]:
    found = targets(run, baseline)
    return [
        "### Targets",
        "",
        *table([t for t in found if t.group == "targets"]),
        "",
        "### Standing targets (earlier goals, still held)",
        "",
        *table([t for t in found if t.group == "standing"]),
        "",
    ]
