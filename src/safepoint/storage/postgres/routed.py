"""The fenced writes of a ledger a distributed PostgreSQL shards by run (Citus,
``?distributed=citus``), as functions of the ledger carried out on the run's node.

A fenced write on plain PostgreSQL is one statement: the fence (an UPDATE of the runs row) and
the rows it writes, as data-modifying CTEs reading the run's id from the fence's. Citus cannot
send such a statement whole to the run's shard: it plans each CTE apart, copies the
intermediate results to every worker node and commits on all of them in two phases. So for a
distributed ledger such a statement has a *routed* form (``sql/postgres/citus.sql``, under the
same name): the body of a PL/pgSQL function with the statement's parameters, typed, and its
row's columns. ``distribute`` makes each function in the ledger's schema and distributes it
with the runs on its first parameter, the run's id; the executors of a distributed ledger call
it instead of the statement (``RoutedForm.call``, the same parameters). Citus delegates the call
to the node that holds the run's shard, where its statements write the run's shards as plain
tables (``safepoint_local_tables``, a function of the ledger made on every node: it names the
shards there, under the lock Citus's own writes take, and the distributed tables anywhere else)
and commit in one phase.

Measured on a two-node cluster (docs/scaling.md): a durable step's write as the one statement,
12-13x a step on plain PostgreSQL; as two statements about the run in one transaction, sent
from the client, 4.6-5.6x; as this function, 1.9-3.1x (medians 2.3x and 2.7x).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..plans import Queries

__all__ = ["Routed", "RoutedForm", "ledger_functions", "routed_statements"]


@dataclass(frozen=True, slots=True)
class RoutedForm:
    """A statement's routed form: a function of the ledger (see the module docstring)."""

    name: str
    body: str  # PL/pgSQL: declarations, BEGIN … END
    params: tuple[tuple[str, str], ...]  # (name, SQL type), the run's id first
    returns: tuple[tuple[str, str], ...] | str  # a row's columns, or one value's type
    routed: bool = True  # a statement's routed form; else a function the forms call

    @property
    def function(self) -> str:
        return f"safepoint_{self.name}"

    @property
    def signature(self) -> str:
        """The function as ``create_distributed_function`` names it: ``name(type, …)``."""
        return f"{self.function}({', '.join(kind.removeprefix('VARIADIC ') for _, kind in self.params)})"

    @property
    def source(self) -> str:
        """The function's source as the server keeps it (``pg_proc.prosrc``)."""
        return f"\n#variable_conflict use_column\n{self.body}\n"

    @property
    def ddl(self) -> str:
        arguments = ", ".join(_argument(name, kind) for name, kind in self.params)
        if isinstance(self.returns, str):
            returns = self.returns
        else:
            returns = f"TABLE ({', '.join(f'{name} {kind}' for name, kind in self.returns)})"
        return (
            f"CREATE OR REPLACE FUNCTION {self.function}({arguments}) RETURNS {returns}\n"
            f"LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn${self.source}$fn$"
        )

    @property
    def call(self) -> str:
        """The statement that calls the function with the plain statement's parameters."""
        given = ", ".join(f"%({name})s::{kind}" for name, kind in self.params)
        return f"SELECT * FROM {self.function}({given})"


Routed = Mapping[str, RoutedForm]  # a statement's text -> its routed form


def _argument(name: str, kind: str) -> str:
    """``p_name type`` (``VARIADIC p_name type[]`` for a ``VARIADIC type[]``)."""
    plain = kind.removeprefix("VARIADIC ")
    return f"{'VARIADIC ' if plain != kind else ''}p_{name} {plain}"


def _declared(head: str, field: str) -> tuple[tuple[str, str], ...] | str:
    """``-- params: a text, b bigint`` (continued on ``--   `` lines) as ((a, text), (b, bigint));
    ``-- returns: text[]``, a lone type, as itself."""
    found = re.search(rf"^-- {field}:(.*(?:\n--   .*)*)", head, flags=re.MULTILINE)
    if found is None:
        raise ValueError(f"citus.sql: a function declares no {field}:")
    text = " ".join(line.lstrip("- ") for line in found.group(1).splitlines())
    pairs = [item.strip().split(" ", 1) for item in text.split(",") if item.strip()]
    if len(pairs) == 1 and len(pairs[0]) == 1:
        return pairs[0][0]
    return tuple((name, kind) for name, kind in pairs)


@cache
def ledger_functions() -> tuple[RoutedForm, ...]:
    """Every function ``sql/postgres/citus.sql`` gives, in its order: the routed forms (``--
    name:``) and the functions they call (``-- function:``)."""
    text = resources.files("safepoint.storage").joinpath("sql", "postgres", "citus.sql").read_text("utf-8")
    found = []
    for block in re.split(r"^-- (?=name: |function: )", text, flags=re.MULTILINE)[1:]:
        first, _, rest = block.partition("\n")
        marker, _, name = first.partition(": ")
        lines = rest.splitlines()
        head = "\n".join(line for line in lines if line.startswith("--"))
        body = "\n".join(line for line in lines if not line.startswith("--")).strip()
        params = _declared(head, "params")
        if isinstance(params, str):
            raise ValueError(f"citus.sql: {name.strip()}'s params: name each")
        found.append(
            RoutedForm(name.strip(), body, params, _declared(head, "returns"), routed=marker == "name")
        )
    return tuple(found)


@cache
def routed_statements(queries: Queries) -> Routed:
    """The routed forms ``sql/postgres/citus.sql`` gives, by the text of the statement each
    stands for (``queries``: the dialect's, which must name each)."""
    return {queries.text[form.name]: form for form in ledger_functions() if form.routed}
