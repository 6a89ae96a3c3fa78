"""Transcripts: a growing conversation given to every step at a constant hashing cost.

The value, its chain digest and what it refuses; replay on real SQLite and PostgreSQL stores;
a run SIGKILLed mid-conversation and finished by a fresh process; and the property that gives
it its reason to exist — the bytes a step's input hash covers do not grow with the transcript.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint._engine import records as _records
from safepoint._rules.canonical import canonical
from safepoint.errors import NotJSON
from safepoint.testing import KillHarness, OwnerService, SimulatedCrash

TESTS = str(Path(__file__).parents[1])


def chain(items: list[Any]) -> str:
    """The documented chain, computed independently of the class."""
    link = hashlib.sha256(b"").digest()
    for item in items:
        link = hashlib.sha256(link + hashlib.sha256(canonical(item)).digest()).digest()
    return "sha256:" + link.hex()


# -- the value --------------------------------------------------------------------------------


def test_the_digest_is_the_documented_chain_and_binds_order_and_content() -> None:
    items = [{"role": "user", "content": "hi"}, "plain", 3, [1, {"b": None, "a": True}]]
    transcript = sp.Transcript(items)
    assert transcript.digest == chain(items)
    assert sp.Transcript().digest == chain([])
    assert sp.Transcript(reversed(items)).digest != transcript.digest
    assert sp.Transcript([*items[:-1], [1, {"b": None, "a": False}]]).digest != transcript.digest
    # key order does not matter: items are canonical JSON
    assert sp.Transcript([{"a": 1, "b": 2}]) == sp.Transcript([{"b": 2, "a": 1}])
    assert transcript.reference() == {"$transcript": transcript.digest, "length": 4}


def test_items_read_back_are_copies_and_nothing_changes_it_but_append() -> None:
    transcript = sp.Transcript([{"content": ["a"]}])
    before = transcript.digest
    transcript[0]["content"].append("changed")
    for item in transcript:
        item["content"] = "changed too"
    transcript[:1][0]["content"] = "and again"
    assert transcript[0] == {"content": ["a"]}
    assert transcript.digest == before
    with pytest.raises(TypeError):
        transcript[0] = "x"  # type: ignore[index]
    assert not hasattr(transcript, "pop")
    assert not hasattr(transcript, "insert")
    with pytest.raises(TypeError):
        hash(transcript)


def test_an_item_that_is_not_json_is_refused_and_changes_nothing() -> None:
    transcript = sp.Transcript(["a"])
    before = transcript.digest
    for bad in (float("nan"), {1: "int key"}, object(), sp.Secret("sk-live-123456789")):
        with pytest.raises(NotJSON, match="transcript item"):
            transcript.append(bad)
    assert (len(transcript), transcript.digest) == (1, before)


def test_one_item_given_where_a_list_of_items_is_expected_is_refused() -> None:
    """A string or a message (a dict) is iterable, but is one item: never split into many."""
    for one in ("hello", b"hello", {"role": "user", "content": "hi"}):
        with pytest.raises(sp.UsageError, match="list of items"):
            sp.Transcript(one)  # type: ignore[arg-type]
    transcript = sp.Transcript(["a"])
    with pytest.raises(sp.UsageError, match=r"append\(item\)"):
        transcript.extend({"role": "user", "content": "hi"})
    assert list(transcript) == ["a"]


def test_a_transcript_is_not_a_recordable_value(memory_store: sp.Store) -> None:
    """Results and payloads are recorded whole: they take list(transcript)."""
    effect = sp.Effect("e", execute=lambda payload, key: {"ok": True})

    @sp.workflow("returns-transcript")
    def returns(run: sp.Run) -> Any:
        return run.pure("p", lambda: sp.Transcript(["a"]))

    @sp.workflow("sends-transcript")
    def sends(run: sp.Run) -> Any:
        return run.effect("fx", effect, payload={"messages": sp.Transcript(["a"])})

    with pytest.raises(NotJSON, match="Transcript"):
        sp.start(memory_store, returns, run_id="r1")
    with pytest.raises(NotJSON, match="Transcript"):
        sp.start(memory_store, sends, run_id="r2")


# -- in a run ---------------------------------------------------------------------------------


def test_a_step_given_a_transcript_hashes_a_constant_number_of_bytes(
    memory_store: sp.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason for the type: however long the conversation, a step's hashed inputs are the
    same size — against a plain list, whose hashed inputs grow with every step."""
    encoded: list[int] = []
    real = _records.sha256_hex

    def measuring(data: bytes) -> str:
        encoded.append(len(data))
        return real(data)

    monkeypatch.setattr(_records, "sha256_hex", measuring)

    @sp.workflow("growing")
    def growing(run: sp.Run, as_transcript: bool) -> int:
        state: Any = sp.Transcript() if as_transcript else []
        for index in range(300):
            state.append(run.pure("grow", lambda s, i: "x" * 200, state, index))
        return len(state)

    assert sp.start(memory_store, growing, True, run_id="t") == 300
    with_transcript, encoded[:] = encoded[:], []
    assert sp.start(memory_store, growing, False, run_id="l") == 300
    with_list = encoded[:]
    # only the digits of the index and of the length grow (1 to 3 each)
    assert max(with_transcript[1:]) - min(with_transcript[1:]) <= 4
    assert with_list[-1] > 100 * with_list[1]


