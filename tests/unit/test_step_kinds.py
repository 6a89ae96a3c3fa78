"""A step kind is one row (``safepoint._rules.kinds.KINDS``): every kind has its row, and nothing
else decides what a step does by testing which kind it is — not the engine, not the stores, not
their SQL. (Making a step *of* a kind, or the wait mechanism recognising its own wait steps, is
not a policy question, and stays where it is.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import safepoint
from safepoint._rules.kinds import KEPT_ON_REPLAN, KINDS, MODEL_CALLS, WITH_OPERATION, kinds_where
from safepoint.storage.plans import load_queries
from safepoint.types import StepKind

PACKAGE = Path(safepoint.__file__).parent
# Where a comparison with one kind is the mechanism of that kind itself, not a policy: the
# answers of a wait recognise their wait step; the run page says when a pending wait times out.
KIND_TESTS_ALLOWED = {"_rules/answers.py", "ops/render.py", "_rules/kinds.py"}
# Statements that look up the rows of one kind's own mechanism (a transaction step's uncertain
# record, as `safepoint record` resolves it).
SQL_NAMING_ALLOWED = re.compile(r"transaction")


def test_every_kind_has_its_row() -> None:
    assert set(KINDS) == set(StepKind)


def test_what_must_hold_of_the_kinds_that_exist() -> None:
    """What the protocol stands on, whatever kinds are added: nothing that acted on the world
    or the ledger's database is abandoned by a re-plan; only an effect carries an operation;
    model calls are what the budgets count; the statements get exactly the rows' answers."""
    assert {"effect", "transaction"} <= set(KEPT_ON_REPLAN)
    assert WITH_OPERATION == ["effect"]
    assert "model" in MODEL_CALLS
    assert "effect" not in MODEL_CALLS
    assert not KINDS[StepKind.EFFECT].retried  # an effect has its own protocol
    for listed, question in (
        (KEPT_ON_REPLAN, lambda kind: kind.kept_on_replan),
        (WITH_OPERATION, lambda kind: kind.has_operation),
        (MODEL_CALLS, lambda kind: kind.model_call),
    ):
        assert listed == kinds_where(question)


def _kind_tests(tree: ast.AST) -> list[int]:
    """Lines comparing something with a ``StepKind`` member (``is``, ``==``, ``in (…)``)."""

    def names_kind(node: ast.AST) -> bool:
        return any(
            isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "StepKind"
            for sub in ast.walk(node)
        )

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(names_kind(side) for side in node.comparators)
    ]


def test_no_module_asks_which_kind_a_step_is() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in KIND_TESTS_ALLOWED or relative.startswith("testing/"):
            continue
        lines = _kind_tests(ast.parse(path.read_text("utf-8")))
        if lines:
            found[relative] = lines
    assert not found, f"ask KINDS[kind] (safepoint._rules.kinds) instead of testing the kind: {found}"


def test_no_statement_names_a_kind_to_decide() -> None:
    values = "|".join(kind.value for kind in StepKind)
    naming = re.compile(rf"\bkind\s*(=|<>|!=|IN|NOT IN)\s*\(?\s*'({values})'")
    found = [
        (dialect, name)
        for dialect in ("sqlite", "postgres")
        for name, text in load_queries(dialect).items()
        if naming.search(text) and not SQL_NAMING_ALLOWED.search(name)
    ]
    assert not found, f"give the statement the kinds as a parameter (kinds_where): {found}"
