"""The workloads, written the way a LangGraph user writes them: a ``StateGraph`` whose one node
loops on itself (a conditional edge) until the count is reached, compiled with a checkpointer
(``SqliteSaver`` / ``PostgresSaver``); a step is one super-step, checkpointed.

- W2: the state has ``messages: Annotated[list[str], operator.add]`` — the usual reducer for an
  agent's conversation — and each step appends one 200-byte message. LangGraph checkpoints the
  channels that changed, so each checkpoint holds the whole message list;
- W3 and W5 have no LangGraph counterpart (no queue of runs, no effect protocol);
- W4: the run is resumed with ``graph.invoke(None, config)`` from its last checkpoint.

Settings (looked up in langgraph 1.2 / checkpoint-sqlite 3.1 / checkpoint-postgres 3.2): the
graph's ``durability`` defaults to ``"async"`` (a step's checkpoint is written while the next step
runs); ``SqliteSaver.setup()`` sets ``journal_mode=WAL`` and leaves ``synchronous`` at SQLite's
default, ``FULL``; ``PostgresSaver`` sets no ``synchronous_commit`` (the server's, ``on``).
``equal`` runs with ``durability="sync"`` (the checkpoint is written before the next step starts)
and, on PostgreSQL, ``synchronous_commit=on`` on its connection explicitly.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

from .. import procs
from ..common import Database, Setting, Sizes, Stamps, fresh_database, growth
from .shared import chunk, probe_points, recovery_figures

WORKLOADS = ("w1", "w2", "w4")
STAMPS = Stamps()
PROBE: Callable[[int], None] | None = None
_KILL_AT = int(os.environ.get("BENCH_KILL_AT", "-1"))
_calls: list[tuple[int, float]] = []


def settings(setting: Setting) -> dict[str, Any]:
    equal = setting.mode == "equal"
    durability = "sync" if equal else "async (LangGraph's default)"
    if setting.backend == "sqlite":
        return {
            "durability": durability,
            "journal_mode": "WAL (set by SqliteSaver.setup)",
            "synchronous": "FULL (SQLite's default)",
            "floor": "wal_full",
        }
    return {
        "durability": durability,
        "synchronous_commit": "on (set on the connection)" if equal else "the server's default (on)",
        "floor": "pg_on",
    }


class Counter(TypedDict):
    i: int
    n: int
    total: int


class Conversation(TypedDict):
    i: int
    n: int
    messages: Annotated[list[str], operator.add]


def _add(state: Counter) -> dict[str, int]:
    return {"i": state["i"] + 1, "total": state["total"] + state["i"]}


def _grow(state: Conversation) -> dict[str, Any]:
    STAMPS.mark()
    index = state["i"]
    if PROBE is not None and index in set(probe_points(state["n"])):
        PROBE(index)
    return {"i": index + 1, "messages": [chunk(index)]}


def _w4_step(state: Counter) -> dict[str, int]:
    index = state["i"]
    _calls.append((index, time.perf_counter()))
    if index == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"i": index + 1, "total": state["total"] + index}


def _loop(state: Any) -> str:
    return "step" if state["i"] < state["n"] else END


def _graph(schema: Any, node: Callable[[Any], dict[str, Any]]) -> StateGraph[Any]:
    graph: StateGraph[Any] = StateGraph(schema)
    graph.add_node("step", node)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _loop)
    return graph


W1 = _graph(Counter, _add)
W2 = _graph(Conversation, _grow)
W4 = _graph(Counter, _w4_step)


@contextmanager
def _saver(url: str, equal: bool) -> Iterator[BaseCheckpointSaver[Any]]:
    if url.startswith("postgresql"):
        from langgraph.checkpoint.postgres import PostgresSaver

        if equal:
            url += "?options=-c%20synchronous_commit%3Don"
        with PostgresSaver.from_conn_string(url) as pg:
            pg.setup()
            yield pg
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(url) as lite:
            lite.setup()
            yield lite


def _config(thread: str, steps: int) -> Any:
    return {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}


def _durability(equal: bool) -> Any:
    return "sync" if equal else "async"


def _url(db: Database) -> str:
    return str(db.path) if db.backend == "sqlite" else db.pg_url


def measure(workload: str, setting: Setting, sizes: Sizes) -> dict[str, Any]:
    equal = setting.mode == "equal"
    with fresh_database(setting.backend, f"lg_{workload}") as db:
        return {"w1": _w1, "w2": _w2, "w4": _w4}[workload](db, equal, sizes)


def _w1(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    with _saver(_url(db), equal) as saver:
        graph = W1.compile(checkpointer=saver)
        started = time.perf_counter()
        graph.invoke(
            {"i": 0, "n": sizes.w1_steps, "total": 0},
            _config("w1", sizes.w1_steps),
            durability=_durability(equal),
        )
        elapsed = time.perf_counter() - started
    return {"steps_per_s": sizes.w1_steps / elapsed}


def _w2(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    global PROBE
    with _saver(_url(db), equal) as saver:
        graph = W2.compile(checkpointer=saver)
        probes: dict[int, int] = {0: db.bytes()}
        PROBE = lambda index: probes.__setitem__(index, db.bytes())  # noqa: E731
        STAMPS.times.clear()
        try:
            graph.invoke(
                {"i": 0, "n": sizes.w2_steps, "messages": []},
                _config("w2", sizes.w2_steps),
                durability=_durability(equal),
            )
        finally:
            PROBE = None
    probes[sizes.w2_steps] = db.bytes()
    return {
        **STAMPS.per_step(sizes.w2_window),
        "bytes": probes[sizes.w2_steps] - probes[0],
        "probes": probes,
        "growth": growth(probes),
    }


def _w4(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    args = {"url": _url(db), "equal": equal, "steps": sizes.w4_steps}
    victim = procs.spawn("langgraph", "victim", args, env={"BENCH_KILL_AT": str(sizes.w4_kill_at)})
    _, err = victim.communicate(timeout=300)
    if victim.returncode != -signal.SIGKILL:
        raise RuntimeError(f"W4 victim was not killed (exit {victim.returncode}): {err[-1000:]}")
    started = time.perf_counter()
    recovered = procs.finish(procs.spawn("langgraph", "recover", {**args, "kill_at": sizes.w4_kill_at}))
    recovered["process_s"] = time.perf_counter() - started
    return recovered


def _victim(args: dict[str, Any]) -> None:
    with _saver(args["url"], args["equal"]) as saver:
        W4.compile(checkpointer=saver).invoke(
            {"i": 0, "n": args["steps"], "total": 0},
            _config("w4", args["steps"]),
            durability=_durability(args["equal"]),
        )
    raise SystemExit("the victim was meant to be killed at its kill step")


def _recover(args: dict[str, Any]) -> None:
    started = time.perf_counter()
    with _saver(args["url"], args["equal"]) as saver:
        graph = W4.compile(checkpointer=saver)
        opened = time.perf_counter()
        graph.invoke(None, _config("w4", args["steps"]), durability=_durability(args["equal"]))
    ended = time.perf_counter()
    procs.emit(recovery_figures(started, opened, ended, [], _calls, args["kill_at"]))


if __name__ == "__main__":
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    {"victim": _victim, "recover": _recover}[role](raw)
