"""The integrations' cost: model turns recorded by safepoint against the same calls made with the
raw SDK, both answered by ``safepoint.testing.FakeModelServer`` in a process of its own.

- W6, a recorded model turn: ``spa.bind(run, Anthropic(...)).messages.create`` and
  ``spo.bind(run, OpenAI(...)).chat.completions.create`` against ``client.messages.create`` and
  ``client.chat.completions.create``. Within one workflow, each turn makes the raw call, then
  the recorded one, each with its own copy of the same conversation (a list for the raw SDK, a
  ``Transcript`` for safepoint), so both see the same load; the overhead per turn is the median
  recorded call less the median raw call, in ms;
- W7, a 200-turn agent loop: each turn a model call whose reply asks for one tool, then the
  tool (for safepoint a ``run.read`` step), both results appended to the conversation. The raw
  loop and the recorded loop take turns, turn by turn, as in W6. The per-turn cost (wall and
  CPU time of this process) over the last turns against the first ones (turn 2 onwards: the
  first turn pays for warming up) says whether a turn costs more as the conversation grows.

The server answers every request with one tool call, its ids derived from the request body; it
runs in a process of its own so that its work (it parses and digests every request, which grows
with the conversation) is not charged to the client's CPU time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import safepoint as sp

from .. import procs

MODEL_ANTHROPIC = "claude-sonnet-4-5"
MODEL_OPENAI = "gpt-4.1"
ASK = "Look the order up, again and again."
SDKS = ("anthropic", "openai")


@contextmanager
def fake_server() -> Iterator[str]:
    """A FakeModelServer in a child process that answers every turn with one tool call; yields its
    base URL and stops it on exit."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.workloads.models", "serve"],
        cwd=procs.ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the fake model server did not start: {procs.stderr_of(child)}")
        yield url
    finally:
        if child.stdin is not None:
            child.stdin.close()  # the child serves until its stdin closes
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _serve() -> None:
    from safepoint.testing import FakeModelServer, FakeRequest, Turn
    from safepoint.testing.fake_models import _server

    # The reply's headers and body leave in two writes: with Nagle's algorithm on, the body waits
    # for the client's delayed ACK of the headers, 40 ms on Linux. A model API's server does not
    # make its clients wait so, and neither may the benchmark's.
    _server._Handler.disable_nagle_algorithm = True

    def answer(request: FakeRequest) -> Turn:
        return Turn.tool_calls(("lookup", {"n": request.turn}))

    with FakeModelServer(answer) as fake:
        print(fake.url, flush=True)
        sys.stdin.read()


# -- one SDK's turn, raw and recorded --------------------------------------------------------------


class _Conversation:
    """One SDK's conversation, raw (``run=None``) or recorded: a model call, and the user's turn
    answering the reply's tool call."""

    def __init__(self, sdk: str, url: str, run: sp.Run | None) -> None:
        self.sdk = sdk
        if sdk == "anthropic":
            import anthropic

            from safepoint.integrations import anthropic as spa

            client: Any = anthropic.Anthropic(api_key="sk-test-fake", base_url=url, max_retries=0)
            self._client = client if run is None else spa.bind(run, client)
            self._turn = spa.assistant_turn
        else:
            import openai

            from safepoint.integrations import openai as spo

            client = openai.OpenAI(api_key="sk-test-fake", base_url=url + "/v1", max_retries=0)
            self._client = client if run is None else spo.bind(run, client)
            self._turn = spo.chat_turn
        first = {"role": "user", "content": ASK}
        self.messages: list[Any] | sp.Transcript = [first] if run is None else sp.Transcript([first])

    def ask(self) -> Any:
        if self.sdk == "anthropic":
            return self._client.messages.create(model=MODEL_ANTHROPIC, max_tokens=256, messages=self.messages)
        return self._client.chat.completions.create(model=MODEL_OPENAI, messages=self.messages)

    def call_of(self, reply: Any) -> tuple[str, dict[str, Any]]:
        """The reply's one tool call: its id and its arguments."""
        if self.sdk == "anthropic":
            [block] = [b for b in reply.content if b.type == "tool_use"]
            return block.id, dict(block.input)
        [call] = reply.choices[0].message.tool_calls
        return call.id, json.loads(call.function.arguments)

    def answer(self, reply: Any, call_id: str, result: str) -> None:
        self.messages.append(self._turn(reply))
        if self.sdk == "anthropic":
            answered = {"type": "tool_result", "tool_use_id": call_id, "content": result}
            self.messages.append({"role": "user", "content": [answered]})
        else:
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})


