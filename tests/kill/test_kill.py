"""The kill matrix: every crash point, for every step kind, in real processes killed by SIGKILL:
whole on one set-up, each point on one more (``sampled_matrix``).

Each trial resumes the killed run in a fresh process and checks both assertions of the kill
test against an uninterrupted reference run: equal results, and equal effect counts as counted
by the effect owner (so 0 duplicates).
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

import safepoint as sp
from safepoint.testing import KillHarness, OwnerService

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])

# (crash spec, what it interrupts). Step ids in flows.every_kind start with their kind.
STEP_KINDS = ("read", "model", "pure", "decision", "value")
MATRIX = [
    "run.after_start",
    *[f"{point}:{kind}" for point in ("step.before_record", "step.after_record") for kind in STEP_KINDS],
    *[
        f"{point}:effect.{step}"
        for point in (
            "effect.before_prepare",
            "effect.after_dispatching",
            "effect.after_receiver_commit",
            "effect.after_outcome",
            "effect.after_accept",
        )
        for step in ("charge", "ticket")
    ],
    *[f"{point}:transaction" for point in ("transaction.before_commit", "transaction.after_commit")],
    "run.before_complete",
]


@pytest.fixture(scope="module")
def kill_owner() -> OwnerService:
    with OwnerService() as service:
        yield service


# The set-ups the matrix runs on: a workflow and a store.
HARNESSES = {
    "sync-sqlite": ("flows:every_kind", "sqlite"),
    "async-sqlite": ("flows:every_kind_async", "sqlite"),
    "sync-postgres": ("flows:every_kind", "postgres"),
}
WHOLE = "sync-sqlite"  # the set-up the whole matrix runs on


def sampled_matrix() -> list[tuple[str, str]]:
    """(set-up, crash spec) of every trial: the whole matrix on ``WHOLE``; on the others, the
    points dealt out in turn (the first to the first other set-up, the second to the next, …),
    so that every point runs on two set-ups and every set-up meets every kind of point (the
    matrix lists each point once per step kind, and the kinds alternate). Deterministic: the
    same trials on every run, and a new point joins the deal where it stands."""
    others = [name for name in HARNESSES if name != WHOLE]
    return [(WHOLE, spec) for spec in MATRIX] + [
        (others[index % len(others)], spec) for index, spec in enumerate(MATRIX)
    ]


@pytest.fixture(scope="module")
def harness(
    request: pytest.FixtureRequest, kill_owner: OwnerService, tmp_path_factory: pytest.TempPathFactory
) -> KillHarness:
    workflow, store = HARNESSES[request.param]
    url = None  # SQLite: a fresh file per trial
    if store == "postgres":
        url = f"{request.getfixturevalue('pg_url')}?schema=kill_{uuid.uuid4().hex[:12]}"
    return KillHarness(
        workflow,
        ["case-8472"],
        owner=kill_owner,
        workdir=tmp_path_factory.mktemp("kill"),
        pythonpath=[TESTS],
        store_url=url,
    )


# A workflow that never continues as new cannot reach these: they are killed in
# tests/integration/test_history_and_continue_as_new.py.
CONTINUE_POINTS = {"run.before_continue", "run.after_continue"}
# The effects of flows.every_kind can be reconciled by their owner, within a dedup retention:
# each is prepared and dispatching in one commit, never stopping at "prepared" alone.
# test_kill_after_prepared kills there, with an effect whose owner has no read path.
PREPARED_POINT = "effect.after_prepared"


def test_matrix_covers_every_crash_point() -> None:
    from safepoint.testing import CRASH_POINTS

    assert {spec.split(":")[0] for spec in MATRIX} | {PREPARED_POINT} == (set(CRASH_POINTS) - CONTINUE_POINTS)


def test_the_sample_runs_every_point_twice_and_every_set_up_at_every_kind_of_point() -> None:
    trials = sampled_matrix()
    assert sorted(spec for _, spec in trials) == sorted(MATRIX * 2)
    for name in HARNESSES:
        run_here = {spec for setup, spec in trials if setup == name}
        assert {spec.split(":")[0] for spec in run_here} >= {"step.before_record", "step.after_record"}
        assert any(spec.startswith("effect.") for spec in run_here)
        assert any(spec.startswith("transaction.") for spec in run_here)


@pytest.mark.parametrize(("harness", "crash_at"), sampled_matrix(), indirect=["harness"])
def test_kill_at_crash_point(harness: KillHarness, crash_at: str) -> None:
    report = harness.trial(crash_at=crash_at)
    assert report.killed, f"the crash point {crash_at} was never reached"
    assert report.resumes >= 1
    report.check()


@pytest.mark.parametrize("harness", list(HARNESSES), indirect=True)
def test_reference_run_applies_two_effects(harness: KillHarness) -> None:
    reference, applied = harness.reference()
    assert reference["status"] == "completed"
    assert applied == 2


def random_kills(harness: KillHarness, seed: int, trials: int, latest: float) -> None:
    """SIGKILL from outside at random instants, with a slow owner to widen the windows."""
    rng = random.Random(seed)
    reports = [
        harness.trial(kill_after=rng.uniform(0.05, latest), owner_faults={"delay": 0.05})
        for _ in range(trials)
    ]
    for report in reports:
        report.check()
    assert any(report.killed for report in reports)


@pytest.mark.parametrize("harness", list(HARNESSES), indirect=True)
def test_kill_at_random_moments(harness: KillHarness) -> None:
    random_kills(harness, seed=8472, trials=6, latest=0.6)


def test_kill_in_a_loop_of_effects(kill_owner: OwnerService, tmp_path: Path) -> None:
    """The second occurrence of a repeated step id (effect.line#2) killed mid-dispatch."""
    harness = KillHarness("flows:lines", [3], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS])
    for spec in ("effect.after_dispatching@2", "effect.after_receiver_commit@3"):
        report = harness.trial(crash_at=spec)
        assert report.killed
        report.check()
    assert harness.reference()[0]["result"] == ["ch_1", "ch_2", "ch_3"]


