"""What a transaction step's function may not send: the statements that begin or end a
transaction, by their first word (``_rules.transactions``)."""

from __future__ import annotations

import pytest

from safepoint._rules.transactions import misused, transaction_control


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
