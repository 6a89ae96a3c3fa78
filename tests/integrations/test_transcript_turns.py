"""A conversation kept in a ``Transcript`` costs safepoint the same at every turn: the bound
Anthropic and OpenAI clients hand the SDK the items the transcript decoded once and keeps,
instead of decoding the whole conversation again on each call — with the real SDKs over HTTP
to the fake model server on loopback, on a real SQLite file. Counted, not timed: the JSON
decodes of transcript items per turn must not grow with the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import openai
import pytest

import safepoint as sp
from safepoint._rules import transcript as transcript_module
from safepoint.integrations import anthropic as spa
from safepoint.integrations import openai as spo
from safepoint.testing import FakeModelServer, FakeRequest, Turn

TURNS = 24


@contextmanager
def counted_decodes() -> Iterator[list[int]]:
    """Counts every item a ``Transcript`` decodes (``json.loads`` in its module), per turn."""
    counts = [0]
    real = json.loads

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        counts[-1] += 1
        return real(text, *args, **kwargs)

    saved = transcript_module.json
    transcript_module.json = type("CountingJSON", (), {"loads": staticmethod(loads)})  # type: ignore[assignment]
    try:
        yield counts
    finally:
        transcript_module.json = saved


def _answer(request: FakeRequest) -> Turn:
    return Turn.text(f"turn {request.turn}")


def _anthropic_turn(run: sp.Run, url: str, messages: sp.Transcript) -> None:
    client = spa.bind(run, anthropic.Anthropic(api_key="sk-test-fake", base_url=url, max_retries=0))
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    messages.append(spa.assistant_turn(reply))


def _openai_turn(run: sp.Run, url: str, messages: sp.Transcript) -> None:
    client = spo.bind(run, openai.OpenAI(api_key="sk-test-fake", base_url=url + "/v1", max_retries=0))
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages)
    messages.append(spo.chat_turn(reply))


@pytest.mark.parametrize("turn", [_anthropic_turn, _openai_turn], ids=["anthropic", "openai"])
def test_a_turn_decodes_only_what_is_new_whatever_the_length(
    file_store: sp.Store, turn: Callable[[sp.Run, str, sp.Transcript], None]
) -> None:
    with FakeModelServer(_answer) as fake, counted_decodes() as counts:

        @sp.workflow(f"transcript-turns-{turn.__name__}")
        def agent(run: sp.Run) -> int:
            messages = sp.Transcript([{"role": "user", "content": "Count with me."}])
            for index in range(TURNS):
                counts.append(0)
                turn(run, fake.url, messages)
                messages.append({"role": "user", "content": f"and {index}?"})
            return len(messages)

        assert sp.start(file_store, agent, run_id="r") == 1 + 2 * TURNS
        sent = [request.body["messages"] for request in fake.requests]
    per_turn = counts[1:]
    # Each turn decodes the items appended since the one before (the first: the opening message
    # and nothing else), never the conversation again: 2 at turn 24 as at turn 2, not 47.
    assert per_turn[0] == 1
    assert set(per_turn[1:]) == {2}, per_turn
    # What the SDK sent is the conversation as appended, every turn.
    assert len(sent) == TURNS
    assert [len(messages) for messages in sent] == [1 + 2 * index for index in range(TURNS)]
    assert sent[-1][0] == {"role": "user", "content": "Count with me."}
    assert sent[-1][-1] == {"role": "user", "content": f"and {TURNS - 2}?"}


def test_kept_items_are_decoded_once_and_fresh_reads_stay_fresh() -> None:
    t = sp.Transcript([{"role": "user", "content": "hi"}])
    kept = t.kept_items()
    again = t.kept_items()
    assert kept == again == [{"role": "user", "content": "hi"}]
    assert kept is not again  # a new list …
    assert kept[0] is again[0]  # … of the same, kept, values
    t.append({"role": "assistant", "content": "hello"})
    assert t.kept_items()[0] is kept[0]
    assert len(t.kept_items()) == 2
    # every other read decodes fresh values: changing one changes nothing in the transcript
    fresh = list(t)
    fresh[0]["content"] = "changed"
    t[1]["content"] = "changed too"
    assert list(t) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert fresh[0] is not t.kept_items()[0]


def test_a_model_function_of_ones_own_gets_fresh_values_on_every_call(file_store: sp.Store) -> None:
    """``run.model`` with a function that is not marked ``reads_messages_only`` (the user's own)
    is given fresh values: what it changes in them is neither in the transcript nor in what the
    next call is given."""
    given: list[list[Any]] = []

    def model(*, messages: list[Any], **_: Any) -> dict[str, Any]:
        given.append([dict(m) for m in messages])
        messages[0]["content"] = "changed by the model function"
        return {"text": "ok"}

    @sp.workflow("transcript-own-model")
    def agent(run: sp.Run) -> list[Any]:
        messages = sp.Transcript([{"role": "user", "content": "hi"}])
        run.model("one", model, model="m", messages=messages)
        messages.append({"role": "user", "content": "again"})
        run.model("two", model, model="m", messages=messages)
        return list(messages)

    assert sp.start(file_store, agent, run_id="r") == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "again"},
    ]
    assert given[1][0] == {"role": "user", "content": "hi"}


def test_reads_messages_only_refuses_what_it_cannot_mark() -> None:
    with pytest.raises(sp.UsageError, match="model function"):
        sp.reads_messages_only("not a function")  # type: ignore[type-var]
    with pytest.raises(sp.UsageError, match="mark a function"):
        sp.reads_messages_only(len)
