"""Pruning finished runs from the command line (``safepoint prune``), on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.ops.cli import cli

_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "SAFEPOINT_URL": None}

remembered = sp.Effect(
    "prune-ops.mail", execute=lambda payload, key: {"id": "m-1"}, dedup_retention=timedelta(hours=23)
)


@sp.workflow("prune-ops-note")
def note(run: sp.Run, text: str) -> str:
    return run.pure("upper", text.upper)


@sp.workflow("prune-ops-mail")
def mail(run: sp.Run, to: str) -> dict[str, str]:
    return run.effect("mail", remembered, payload={"to": to}, operation_id="mail")


def _invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", url, *args], env=_PLAIN_ENV, catch_exceptions=False)


@pytest.fixture
def opened(store_url: str) -> Iterator[sp.Store]:
    store = sp.open_store(store_url)
    sp.start(store, note, "a", run_id="note-1")
    sp.start(store, note, "b", run_id="note-2")
    sp.start(store, mail, "ana@example.org", run_id="mail-1")
    sp.submit(store, note, "c", run_id="note-pending")
    time.sleep(0.01)
    yield store
    store.close()


def test_a_dry_run_prints_what_would_go_and_deletes_nothing(store_url: str, opened: sp.Store) -> None:
    done = _invoke(store_url, "prune", "--older-than", "0s", "--dry-run")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("would prune 2 runs finished before ")
    assert "  rows: 0 approvals, 0 messages, 0 attempts, 2 steps, 0 operations," in done.output
    assert "  runs: note-1, note-2\n" in done.output
    assert (
        "kept 1 chain:\n  mail-1: operation 'mail' of run 'mail-1' is inside its owner's dedup retention"
        in (done.output)
    )
    assert "1 of them only because an effect's owner may still remember a key: --force" in done.output
    assert [run.run_id for run in opened.list_runs(None, 10)].count("note-1") == 1


def test_a_prune_deletes_the_finished_runs_and_force_the_remembered_one(
    store_url: str, opened: sp.Store
) -> None:
    done = _invoke(store_url, "prune", "--older-than", "0s", "--status", "completed")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("pruned 2 runs finished before ")
    left = {run.run_id for run in opened.list_runs(None, 10)}
    assert left == {"mail-1", "note-pending"}
    forced = _invoke(store_url, "prune", "--older-than", "0s", "--force")
    assert forced.exit_code == 0, forced.output
    assert "  runs: mail-1\n" in forced.output
    assert {run.run_id for run in opened.list_runs(None, 10)} == {"note-pending"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "--older-than DURATION (30d) or --before WHEN"),
        (
            ("--older-than", "1d", "--before", "2030-01-01T00:00:00Z"),
            "--older-than DURATION (30d) or --before WHEN",
        ),
        (("--older-than", "soon"), "is no duration"),
        (("--before", "2h"), "is a duration: give an instant here"),
        (("--before", "2030-01-01T00:00:00"), "ISO 8601 instant with a time zone"),
        (("--older-than", "1d", "--status", "continued"), "'continued' is not one of"),
        (("--older-than", "1d", "--batch", "0"), "runs per transaction, from 1 to 10000"),
    ],
)
def test_a_prune_that_cannot_be_done_says_what_to_give(
    store_url: str, opened: sp.Store, args: tuple[str, ...], said: str
) -> None:
    done = _invoke(store_url, "prune", *args)
    assert done.exit_code != 0
    assert said in done.output
    assert len(opened.list_runs(None, 10)) == 4
