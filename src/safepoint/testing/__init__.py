"""Tools to prove your own workflows survive a crash: crash points, the kill harness, the local
effect owner, and the store conformance suite.

Kill-test a workflow (importable as ``myapp.flows:checkout``, its effects sent to the local
owner with ``owner_effect``) at every crash point, in real processes killed by SIGKILL::

    from safepoint.testing import CRASH_POINTS, KillHarness, OwnerService

    def test_checkout_survives_every_crash(tmp_path):
        with OwnerService() as owner:
            harness = KillHarness("myapp.flows:checkout", ["order-1"], owner=owner,
                                  workdir=tmp_path)
            for point in CRASH_POINTS:
                harness.trial(crash_at=point).check()

Each trial kills one run where the point is reached (``report.killed`` says whether it was),
resumes it in fresh processes until it ends, and checks it against an uninterrupted run: the
same result, and the same effects applied, counted by the owner itself (so none twice).

In one process, for a fast test, ``crash_at`` raises ``SimulatedCrash`` at the point instead;
catch it and resume the run, as a new worker would (``lease_ms=0``: the crashed worker is this
very process, alive, and its lease must not make the resume wait for it)::

    with crash_at("effect.after_dispatching"), pytest.raises(SimulatedCrash):
        safepoint.start(store, checkout, "order-1", run_id="r1", lease_ms=0)
    assert safepoint.resume(store, "r1") == expected

A crash point is named as in ``CRASH_POINTS`` (every durability boundary, in protocol order),
optionally narrowed: ``point:prefix`` only at step ids starting ``prefix``, ``point@n`` the
``n``-th time it is reached. The same spec arms a child process (``crash_at=`` of
``KillHarness.trial``, ``run_child`` and ``spawn_child``, or ``$SAFEPOINT_CRASH_AT``).

- ``CRASH_POINTS``, ``crash_at``, ``SimulatedCrash`` — the named crash points;
- ``KillHarness``, ``KillReport`` — kill trials of one workflow; ``run_child``, ``spawn_child``,
  ``child_outcome``, ``ChildOutcome`` — one run in a child process, for kills of your own;
- ``OwnerService``, ``OwnerClient``, ``owner_effect``, ``owner_client`` and the ``Owner…``
  errors — a real HTTP effect owner with idempotency keys that counts what it applied (effects
  reach it at ``$SAFEPOINT_OWNER_URL``);
- ``FakeModelServer``, ``Turn``, ``FakeRequest`` — a fake of the Anthropic and OpenAI model APIs
  that the real SDK clients talk to over HTTP, answering from a script, with faults to inject;
- ``StoreConformance``, ``SyncOverAsync`` — the suite that defines a correct store (needs pytest);
- ``replay``, ``replay_file``, ``check_deploy`` (and ``ReplayReport``, ``DeployCheck``) — run
  your current code against what a recorded run (or a run file) recorded, offline, and say where
  it parts from the record and what a resume would do; or, with ``live_from=``, replay up to a
  step and run the rest against stubs, for evals (``replay_async``, ``replay_file_async`` from
  async code);
- ``simulate`` — explore thousands of interleavings of your workflows' runs with crashes,
  faults and people's actions on a virtual clock, checking that no effect is applied twice
  (``safepoint.testing.simulation`` holds its parts);
- ``forget_workflows`` — forget registered workflows, as a new process would not know them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._engine import crashpoints as _crashpoints
from .._engine.crashpoints import SimulatedCrash
from .._engine.workflow import forget_workflows

if TYPE_CHECKING:
    from .conformance import StoreConformance as StoreConformance
    from .effects import owner_client as owner_client
    from .effects import owner_effect as owner_effect
    from .fake_models import FakeModelServer as FakeModelServer
    from .fake_models import FakeRequest as FakeRequest
    from .fake_models import Turn as Turn
    from .kill import ChildOutcome as ChildOutcome
    from .kill import KillHarness as KillHarness
    from .kill import KillReport as KillReport
    from .kill import child_outcome as child_outcome
    from .kill import run_child as run_child
    from .kill import spawn_child as spawn_child
    from .owner import OwnerClient as OwnerClient
    from .owner import OwnerConnectionLost as OwnerConnectionLost
    from .owner import OwnerError as OwnerError
    from .owner import OwnerRejected as OwnerRejected
    from .owner import OwnerService as OwnerService
    from .owner import OwnerUnavailable as OwnerUnavailable
    from .replays import DeployCheck as DeployCheck
    from .replays import ReplayReport as ReplayReport
    from .replays import check_deploy as check_deploy
    from .replays import recorded as recorded
    from .replays import replay as replay
    from .replays import replay_async as replay_async
    from .replays import replay_file as replay_file
    from .replays import replay_file_async as replay_file_async
    from .replays import replay_recorded as replay_recorded
    from .simulation import simulate as simulate
    from .sync_over_async import SyncOverAsync as SyncOverAsync

__all__ = [
    "CRASH_POINTS",
    "ChildOutcome",
    "DeployCheck",
    "FakeModelServer",
    "FakeRequest",
    "KillHarness",
    "KillReport",
    "OwnerClient",
    "OwnerConnectionLost",
    "OwnerError",
    "OwnerRejected",
    "OwnerService",
    "OwnerUnavailable",
    "ReplayReport",
    "SimulatedCrash",
    "StoreConformance",
    "SyncOverAsync",
    "Turn",
    "check_deploy",
    "child_outcome",
    "crash_at",
    "forget_workflows",
    "owner_client",
    "owner_effect",
    "recorded",
    "replay",
    "replay_async",
    "replay_file",
    "replay_file_async",
    "replay_recorded",
    "run_child",
    "simulate",
    "spawn_child",
]

CRASH_POINTS = _crashpoints.POINTS

# Loaded when first asked for: every child process a kill test starts imports this package, and
# the conformance suite needs pytest, which running a workflow never should.
_LOADED_LATER = {
    "StoreConformance": "conformance",
    "SyncOverAsync": "sync_over_async",
    "owner_client": "effects",
    "owner_effect": "effects",
    "FakeModelServer": "fake_models",
    "FakeRequest": "fake_models",
    "Turn": "fake_models",
    "ChildOutcome": "kill",
    "KillHarness": "kill",
    "KillReport": "kill",
    "child_outcome": "kill",
    "run_child": "kill",
    "spawn_child": "kill",
    "OwnerClient": "owner",
    "OwnerConnectionLost": "owner",
    "OwnerError": "owner",
    "OwnerRejected": "owner",
    "OwnerService": "owner",
    "OwnerUnavailable": "owner",
    "simulate": "simulation",
    "DeployCheck": "replays",
    "ReplayReport": "replays",
    "check_deploy": "replays",
    "recorded": "replays",
    "replay": "replays",
    "replay_async": "replays",
    "replay_file": "replays",
    "replay_file_async": "replays",
    "replay_recorded": "replays",
}


def __getattr__(name: str) -> Any:
    if name not in _LOADED_LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LOADED_LATER[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


@contextmanager
def crash_at(point: str) -> Iterator[None]:
    """Arm the crash point ``point`` in this process for the ``with`` block: reaching it raises
    ``SimulatedCrash`` there, as SIGKILL would stop the process, for a fast in-process kill test.

    ``point`` is a name from ``CRASH_POINTS``, optionally narrowed (``point:step-id-prefix``,
    ``point@n`` for the ``n``-th time it is reached); an unknown name is a ``UsageError``.
    One point is armed at a time, and leaving the block disarms it, crash or not.
    """
    _crashpoints.arm(point, mode="raise")
    try:
        yield
    finally:
        _crashpoints.arm(None)
