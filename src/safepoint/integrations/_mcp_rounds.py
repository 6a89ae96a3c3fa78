"""A tool call the server answers "input required" (``InputRequiredResult``, MCP's
multi-round-trip requests): the round's answer is recorded, the client's answers to the input
requests are recorded, and the next round is sent with them and the server's ``request_state``
— so a resume continues the same request instead of starting it over (and asking its person
again).

The SDK's ``mcp.Client.call_tool`` drives the rounds itself, in memory, where a crash loses the
state; this module drives them round by round through the client's session
(``allow_input_required=True``) and its callbacks (``dispatch_input_request``).
"""

from __future__ import annotations

from typing import Any

import mcp as _sdk
import mcp_types
from mcp.client.context import ClientRequestContext
from pydantic import TypeAdapter

from safepoint.integrations._mcp_policy import McpToolError, result_json

# Rounds of one call before giving up on a server that never stops asking (the SDK's default).
MAX_ROUNDS = 10

_REQUESTS: TypeAdapter[mcp_types.InputRequests] = TypeAdapter(mcp_types.InputRequests)


def session_of(client: Any) -> Any:
    """The ``ClientSession`` a round is sent on: the client's own, or the session given."""
    return client.session if isinstance(client, _sdk.Client) else client


def input_required(recorded: Any) -> bool:
    """Whether a recorded answer is the server's "input required" (not the tool's result)."""
    return isinstance(recorded, dict) and recorded.get("resultType") == "input_required"


def next_round(arguments: dict[str, Any], recorded: dict[str, Any], responses: Any) -> dict[str, Any]:
    """The payload of the round after ``recorded``: the same arguments, the answers to its
    input requests and its ``request_state``, echoed verbatim."""
    return {"arguments": arguments, "inputResponses": responses, "requestState": recorded.get("requestState")}


async def answer_inputs(client: Any, recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The client's answers to the input requests of ``recorded`` (its elicitation, sampling
    and roots callbacks), as the protocol's JSON; ``None`` when the server sent only state."""
    if not recorded.get("inputRequests"):
        return None
    session = session_of(client)
    answers: dict[str, Any] = {}
    for key, request in _REQUESTS.validate_python(recorded["inputRequests"]).items():
        meta = request.params.meta if request.params is not None else None
        context = ClientRequestContext(session=session, request_id=key, meta=meta)
        answer = await session.dispatch_input_request(context, request)
        if isinstance(answer, mcp_types.ErrorData):
            raise McpToolError(f"the input request {key!r} was declined: {answer.message}")
        answers[key] = result_json(answer)
    return answers
