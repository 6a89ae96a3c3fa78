"""The store conformance suite on SQLite — the whole suite on a fresh file per test; in memory and
on one file shared by every test, the tests of what those set-ups change — and the checks that
each conformance test declares what it exercises."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from safepoint.storage import Store, open_store
from safepoint.testing.conformance import (
    ACROSS_RUNS,
    CLAIMS,
    CONCERNS,
    CONCURRENCY,
    VALUES,
    StoreConformance,
    exercises,
)
from safepoint.testing.conformance._concerns import concerns_of


class TestSqliteFile(StoreConformance):
    """Every call opens a new store object on the test's file, as separate processes would."""

    def make_store(self) -> Store:
        return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}")


class TestSqliteMemory(StoreConformance):
    """An in-memory database lives in one store object, so the test shares it between threads
    (each thread gets its own connection to it). Its SQL is the file's; what differs is the
    locking — the store's own lock takes turns, not SQLite's file locks — so it runs the tests
    of two things at once."""

    changes = frozenset({CONCURRENCY})
    _store: Store | None = None

    def make_store(self) -> Store:
        if self._store is None:
            self._store = open_store("memory:")
        return self._store


@pytest.fixture(scope="module")
def shared_ledger(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('shared') / 'ledger.db'}"


class TestSqliteSharedFile(StoreConformance):
    """One file for every test of the class: SQLite's statements that read across runs (lists,
    claims of any run, prune, artifacts shared by digest) never assume an empty store. (The
    PostgreSQL set-ups run the whole suite on one shared database: every test keeps to its own
    runs.)"""

    changes = frozenset({CLAIMS, ACROSS_RUNS})

    @pytest.fixture(autouse=True)
    def _shared(self, shared_ledger: str) -> None:
        self.url = shared_ledger

    def make_store(self) -> Store:
        return open_store(self.url)


# -- what each test declares it exercises ----------------------------------------------------

# A name a test (or a helper it calls) uses, and what using it exercises: each is something a
# second set-up changes, so a test that uses it must declare it.
SHOWN_BY = {
    "claim_next": {CLAIMS},
    "list_runs": {ACROSS_RUNS},
    "query_runs": {ACROSS_RUNS},
    "prune_runs": {ACROSS_RUNS},
    "get_artifact": {ACROSS_RUNS},  # artifacts are stored once per digest, for every run
    "LARGE": {ACROSS_RUNS},  # a value that large is an artifact
    "wait_for_work": {ACROSS_RUNS, CONCURRENCY},
    "in_threads": {CONCURRENCY},
    "Thread": {CONCURRENCY},
    "Timer": {CONCURRENCY},
}


def _names(function: Callable[..., Any], seen: set[str]) -> set[str]:
    """Every name and attribute ``function`` uses, and those of the suite's helpers it calls."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            helper = getattr(StoreConformance, node.attr, None)
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr not in seen:
                seen.add(node.attr)
                if inspect.isfunction(helper) and helper.__module__.startswith("safepoint.testing"):
                    names |= _names(helper, seen)
    return names


def _tests(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: getattr(cls, name)
        for name in dir(cls)
        if name.startswith("test_") and callable(getattr(cls, name))
    }


def test_every_conformance_test_declares_what_it_uses_that_a_set_up_changes() -> None:
    undeclared = {}
    for name, test in _tests(StoreConformance).items():
        shown = set().union(*(SHOWN_BY.get(used, set()) for used in _names(test, set())))
        if missing := shown - concerns_of(test):
            undeclared[name] = sorted(missing)
    assert not undeclared, f"declare these with @exercises(...): {undeclared}"


def test_a_set_up_runs_the_tests_of_what_it_changes_and_the_default_runs_everything() -> None:
    everything = _tests(StoreConformance)
    assert len(everything) > 150
    assert all(concerns_of(test) <= CONCERNS for test in everything.values())

    class Claims(StoreConformance):
        changes = frozenset({CLAIMS})

        def make_store(self) -> Store:
            raise NotImplementedError

    kept = _tests(Claims)
    assert set(kept) == {name for name, test in everything.items() if CLAIMS in concerns_of(test)}
    assert "test_claim_next_takes_runnable_runs_of_its_workflows_oldest_first" in kept
    assert "test_claim_run_is_a_compare_and_set_on_the_revision" not in kept
    # a test that declares nothing exercises VALUES: it runs under every codec
    assert concerns_of(StoreConformance.test_finish_run_failed_records_the_error) == {VALUES}
    with pytest.raises(ValueError, match="name concerns"):
        exercises("claim")
    with pytest.raises(ValueError, match="name concerns"):
        type("Nothing", (StoreConformance,), {"changes": frozenset()})
