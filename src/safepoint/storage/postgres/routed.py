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
to the node that holds the run's shard, where its statements — each about that run — run
locally, planned once per connection, and commit in one phase.

Measured on a two-node cluster (docs/scaling.md): a durable step's write as the one statement,
12-13x a step on plain PostgreSQL; as two statements about the run in one transaction, sent
from the client, 4.6-5.6x; as this function, less.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..plans import Queries

__all__ = ["Routed", "RoutedForm", "routed_statements"]


@dataclass(frozen=True, slots=True)
class RoutedForm:
    """A statement's routed form: a function of the ledger (see the module docstring)."""

    name: str
    body: str  # PL/pgSQL: declarations, BEGIN … END
    params: tuple[tuple[str, str], ...]  # (name, SQL type), the run's id first
    returns: tuple[tuple[str, str], ...]

    @property
    def function(self) -> str:
        return f"safepoint_{self.name}"

    @property
    def signature(self) -> str:
        """The function as ``create_distributed_function`` names it: ``name(type, …)``."""
        return f"{self.function}({', '.join(kind for _, kind in self.params)})"

    @property
    def source(self) -> str:
        """The function's source as the server keeps it (``pg_proc.prosrc``)."""
        return f"\n#variable_conflict use_column\n{self.body}\n"

    @property
    def ddl(self) -> str:
        arguments = ", ".join(f"p_{name} {kind}" for name, kind in self.params)
        table = ", ".join(f"{name} {kind}" for name, kind in self.returns)
        return (
            f"CREATE OR REPLACE FUNCTION {self.function}({arguments}) RETURNS TABLE ({table})\n"
            f"LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn${self.source}$fn$"
        )

    @property
    def call(self) -> str:
        """The statement that calls the function with the plain statement's parameters."""
        given = ", ".join(f"%({name})s::{kind}" for name, kind in self.params)
        return f"SELECT * FROM {self.function}({given})"


Routed = Mapping[str, RoutedForm]  # a statement's text -> its routed form


def _declared(head: str, field: str) -> tuple[tuple[str, str], ...]:
    """``-- params: a text, b bigint`` (continued on ``--   `` lines) as ((a, text), (b, bigint))."""
    found = re.search(rf"^-- {field}:(.*(?:\n--   .*)*)", head, flags=re.MULTILINE)
    if found is None:
        raise ValueError(f"citus.sql: a routed form declares no {field}:")
    text = " ".join(line.lstrip("- ") for line in found.group(1).splitlines())
    pairs = [item.strip().split(" ", 1) for item in text.split(",") if item.strip()]
    return tuple((name, kind) for name, kind in pairs)


@cache
def routed_statements(queries: Queries) -> Routed:
    """The routed forms ``sql/postgres/citus.sql`` gives, by the text of the statement each
    stands for (``queries``: the dialect's, which must name each)."""
    text = resources.files("safepoint.storage").joinpath("sql", "postgres", "citus.sql").read_text("utf-8")
    routed: dict[str, RoutedForm] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, rest = block.partition("\n")
        lines = rest.splitlines()
        head = "\n".join(line for line in lines if line.startswith("--"))
        body = "\n".join(line for line in lines if not line.startswith("--")).strip()
        form = RoutedForm(name.strip(), body, _declared(head, "params"), _declared(head, "returns"))
        routed[queries.text[form.name]] = form
    return routed
