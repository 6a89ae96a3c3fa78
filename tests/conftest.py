from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The conformance suite's asserts live in the package: have pytest rewrite them so a failure
# shows both sides.
pytest.register_assert_rewrite("safepoint.testing.conformance")

import safepoint as sp  # noqa: E402
from safepoint import _crashpoints  # noqa: E402
from safepoint.testing.owner import OwnerService  # noqa: E402

TESTS = str(Path(__file__).parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


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
    """Arm an in-process crash point that raises SimulatedCrash instead of killing pytest."""
    def arm(spec: str | None) -> None:
        _crashpoints.arm(spec, mode="raise")
    yield arm
    _crashpoints.arm(None)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh store for tests that run on every store (SQLite file here)."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"
