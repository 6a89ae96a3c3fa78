from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

# The conformance suite's asserts live in the package: have pytest rewrite them so a failure
# shows both sides.
pytest.register_assert_rewrite("safepoint.testing.conformance")

import safepoint as sp  # noqa: E402
from safepoint import testing  # noqa: E402
from safepoint.testing import OwnerService  # noqa: E402

TESTS = str(Path(__file__).parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from postgres_server import SERVER, with_database  # noqa: E402

# The Citus tests run against a cluster someone set up, named by $SAFEPOINT_TEST_CITUS: opt-in,
# outside `make test` (docs/development.md, "A Citus cluster"), and not collected without it.
collect_ignore = [] if os.environ.get("SAFEPOINT_TEST_CITUS") else ["citus"]


@pytest.fixture
def memory_store() -> Iterator[sp.Store]:
    """Fast unit tests only: an in-memory ledger survives nothing."""
    store = sp.open_store("memory:")
    yield store
    store.close()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[sp.Store]:
    store = sp.open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield store
    store.close()


@pytest.fixture(scope="session")
def owner() -> Iterator[OwnerService]:
    """The local effect owner, a real process reached over HTTP on loopback."""
    with OwnerService() as service:
        yield service


@pytest.fixture
def owner_env(owner: OwnerService, monkeypatch: pytest.MonkeyPatch) -> OwnerService:
    owner.client.reset()
    monkeypatch.setenv("SAFEPOINT_OWNER_URL", owner.url)
    return owner


@pytest.fixture
def crash_at() -> Iterator[object]:
    """Arm an in-process crash point that raises SimulatedCrash instead of killing pytest:
    ``crash_at(spec)`` arms one (disarming the one before), ``crash_at(None)`` disarms."""
    armed = ExitStack()

    def arm(spec: str | None) -> None:
        armed.close()
        if spec:
            armed.enter_context(testing.crash_at(spec))

    yield arm
    armed.close()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A PostgreSQL database of this test session's own, dropped at the end. Skipped (with the
    reason printed) when no server answers — except under CI, where that is a failure."""
    try:
        import psycopg
        from psycopg import sql
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("psycopg is not installed: pip install 'safepoint[postgres]'")
    try:
        admin = psycopg.connect(SERVER, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        reason = f"PostgreSQL is unreachable at {SERVER} ({' '.join(str(exc).split())})"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this is a failure, not a skip")
        print(f"\nskipping the PostgreSQL tests: {reason}")
        pytest.skip(reason)
    name = f"safepoint_test_{uuid.uuid4().hex}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(SERVER, name)
    finally:
        # a fresh connection: a test may have restarted the server under the first one
        with psycopg.connect(SERVER, autocommit=True, connect_timeout=10) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store, once per kind: the tests that take it run on every store."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    base = request.getfixturevalue("pg_url")
    return f"{base}?schema=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(store_url: str) -> Iterator[sp.Store]:
    """A fresh store of each kind (SQLite file, PostgreSQL), closed at the end."""
    opened = sp.open_store(store_url)
    yield opened
    opened.close()


# The files that take longest, longest first: under ``--dist loadfile`` a file is one unit of
# work, and one begun last would keep a single core busy after the rest are done. (Measured with
# ``--durations``; a file not named here keeps its place after them.)
LONGEST_FIRST = (
    "simulation/test_explore_budget.py",
    "kill/test_claude_agent_kill.py",
    "kill/test_soak.py",
    "kill/test_ownership.py",
    "docs/test_docs.py",
    "simulation/test_simulator_postgres.py",
    "kill/test_pydantic_ai_kill.py",
    "integrations/test_mcp_stdio.py",
    "kill/test_slices_kill.py",
    "kill/test_fork_kill.py",
)


# Files whose tests are independent parts, each worth a process of its own: under ``--dist
# loadfile`` they are shared out test by test instead of running one after another in one.
SPREAD = (
    "tests/simulation/test_explore_budget.py",
    "tests/kill/test_claude_agent_kill.py",
    "tests/kill/test_soak.py",
)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a plain pytest run has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but a test of a ``SPREAD`` file is a unit of work of its own, and
    units go out in the collection's order (``LONGEST_FIRST``), not by how many tests each holds:
    xdist's default would send a one-test file of minutes last."""
    if config.getoption("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadFileScheduling

    class SpreadingSome(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(SPREAD) else super()._split_scope(nodeid)

    return SpreadingSome(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what the fast tier leaves out: everything under tests/kill kills real processes
    (``kill``); a test that reaches the PostgreSQL server (``postgres``) takes ``pg_url``, or is
    the "postgres" case (or "<variant>-postgres") of a parameter naming the store: ``store_url``
    and the kill harnesses ask for ``pg_url`` only once the case runs. Then put the longest
    files first (``LONGEST_FIRST``)."""
    rank = {str(Path(TESTS) / name): index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))
    kill_dir = Path(TESTS) / "kill"
    for item in items:
        if kill_dir in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.kill)
        callspec = getattr(item, "callspec", None)
        by_store = callspec is not None and any(
            isinstance(value, str) and (value == "postgres" or value.endswith("-postgres"))
            for value in callspec.params.values()
        )
        if by_store or "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three test processes per two cores. Much of the suite waits rather than
    computes (on the processes a kill trial starts and kills, on sockets, on the database):
    measured on two cores, two processes kept 1.3 of them busy (``make test``: 10.1 minutes),
    three kept them busy (7.8 minutes)."""
    return max(2, len(os.sched_getaffinity(0)) * 3 // 2)
