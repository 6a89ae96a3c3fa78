"""The Anthropic SDK on the ledger: a client bound to a run, whose Messages calls are model
steps, and a tool loop that survives any crash.

>>> from safepoint.integrations import anthropic as spa
>>> claude = spa.bind(run, anthropic.Anthropic())
>>> reply = claude.messages.create(model=MODEL, max_tokens=1024, messages=messages)

``bind(run, client)`` gives an object with ``messages.create`` / ``parse`` / ``stream`` and
``beta.messages.create`` / ``parse`` / ``stream``, called as the SDK's. Each call is one model
step (``model``, ``model#2``, … — ``step_id=`` names them), recorded as the reply's JSON
(``to_dict``) and replayed on a resume without a request. The workflow always gets the reply
rebuilt from what was recorded (``Message.construct``: a content block of a type this SDK does
not know survives), on the first run as on replay — and so a credential the model quoted
comes back redacted both times (``secrets="redact"``).

The fingerprint: a replay answers a call only if the call asks the same question. Hashed:
``model``, ``messages``, ``system``, ``tools``, ``tool_choice``, ``max_tokens``,
``stop_sequences``, ``thinking``, ``output_config``, ``output_format`` (as its JSON schema),
``temperature`` / ``top_p`` / ``top_k`` (taken as arguments or in ``extra_body``, and sent in
the body), ``container``, ``betas``, ``context_management``, ``mcp_servers``, ``compaction``,
``fallbacks`` (and ``thread``, when allowed). Not hashed — how or for whom it is asked, passed to
the SDK as given: ``stream``, ``timeout``, ``extra_headers``, ``extra_query``, ``extra_body``,
``metadata``, ``service_tier``, ``speed``, ``inference_geo``, ``user_profile_id``,
``workspace_id``, ``diagnostics``, ``billing_policy``, ``fallback_credit_token`` and
``cache_control`` wherever it is placed (the parameter, and the ``cache_control`` key of system
blocks, tools and messages' content blocks). A parameter in neither list — one a newer SDK
adds — is hashed. Messages given as a ``safepoint.Transcript`` are hashed by its chain digest
(a constant cost per turn), their items exactly as appended, cache breakpoints included.

Retries: the SDK's own are off (``with_options(max_retries=0)``); each attempt is the ledger's,
recorded before its wait, so a restart continues the count. Retried: 408, 409, 429, 5xx, 529
(overloaded), ``x-should-retry: true``, connection errors and timeouts, a body cut mid-way, an
``overloaded_error`` event in a stream — waiting at least what ``retry-after`` asked. Once the
attempts run out the run stops, resumably (``safepoint.extend_limits(step_attempts=)``). Any
other failure (a 400) is the step's recorded failure: ``StepFailed``, on every replay too.

Streams: ``messages.stream`` (and ``create(stream=True)``) record the final message; the
stream the workflow reads is the SDK's own ``MessageStream`` over events synthesized from it,
given at once when the reply is complete.

Server-held state is refused: ``thread=`` (the beta's message threads) keeps the conversation
where a resume cannot replay it — ``bind(..., server_state=True)`` accepts that.
"""

from __future__ import annotations

try:
    import anthropic as _sdk  # noqa: F401  (the SDK, or a message saying how to get it)
except ImportError as exc:  # pragma: no cover - the extra is the way in
    raise ImportError(
        "safepoint.integrations.anthropic needs the anthropic SDK: pip install 'safepoint[anthropic]'"
    ) from exc

from safepoint.integrations._anthropic_client import AsyncBoundAnthropic, BoundAnthropic, bind
from safepoint.integrations._anthropic_loop import (
    assistant_turn,
    tool_loop,
    tool_loop_async,
    tool_results,
    tool_results_async,
)
from safepoint.integrations._anthropic_stream import AsyncRecordedEvents, RecordedEvents
from safepoint.integrations._common import LoopResult

__all__ = [
    "AsyncBoundAnthropic",
    "AsyncRecordedEvents",
    "BoundAnthropic",
    "LoopResult",
    "RecordedEvents",
    "assistant_turn",
    "bind",
    "tool_loop",
    "tool_loop_async",
    "tool_results",
    "tool_results_async",
]
