"""A fake model server that the real ``anthropic`` and ``openai`` clients talk to over HTTP on
loopback: the Anthropic Messages API and the OpenAI Chat Completions and Responses APIs, JSON
and streams, in each API's own wire format, answered from a script of API-neutral turns, with
the faults a durable agent loop must survive (rate limits, overload, a reply lost in flight, a
stream cut mid-body, a slow answer) and the 400 the APIs give a tool call left without result.

    from safepoint.testing import FakeModelServer, Turn

    script = [Turn.tool_calls(("get_order", {"order_id": "A1"})), Turn.text("Refunded.")]
    with FakeModelServer(script) as fake:
        claude = Anthropic(api_key="sk-test-fake", base_url=fake.url, max_retries=0)
        gpt = OpenAI(api_key="sk-test-fake", base_url=fake.openai_url, max_retries=0)
        ...
        assert fake.requests_per_turn() == {0: 1, 1: 1}

Standard library only: importing it needs neither SDK.
"""

from __future__ import annotations

from ._script import FakeRequest, Turn
from ._server import FakeModelServer

__all__ = ["FakeModelServer", "FakeRequest", "Turn"]
