"""What a transaction step's function may not send — the statements that begin or end a
transaction, by their first word — and what the ledger concludes when the step's transaction
ended under it, or its connection was lost (``_rules.transactions``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from safepoint._rules.transactions import (
    RECONNECT_ATTEMPTS,
    is_lost_connection,
    is_uncertain,
    misused,
    reconnecting,
    transaction_control,
    uncertain_record,
)
from safepoint.errors import StoreUnavailable
from safepoint.types import Retry, StepKind, StepRecord, StepStatus


@pytest.mark.parametrize(
    ("query", "word"),
    [
        ("COMMIT", "COMMIT"),
        ("commit;", "COMMIT"),
        ("  -- done\n  Commit", "COMMIT"),
        ("/* all of it */ ROLLBACK", "ROLLBACK"),
        ("END", "END"),
        ("abort", "ABORT"),
        ("BEGIN", "BEGIN"),
        ("START TRANSACTION", "START"),
        ("PREPARE TRANSACTION 'x'", "PREPARE"),
    ],
)
def test_statements_that_end_or_begin_a_transaction_are_named(query: str, word: str) -> None:
    assert transaction_control(query) == word


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO orders (id) VALUES (?)",
        "SELECT 'COMMIT'",
        "ROLLBACK TO SAVEPOINT before_lines",
        "rollback to before_lines",
        "SAVEPOINT before_lines",
        "RELEASE SAVEPOINT before_lines",
        "PREPARE totals AS SELECT 1",
        "UPDATE commits SET n = n + 1",
        "",
        "-- only a comment",
    ],
)
def test_every_other_statement_passes(query: str) -> None:
    assert transaction_control(query) is None


def test_the_refusal_says_what_to_do_and_that_nothing_was_committed() -> None:
    error = misused("order.place", "sent COMMIT")
    assert error.step_id == "order.place"
    assert "return from the function instead, or raise to roll it back" in error.message
    assert error.message.endswith("Nothing of it was committed")


def _transaction_step() -> StepRecord:
    return StepRecord(
        run_id="r",
        step_id="order.place",
        kind=StepKind.TRANSACTION,
        name="place",
        input_hash="h",
        result=None,
    )


def test_a_step_recorded_as_uncertain_is_told_from_one_that_failed() -> None:
    uncertain = uncertain_record(_transaction_step(), "a commit of its own")
    assert (uncertain.status, uncertain.error) == (
        StepStatus.FAILED,
        {"type": "TransactionUncertain", "message": "a commit of its own"},
    )
    assert is_uncertain(uncertain)
    failed = replace(uncertain, error={"type": "ValueError", "message": "out of stock"})
    assert not is_uncertain(failed)
    assert not is_uncertain(replace(uncertain, kind=StepKind.READ))
    assert not is_uncertain(replace(uncertain, status=StepStatus.COMPLETED))


def test_a_lost_connection_is_tried_again_even_for_a_step_tried_once() -> None:
    once = reconnecting(Retry(attempts=1))
    assert (once.attempts, once.retry_on) == (RECONNECT_ATTEMPTS, (StoreUnavailable,))
    own = reconnecting(Retry(attempts=5, backoff=2.0, retry_on=(ValueError,)))
    assert (own.attempts, own.backoff, own.retry_on) == (5, 2.0, (StoreUnavailable,))
    assert is_lost_connection({"type": "StoreUnavailable", "message": "…"})
    assert not is_lost_connection({"type": "TransientFailure", "message": "…"})
    assert not is_lost_connection(None)
