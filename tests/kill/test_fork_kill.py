"""A fork's worker killed with SIGKILL in its tail — after a read, around the dispatch of an
operation the operator named in ``resend`` — and the fork resumed in a fresh process: it ends
as an uninterrupted fork would, its source's effects never sent again and the named one sent
once, under the fork's key, as the effect owner counts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import safepoint as sp
from safepoint._rules.effects import mint_effect_key
from safepoint.testing import OwnerService, run_child

pytestmark = pytest.mark.kill

# The workflow, as a module the child processes import: five reads and five tickets.
FLOW = """
import safepoint as sp
from safepoint.testing import owner_effect

tickets = owner_effect("tickets")


def look(case, index):
    return {"case": case, "index": index}


@sp.workflow("fork-kill")
def support(run, case):
    made = []
    for index in range(5):
        seen = run.read(f"read.{index}", look, case, index)
        made.append(run.effect(f"ticket.{index}", tickets, payload=seen)["id"])
    return made
"""


@pytest.mark.parametrize(
    "crash_at",
    [
        "step.after_record:read.3",  # in the tail, before it reaches the source's ticket.3
        "effect.after_dispatching:ticket.4",  # the named operation may have gone out
        "effect.after_receiver_commit:ticket.4",  # the owner has it; the fork never heard
    ],
)
def test_a_fork_killed_in_its_tail_sends_nothing_twice(
    store_url: str, owner_env: OwnerService, tmp_path: Path, crash_at: str
) -> None:
    module = f"fork_kill_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FLOW)
    child = {"owner_url": owner_env.url, "pythonpath": [str(tmp_path)], "store_url": store_url}
    source = run_child(f"{module}:support", run_id="source", args=["case-1"], **child)  # type: ignore[arg-type]
    assert source.outcome is not None
    made = source.outcome["result"]
    assert owner_env.client.stats()["applied"] == 5

    store = sp.open_store(store_url)
    try:
        fork = sp.fork(store, "source", from_step="read.3", new_run_id="fork", resend=["ticket.4"], by="ana")
        killed = run_child(f"{module}:support", run_id=fork.run_id, resume=True, crash_at=crash_at, **child)  # type: ignore[arg-type]
        assert killed.killed, killed.stderr[-2000:]
        resumed = run_child(f"{module}:support", run_id=fork.run_id, resume=True, **child)  # type: ignore[arg-type]
        assert resumed.outcome is not None, resumed.stderr[-2000:]
        assert resumed.outcome["status"] == "completed", resumed.outcome
        again = resumed.outcome["result"]
        assert again[:4] == made[:4]  # ticket.3 is the source's: not sent again
        assert again[4] != made[4]
        stats = owner_env.client.stats()
        assert (stats["applied"], stats["duplicates"]) == (6, 1)  # ticket.4 once more, as named
        key = mint_effect_key(store.identity.ledger_id, "fork", "ticket.4")
        assert [obj["id"] for obj in owner_env.client.find_all_by_key("tickets", key)] == [again[4]]
        assert store.load_ledger("fork").operations["ticket.4"].effect_key == key
    finally:
        store.close()