def _lookup(n: int) -> str:
    return f"order {n}: shipped"


# -- W6 ----------------------------------------------------------------------------------------------


@sp.workflow("bench.w6")
def w6(run: sp.Run, sdk: str, url: str, turns: int) -> dict[str, list[float]]:
    raw, recorded = _Conversation(sdk, url, None), _Conversation(sdk, url, run)
    times: dict[str, list[float]] = {"raw": [], "recorded": [], "raw_cpu": [], "recorded_cpu": []}
    for _ in range(turns):
        for name, conversation in (("raw", raw), ("recorded", recorded)):
            wall, cpu = time.perf_counter(), time.process_time()
            reply = conversation.ask()
            times[name].append(time.perf_counter() - wall)
            times[f"{name}_cpu"].append(time.process_time() - cpu)
            call_id, arguments = conversation.call_of(reply)
            conversation.answer(reply, call_id, _lookup(arguments["n"]))
    return times


def measure_w6(store: sp.Store, url: str, turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sdk in SDKS:
        times = sp.start(store, w6, sdk, url, turns, run_id=f"w6.{sdk}")
        # the first call warms the client up
        names = ("raw", "recorded", "raw_cpu", "recorded_cpu")
        raw, recorded, raw_cpu, recorded_cpu = (statistics.median(times[name][1:]) * 1000 for name in names)
        out[sdk] = {
            "raw_ms": raw,
            "recorded_ms": recorded,
            "overhead_ms": recorded - raw,
            "raw_cpu_ms": raw_cpu,
            "recorded_cpu_ms": recorded_cpu,
            "overhead_cpu_ms": recorded_cpu - raw_cpu,
        }
    return out


# -- W7 ----------------------------------------------------------------------------------------------


@sp.workflow("bench.w7")
def w7(run: sp.Run, url: str, turns: int) -> dict[str, dict[str, list[float]]]:
    raw, recorded = _Conversation("anthropic", url, None), _Conversation("anthropic", url, run)
    costs: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in ("raw", "recorded")}
    for _ in range(turns):
        for name, conversation in (("raw", raw), ("recorded", recorded)):
            wall, cpu = time.perf_counter(), time.process_time()
            reply = conversation.ask()
            call_id, arguments = conversation.call_of(reply)
            if conversation is raw:
                result = _lookup(arguments["n"])
            else:
                result = run.read(f"tool.{call_id}", _lookup, arguments["n"])
            conversation.answer(reply, call_id, result)
            costs[name]["wall"].append(time.perf_counter() - wall)
            costs[name]["cpu"].append(time.process_time() - cpu)
    return costs


def windows(values: list[float], window: int) -> tuple[float, float]:
    """Mean of ``values`` over turns 2 to ``window + 1`` and over the last ``window`` turns
    (turn 1 warms the clients and the store up)."""
    body = values[1:]
    window = max(1, min(window, len(body) // 2))
    return statistics.fmean(body[:window]), statistics.fmean(body[-window:])


def measure_w7(store: sp.Store, url: str, turns: int, window: int) -> dict[str, Any]:
    costs = sp.start(store, w7, url, turns, run_id="w7")
    out: dict[str, Any] = {"turns": turns, "window": window}
    for clock in ("wall", "cpu"):
        raw_first, raw_last = windows(costs["raw"][clock], window)
        rec_first, rec_last = windows(costs["recorded"][clock], window)
        over_first, over_last = rec_first - raw_first, rec_last - raw_last
        out[clock] = {
            "raw_first_ms": raw_first * 1000,
            "raw_last_ms": raw_last * 1000,
            "raw_last_over_first": raw_last / raw_first,
            "first_ms": rec_first * 1000,
            "last_ms": rec_last * 1000,
            "last_over_first": rec_last / rec_first,
            "overhead_first_ms": over_first * 1000,
            "overhead_last_ms": over_last * 1000,
        }
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        _serve()
