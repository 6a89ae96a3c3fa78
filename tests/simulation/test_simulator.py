"""The simulator itself: schedules replay exactly, faults happen where they are asked for,
failures are found and shrink, and every violation ever found stays fixed (``regressions.txt``).

The mutants below break the store on purpose — the family's claim on an operation, or on a
transaction step, never taken — to show that the simulator finds what such a break does within
a few schedules, as it must for every mechanism that keeps an effect once per family.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mutants import MUTANTS

import safepoint as sp
from safepoint.testing import simulate
from safepoint.testing.simulation import (
    Config,
    Faults,
    OwnerModel,
    decode,
    encode,
    explore,
    replay,
    run_schedule,
)

REGRESSIONS = Path(__file__).with_name("regressions.txt")


def _regressions() -> list[tuple[dict[str, str], str]]:
    kept = []
    for line in REGRESSIONS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            replayable, _, why = line.partition(" #")
            kept.append((dict(part.split("=", 1) for part in replayable.split()), why.strip()))
    return kept


@pytest.mark.parametrize(
    ("kept", "why"), _regressions(), ids=lambda v: v.get("seed") if isinstance(v, dict) else ""
)
def test_every_schedule_that_once_broke_an_invariant_holds_now(kept: dict[str, str], why: str) -> None:
    done = replay(seed=int(kept["seed"]))
    assert not done.violations, f"{why}\n{done.story()}"


@pytest.mark.parametrize(
    ("kept", "why"),
    [k for k in _regressions() if "mutant" in k[0]],
    ids=lambda v: v.get("mutant") if isinstance(v, dict) else "",
)
def test_every_kept_schedule_still_reaches_its_bug(kept: dict[str, str], why: str) -> None:
    """With the bug put back, the kept schedule breaks its rule again: a seed that no longer
    reaches it (the simulator draws otherwise now) is found again with the mutant."""
    with MUTANTS[kept["mutant"]]():
        done = replay(seed=int(kept["seed"]))
    rule = kept["rule"].replace("-", " ")
    assert any(v.rule == rule for v in done.violations), (
        f"seed {kept['seed']} no longer reaches its bug ({why}); find another:"
        f" .venv/bin/python tests/simulation/mutants.py find {kept['mutant']}"
    )


def test_the_same_seed_gives_the_same_ledger_and_the_same_story() -> None:
    first, again = replay(seed=20261206), replay(seed=20261206)
    assert first.ledger
    assert first.ledger == again.ledger
    assert [str(e) for e in first.events] == [str(e) for e in again.events]
    other = replay(seed=20261207)
    assert other.ledger != first.ledger


def test_a_tape_replays_the_schedule_its_seed_made() -> None:
    by_seed = replay(seed=77)
    by_tape = replay(tape=decode(encode(by_seed.tape)))
    assert by_tape.ledger == by_seed.ledger


def test_without_faults_or_people_every_run_completes_or_waits_for_a_person() -> None:
    config = Config(runs=4, faults=Faults.none(), person_every_ms=0)
    for seed in range(20):
        done = run_schedule(config, seed=seed, keep_ledger=True)
        assert not done.violations, done.violations
        assert not any("dies" in e.what or "lost" in e.what for e in done.events)


FAULTS = (
    "process dies",
    "answer lost",
    "fails before",
    "paused",
    "clock jumps",
    "owner rejects",
    "owner is slow",
)


def test_a_schedule_runs_the_same_on_a_sqlite_file(tmp_path: Path) -> None:
    in_memory = replay(seed=31)
    on_file = replay(Config(directory=tmp_path), seed=31)
    assert on_file.ledger == in_memory.ledger
    assert not list(tmp_path.iterdir())  # each schedule's file is gone with it


def test_faults_happen_at_every_kind_of_boundary() -> None:
    seen = {
        mark
        for seed in range(150)
        for event in run_schedule(Config(), seed=seed).events
        for mark in FAULTS
        if mark in event.what
    }
    assert seen == set(FAULTS)


def test_people_act_through_every_verb() -> None:
    said: set[str] = set()
    for seed in range(200):
        for event in run_schedule(Config(), seed=seed).events:
            if event.who == "person":
                said.add(event.what.split()[0])
    assert {"fork", "retry", "resolve", "send", "approve", "cancel", "prune", "extend_limits"} <= said, said


def test_the_simulator_finds_an_effect_sent_twice_when_the_family_claim_is_gone() -> None:
    with MUTANTS["effect-claims"]():
        report = explore(Config(), schedules=200, seed=1, shrink_seconds=20)
    assert report.failure is not None, "200 schedules of a store without family claims broke nothing"
    assert any(v.rule == "once per family" for v in report.failure.violations)
    assert report.shrunk is not None
    assert len(report.shrunk.tape) <= len(report.failure.tape)
    text = report.explain()
    assert f"SIM_SEED={report.failure.seed}" in text
    assert "owner applies" in text
    with MUTANTS["effect-claims"]():
        again = replay(seed=report.failure.seed)  # the seed gives the same failure
    assert {v.rule for v in again.violations} == {v.rule for v in report.failure.violations}


def test_the_simulator_finds_a_transaction_committed_twice_when_its_claim_is_gone() -> None:
    with MUTANTS["transaction-claims"]():
        report = explore(Config(workflows=("sim.order",)), schedules=300, seed=5, shrink_seconds=10)
    assert report.failure is not None
    assert any("transaction 0 book committed 2 times" in str(v) for v in report.failure.violations), (
        report.explain()
    )


def test_the_simulator_tells_families_apart_without_the_stores_word_for_it() -> None:
    """A mutant store that starts every successor a family of its own (so a fork of a chain's
    first run may send what the chain's successors sent): the simulator knows its runs'
    lineage itself, and finds the duplicate."""
    with MUTANTS["chain-family"]():
        report = explore(Config(workflows=("sim.chain",)), schedules=300, seed=9, shrink_seconds=5)
    assert report.failure is not None
    assert any(v.rule == "once per family" for v in report.failure.violations)


@sp.workflow("sim-user.checkout")
def checkout(run: sp.Run, order: str) -> str:
    """A user's workflow, as the simulate() guide shows it."""
    total = run.read("total", lambda o: 1200, order)
    run.effect("charge", CHARGE, payload={"order": order, "cents": total})
    run.transaction(
        "record", lambda tx, o: tx.execute("INSERT INTO orders (id) VALUES (?)", (o,)) and 1, order
    )
    return run.effect("receipt", MAIL, payload={"order": order})["id"]


def _never(*args: object) -> object:
    raise AssertionError("a simulation never calls an effect's own code")


CHARGE = sp.Effect("shop.charge", execute=_never, reconcile=_never)
MAIL = sp.Effect("shop.mail", execute=_never)


def test_a_users_workflow_is_simulated_against_a_model_of_its_owner() -> None:
    report = simulate(
        checkout,
        arguments=lambda name, n: (f"order-{n}",),
        schedules=60,
        seed=11,
        owner=OwnerModel(operation=lambda effect, payload: f"{effect}:{payload['order']}"),
        setup_sql=["CREATE TABLE orders (id TEXT NOT NULL)"],
    )
    report.check()
    assert report.schedules == 60
    assert report.requests > 60 * 20


def test_a_users_workflow_that_sends_twice_is_caught() -> None:
    with MUTANTS["effect-claims"]():
        report = simulate(
            checkout,
            arguments=lambda name, n: (f"order-{n}",),
            schedules=300,
            seed=3,
            setup_sql=["CREATE TABLE orders (id TEXT NOT NULL)"],
        )
    with pytest.raises(AssertionError, match="once per family"):
        report.check()


@sp.workflow("sim-user.constant")
def constant(run: sp.Run) -> str:
    """Every run sends the same payload: one business operation per run, not per schedule."""
    return str(run.effect("send", MAIL, payload={"what": "the same for all"})["id"])


def test_runs_of_different_families_may_send_the_same_payload() -> None:
    report = simulate(constant, runs=3, schedules=20, seed=1, faults=Faults.none(), people=False)
    report.check()


@sp.workflow("sim-user.async")
async def asynchronous(run: sp.AsyncRun) -> None:
    return None


def test_an_async_workflow_is_refused_not_left_unrun() -> None:
    with pytest.raises(ValueError, match="is async"):
        simulate(asynchronous, schedules=1, seed=1)
