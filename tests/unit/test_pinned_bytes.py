"""The bytes the ledger keeps and the hashes it compares, pinned: a change made for speed must not
change one of them. A recorded run is replayed by comparing input hashes, so an input that
hashed one way under the version that recorded it must hash the same under every later one.

The pinned digests were taken from the code as it stood before the per-step work was made
faster; a test that fails here means an encoding changed, not that the digest needs updating.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import random
import sqlite3
import string
from pathlib import Path
from typing import Any

import safepoint as sp
from safepoint._engine.core import _input_hash
from safepoint._rules.canonical import canonical_if_json, dumps, find_non_json
from safepoint.errors import NotJSON

CORPUS_DIGEST = "33cc63e1bc50e4d28f133f7ccf84312bbaa96d5f2e3f8154e34467aa6d4048eb"
LEDGER_DIGEST = "e42dcfc9b41cad87aa268ca9f57c792fd1b86a1e8d2dca294338c68ac123513c"


class _Level(enum.IntEnum):
    HIGH = 3


class _Colour(enum.StrEnum):
    RED = "red"


_Pair = collections.namedtuple("_Pair", "a b")


def corpus() -> list[Any]:
    """Values of every shape a step's inputs take: JSON of every type, with floats (the RFC 8785
    library's path), keys beyond the Basic Multilingual Plane, edge integers, escapes, tuples,
    subclasses, Secrets and Transcripts (hashed in their hashed form) and what is not JSON."""
    rng = random.Random(16)
    alphabet = string.printable + "\x00\x01\x1f\x7f\u00e9\u2028\u2029\ufffd\u4e2d\ue000\U0001f600"

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))

    def number() -> Any:
        return rng.choice(
            [
                rng.randint(-(2**53) + 1, 2**53 - 1),
                rng.randint(-1000, 1000),
                rng.uniform(-1e6, 1e6),
                rng.choice([0.0, -0.0, 1.0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 0.1, 2**53 - 1]),
            ]
        )

    def value(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.35:
            return rng.choice([text(), number(), True, False, None])
        if roll < 0.55:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        if roll < 0.65:
            return tuple(value(depth + 1) for _ in range(rng.randint(0, 3)))
        return {text(): value(depth + 1) for _ in range(rng.randint(0, 4))}

    values: list[Any] = [value() for _ in range(2000)]
    values += [[(total, index), {}] for total, index in ((0, 0), (124750, 499), (2**53 - 1, -1))]
    values += [
        [(_Level.HIGH, _Colour.RED), {"pair": _Pair(1, "x")}],
        [(), {"od": collections.OrderedDict(b=1, a=[True, None])}],
        [("q",), {"api_key": sp.Secret("sk-test-0123456789abcdefghijklmn")}],
        [(sp.Transcript([{"role": "user", "content": "hi"}, 1.5]),), {}],
        [({"\U0001f600": 1, "\ue000": 2},), {}],
        [(2**53,), {}],
        [(float("nan"),), {}],
        [({1: "x"},), {}],
        [({"a": {1, 2}},), {}],
        [(b"bytes",), {}],
        [({"\ud800": 1},), {}],
        [("\ud800",), {}],
    ]
    return values


def _corpus_digest() -> str:
    seen = hashlib.sha256()
    for item in corpus():
        for allow_tuples in (False, True):
            encoded = canonical_if_json(item, allow_tuples=allow_tuples)
            seen.update(b"-" if encoded is None else b"+" + encoded)
            seen.update(repr(find_non_json(item, allow_tuples=allow_tuples)).encode())
        try:
            seen.update(_input_hash(item, "s").encode())
        except NotJSON as refused:
            seen.update(f"refused {refused.path} {refused.type_name}".encode("utf-8", "backslashreplace"))
        try:
            seen.update(dumps(item).encode("utf-8", "backslashreplace"))
        except (TypeError, ValueError) as exc:
            seen.update(type(exc).__name__.encode())
        seen.update(b"\n")
    return seen.hexdigest()


def test_the_canonical_encoding_and_input_hash_of_a_corpus_are_as_pinned() -> None:
    assert _corpus_digest() == CORPUS_DIGEST


# -- a recorded run, byte for byte ---------------------------------------------------------------


def _fetch(query: str, limit: int = 2) -> dict[str, Any]:
    return {"query": query, "rows": [{"id": i, "score": i / 3, "text": "é\u2028"} for i in range(limit)]}


def _leak() -> str:
    return "the key is sk-test-0123456789abcdefghijklmn, keep it"


def _model(**call: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 3, "output_tokens": 4}}


def _echo(value: Any) -> Any:
    return value


@sp.workflow("pinned.bytes")
def _pinned(run: sp.Run, items: list[Any]) -> dict[str, Any]:
    echoed = [run.pure("echo", _echo, item) for item in items]
    found = run.read("fetch", _fetch, "pinned", limit=3)
    leaked = run.read("leak", _leak, secrets="redact")
    replied = run.model(
        "answer",
        _model,
        model="m-1",
        messages=sp.Transcript([{"role": "user", "content": "hi"}]),
        temperature=0.5,
    )
    return {"echoed": echoed, "found": found, "leaked": leaked, "replied": replied}


_ITEMS = [{"b": [1, 2.5, "é"], "a": None}, "x" * 300, [1e21, -0.0], {"\U0001f600": [True]}]
# Columns the clock or the worker fills in: the same run recorded twice differs there only.
_MOVING = {"recorded_at", "observed_at", "created_at", "updated_at", "lease_expires_at", "owner"}


def _rows(path: Path, table: str, order: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
    finally:
        conn.close()
    return [{key: value for key, value in dict(row).items() if key not in _MOVING} for row in rows]


def test_a_recorded_run_is_stored_byte_for_byte_as_pinned_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "pinned.sqlite"
    store = sp.open_store(f"sqlite:///{path}")
    try:
        result = sp.start(store, _pinned, _ITEMS, run_id="pinned")
        assert sp.resume(store, "pinned") == result
    finally:
        store.close()
    steps = _rows(path, "safepoint_steps", "seq")
    run = [
        {key: row[key] for key in ("run_id", "workflow", "input_hash", "inputs", "result", "status")}
        for row in _rows(path, "safepoint_runs", "run_id")
    ]
    assert len(steps) == len(_ITEMS) + 3
    assert hashlib.sha256(repr((steps, run)).encode()).hexdigest() == LEDGER_DIGEST