@pytest.mark.parametrize(
    ("workflow", "store"),
    [("flows:notify", "sqlite"), ("flows:notify_async", "sqlite"), ("flows:notify", "postgres")],
    ids=["sync-sqlite", "async-sqlite", "sync-postgres"],
)
def test_kill_after_prepared(
    request: pytest.FixtureRequest, kill_owner: OwnerService, tmp_path: Path, workflow: str, store: str
) -> None:
    """Killed with the operation prepared, never dispatching: the resume dispatches it, once.
    (DESIGN §3: prepared, never dispatching → dispatch.) The effect has no reconcile, so
    "prepared" is a commit of its own: a crash after one commit of both would block the run."""
    url = None
    if store == "postgres":
        url = f"{request.getfixturevalue('pg_url')}?schema=kill_{uuid.uuid4().hex[:12]}"
    harness = KillHarness(
        workflow, ["ops@example.com"], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS], store_url=url
    )
    report = harness.trial(crash_at=f"{PREPARED_POINT}:effect.notify")
    assert report.killed, "the crash point was never reached"
    report.check()
    assert (report.applied, report.duplicates) == (1, 0)


def test_kill_after_one_commit_of_prepared_and_dispatching(kill_owner: OwnerService, tmp_path: Path) -> None:
    """SIGKILL after the one commit of "prepared" and "dispatching", before the call: the
    resume asks the owner, which has nothing under the key, and sends it once — under the
    same key (DESIGN §3: dispatching → reconcile → NotApplied → the same key)."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    harness = KillHarness(
        "flows:lines", [1], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS], store_url=url
    )
    report = harness.trial(crash_at="effect.after_dispatching")
    assert report.killed
    report.check()
    store = sp.open_store(url)
    try:
        [run] = [r for r in store.list_runs() if r.run_id.startswith("trial-")]
        op = store.load_ledger(run.run_id).operations["effect.line"]
        assert [(e.kind, e.fence) for e in store.events(run.run_id) if e.kind.startswith("effect.")] == [
            ("effect.prepared", 1),
            ("effect.dispatching", 1),  # one commit, then the kill
            ("effect.dispatching", 2),
            ("effect.accepted", 2),
        ]  # reconciled, sent once
        assert op.dispatch_count == 2
        assert kill_owner.client.find_by_key("charges", op.effect_key) == op.receipt
    finally:
        store.close()
    assert (report.applied, report.duplicates) == (1, 0)


def test_kill_in_a_loop_of_effects_sent_over_a_kept_connection(
    kill_owner: OwnerService, tmp_path: Path
) -> None:
    """As above, with the effect's client keeping its connection between effects (the
    benchmark's W5): killed at each boundary and at random instants, still 0 duplicates."""
    harness = KillHarness("flows:kept_lines", [4], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS])
    assert harness.reference()[0]["result"] == ["ch_1", "ch_2", "ch_3", "ch_4"]
    for spec in ("effect.after_dispatching@3", "effect.after_receiver_commit@2", "effect.after_outcome@3"):
        report = harness.trial(crash_at=spec)
        assert report.killed
        report.check()
    random_kills(harness, seed=4711, trials=3, latest=0.4)


@pytest.mark.parametrize("crash_at", ["effect.after_dispatching", "effect.after_receiver_commit"])
def test_no_read_path_blocks_visibly(kill_owner: OwnerService, tmp_path: Path, crash_at: str) -> None:
    """An owner with no read path cannot be reconciled: the run blocks, never re-sends."""
    harness = KillHarness(
        "flows:notify", ["ops@example.com"], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS]
    )
    report = harness.trial(crash_at=crash_at)
    assert report.killed
    assert report.final is not None
    assert report.final["status"] == "blocked"
    assert report.final["error"] == "NeedsReconciliation"
    record = report.final["record"]
    assert record["phase"] == "reconcile_effect"
    assert record["effect_status"] == "dispatching"
    assert record["effect_key"].startswith("sp_")
    expected = 1 if crash_at == "effect.after_receiver_commit" else 0
    assert (report.applied, report.duplicates) == (expected, 0)