def test_replay_gives_the_same_hashes_and_a_changed_item_is_a_mismatch(store_url: str, crash_at: Any) -> None:
    """On a real SQLite file and PostgreSQL: crashed after the last step, resumed, nothing is
    called again; resumed with an earlier item changed, the next step's inputs no longer
    match the record."""
    calls: list[int] = []
    first_word = {"value": "hello"}

    @sp.workflow("chat", version="1")
    def chat(run: sp.Run) -> str:
        messages = sp.Transcript([first_word["value"]])
        for turn in range(5):
            messages.append(run.read("reply", lambda m, t: calls.append(t) or f"r{len(m)}", messages, turn))
        return messages.digest

    store = sp.open_store(store_url)
    try:
        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(store, chat, run_id="c", lease_ms=0)
        crash_at(None)
        assert calls == [0, 1, 2, 3, 4]
        digest = sp.resume(store, "c")
        assert calls == [0, 1, 2, 3, 4]
        assert digest == chain(["hello", "r1", "r2", "r3", "r4", "r5"])

        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(store, chat, run_id="d", lease_ms=0)
        crash_at(None)
        first_word["value"] = "HELLO"
        with pytest.raises(sp.RunBlocked) as blocked:
            sp.resume(store, "d")
        assert "input hash" in str(blocked.value)
    finally:
        store.close()


def test_a_model_step_gets_a_list_and_its_prompt_hash_follows_the_content(memory_store: sp.Store) -> None:
    seen: list[Any] = []

    def model(*, model: str, messages: list[Any]) -> dict[str, Any]:
        seen.append(messages)
        return {"text": "ok"}

    @sp.workflow("model-transcript")
    def flow(run: sp.Run, first: str) -> Any:
        return run.model("m", model, model="m-1", messages=sp.Transcript([first, "b"]))

    sp.start(memory_store, flow, "a", run_id="r1")
    sp.start(memory_store, flow, "a", run_id="r2")
    sp.start(memory_store, flow, "z", run_id="r3")
    assert seen == [["a", "b"], ["a", "b"], ["z", "b"]]
    prompt = {r: memory_store.load_ledger(r).steps["m"].prompt_hash for r in ("r1", "r2", "r3")}
    assert prompt["r1"] == prompt["r2"] != prompt["r3"]
    assert memory_store.load_ledger("r1").steps["m"].name.endswith("model")


def test_an_async_model_step_gets_a_list_too(memory_store: sp.Store) -> None:
    async def model(*, model: str, messages: list[Any]) -> dict[str, Any]:
        return {"kind": type(messages).__name__, "n": len(messages)}

    @sp.workflow("model-transcript-async")
    async def flow(run: sp.AsyncRun) -> Any:
        return await run.model("m", model, model="m-1", messages=sp.Transcript(["a", "b"]))

    assert asyncio.run(sp.start_async(memory_store, flow, run_id="r")) == {"kind": "list", "n": 2}


# -- killed for real --------------------------------------------------------------------------


@pytest.mark.kill
@pytest.mark.parametrize(
    "crash_at",
    [
        "step.after_record:model@3",
        "step.before_record:pure@4",
        "effect.after_dispatching@2",
        "effect.after_receiver_commit@1",
    ],
)
def test_a_conversation_killed_mid_run_finishes_the_same(
    owner: OwnerService, tmp_path: Path, crash_at: str
) -> None:
    """SIGKILLed mid-conversation on a SQLite file; a fresh process rebuilds the transcript
    from the record, reaches the same digest, and files each ticket once."""
    harness = KillHarness(
        "flows:transcript_loop", ["case-1"], owner=owner, workdir=tmp_path, pythonpath=[TESTS]
    )
    reference, applied = harness.reference()
    assert reference["status"] == "completed"
    assert applied == 3
    assert reference["result"]["length"] == 13
    report = harness.trial(crash_at=crash_at)
    assert report.killed, f"{crash_at} was never reached"
    report.check()


def test_items_read_back_exactly_as_appended_while_the_digest_is_canonical() -> None:
    transcript = sp.Transcript([{"score": 1.0, "n": 2}, 0.5])
    assert transcript[0] == {"score": 1.0, "n": 2}
    assert isinstance(transcript[0]["score"], float)
    assert transcript.digest == chain([{"score": 1.0, "n": 2}, 0.5])
    assert transcript.digest == sp.Transcript([{"n": 2, "score": 1}, 0.5]).digest
