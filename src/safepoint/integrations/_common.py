"""What the model SDK integrations share: SDK objects as the API's JSON, the model step's retry
policy and how an SDK failure becomes a recorded attempt, the user's price function as a step's
usage, and the tool loop — its flow and its two drivers, each API handing in its adapter.

Nothing here imports an SDK: each integration hands in its own classes.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast

import safepoint as sp
from safepoint.errors import TransientFailure, UsageError
from safepoint.integrations.tools import ToolCall, ToolOutcome, Tools

T = TypeVar("T")

# Statuses the providers document as worth another attempt (timeouts, lock conflicts, rate limits,
# server errors and Anthropic's 529 "overloaded"); their own SDKs retry exactly these.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


def to_json(value: Any) -> Any:
    """An SDK value as the API's JSON: SDK models by ``to_dict(mode="json")`` (the wire names,
    only the fields set, unknown fields kept — never ``model_dump``, which writes Python names
    such as ``async_``), other pydantic models by their aliases, containers recursively; the
    SDKs' "not given" markers are dropped."""
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items() if not _not_given(v)}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value if not _not_given(item)]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and hasattr(type(value), "model_fields"):  # on the class: pydantic 2.11
        return to_dict(mode="json")
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


def _not_given(value: Any) -> bool:
    # anthropic and openai mark an omitted argument with NotGiven / Omit instances
    return type(value).__name__ in ("NotGiven", "Omit")


def without_none(value: Any) -> Any:
    """A JSON value with its ``None``-valued entries removed, at any depth: a recorded reply in
    the shape to send back as input (the APIs answer ``null`` for fields an input must omit)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, else ``retry-after`` (seconds or an
    HTTP date); ``None`` when it said nothing usable."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = lowered.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) / scale
        except ValueError:
            if scale != 1.0:
                continue
            try:  # an HTTP date; anything else is a header to ignore, not a failure of its own
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError, IndexError):
                continue
            if when.tzinfo is None:  # RFC 9110 dates are GMT
                when = when.replace(tzinfo=datetime.UTC)
            seconds = when.timestamp() - time.time()
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    return None


def transient(
    exc: BaseException,
    provider: str,
    *,
    status_errors: tuple[type[BaseException], ...],
    connection_errors: tuple[type[BaseException], ...],
) -> TransientFailure | None:
    """The recorded attempt an SDK failure becomes, or ``None`` when another attempt would fail
    the same way (a 400 stays a 400). Retryable: the statuses in ``_RETRYABLE_STATUSES`` and
    every 5xx, or what the server's ``x-should-retry`` says; connection and timeout errors; and
    the HTTP library's transport errors, which is how a stream cut mid-body surfaces (a model
    call changes nothing, so asking again is safe)."""
    if isinstance(exc, status_errors):
        status = getattr(exc, "status_code", None)
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        should = headers.get("x-should-retry") if headers is not None else None
        retryable_status = isinstance(status, int) and (status in _RETRYABLE_STATUSES or status >= 500)
        if should == "false" or (should != "true" and not retryable_status):
            return None
        return TransientFailure(
            f"{provider} answered {status} ({type(exc).__name__}): {exc}", retry_after=retry_after(headers)
        )
    if isinstance(exc, connection_errors):
        return TransientFailure(f"{provider} could not be reached ({type(exc).__name__}): {exc}")
    return None


DEFAULT_MODEL_RETRY = sp.Retry(
    attempts=6, backoff=1.0, multiplier=2.0, max_backoff=60.0, jitter=0.2, retry_on=(TransientFailure,)
)


def model_retry(retry: sp.Retry | int | None) -> sp.Retry:
    """A model step's attempts: ``DEFAULT_MODEL_RETRY``, with ``attempts`` set by an int; a
    ``Retry`` as given, ``TransientFailure`` added to what it retries (the integration turns the
    SDK's retryable failures into that, as its own retries are off) — and, when its
    ``retry_on`` is left at ``Retry``'s default (any ``Exception``), only ``TransientFailure``:
    a 400 is then the step's failure, as documented, not a retry loop."""
    if retry is None:
        return DEFAULT_MODEL_RETRY
    if isinstance(retry, int) and not isinstance(retry, bool):
        return replace(DEFAULT_MODEL_RETRY, attempts=retry)
    if not isinstance(retry, sp.Retry):
        raise UsageError(f"retry={retry!r}: a safepoint.Retry, or a number of attempts")
    if retry.retry_on == _ANY_FAILURE:
        # Retry's own default (every Exception) would send a 400 again and again, then stop the
        # run as if it could go on: the integration already says which failures are transient.
        return replace(retry, retry_on=(TransientFailure,))
    if any(issubclass(TransientFailure, kind) for kind in retry.retry_on):
        return retry
    return replace(retry, retry_on=(*retry.retry_on, TransientFailure))


# What a Retry retries when its retry_on is left as it is.
_ANY_FAILURE = sp.Retry().retry_on


def price_usage(
    price: Callable[[Any], float] | None, tokens_of: Callable[[Any], int | None]
) -> Callable[[Any], dict[str, Any]] | None:
    """A model step's ``usage=`` from the user's ``price(reply_json) -> cost``: the reply's tokens
    as the provider counts them, and its cost as the user prices it (no price table is shipped:
    it would go stale)."""
    if price is None:
        return None
    if not callable(price):
        raise UsageError(f"price={price!r}: a function of a reply (its JSON) that returns its cost")

    def usage(reply: Any) -> dict[str, Any]:
        cost = price(reply)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
            raise UsageError(f"price() returned {cost!r}: a finite number of 0 or more")
        found: dict[str, Any] = {"cost": float(cost)}
        tokens = tokens_of(reply)
        if tokens is not None:
            found["tokens"] = tokens
        return found

    return usage


@dataclass(frozen=True)
class LoopResult(Generic[T]):
    """How a tool loop ended.

    ``final`` is the last reply (the SDK's own type), ``transcript`` the whole conversation —
    the messages it was given, then every assistant turn and tool-result turn in order, valid to
    carry on with — ``stop`` why it ended (the provider's stop or finish reason, or
    ``"max_turns"``), ``turns`` the model calls this loop made, and ``text`` the final reply's
    text."""

    final: T
    transcript: sp.Transcript
    stop: str
    turns: int
    text: str


def not_run(calls: list[ToolCall], stop: str) -> list[ToolOutcome]:
    """Error results, without a step, for the tool calls of a reply the loop stops on (cut short
    by its token limit, filtered): the calls may be incomplete, so none is run — but each gets a
    result, so that the transcript the loop returns is valid to carry on with (the APIs refuse a
    request holding a tool call without its result)."""
    why = f"not run: the reply ended with {stop!r} before the turn was complete; ask again"
    return [ToolOutcome.of(call, why, is_error=True) for call in calls]


def check_turns(max_turns: int) -> int:
    """``max_turns`` of a tool loop: the model calls it may make, 1 or more."""
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise UsageError(f"max_turns={max_turns!r}: the model calls the loop may make, an int of 1 or more")
    return max_turns


def as_transcript(messages: Any, what: str) -> sp.Transcript:
    """The loop's conversation: a ``Transcript`` given is carried on in place; a list is copied
    into a new one (SDK objects in it become their JSON)."""
    if isinstance(messages, sp.Transcript):
        return messages
    if isinstance(messages, str) or not isinstance(messages, list | tuple):
        raise UsageError(
            f"{what} is a list of messages (or a safepoint.Transcript), not {type(messages).__name__}"
        )
    return sp.Transcript(to_json(list(messages)))


# -- the tool loop, written once: each API gives its adapter, a driver (sync, async) runs it ------


@dataclass(frozen=True)
class LoopApi:
    """One API's side of a tool loop: ``key``, the model call's argument holding the transcript;
    ``turn(reply)``, the items to append for the reply; ``calls(reply)``, its tool calls to
    answer; ``stop(reply, calls)``, why the loop ends on it (``None``: answer the calls, if any,
    and ask again); ``results(outcomes)``, the items answering the calls; ``text(reply)``."""

    key: str
    turn: Callable[[Any], list[Any]]
    calls: Callable[[Any], list[ToolCall]]
    stop: Callable[[Any, list[ToolCall]], str | None]
    results: Callable[[list[ToolOutcome]], list[Any]]
    text: Callable[[Any], str]


def _flow(
    api: LoopApi, request: dict[str, Any], max_turns: int
) -> Generator[tuple[str, Any], Any, LoopResult[Any]]:
    """The loop, asking its driver for ("model", the call's arguments), and sent the reply, or
    for ("tools", the calls), and sent their outcomes."""
    transcript: sp.Transcript = request[api.key]
    reply: Any = None
    for turn in range(1, max_turns + 1):
        reply = yield "model", request
        transcript.extend(api.turn(reply))
        calls = api.calls(reply)
        stop = api.stop(reply, calls)
        if stop is not None:
            if calls:  # a reply cut short mid-call: its calls answered, not run (a valid transcript)
                transcript.extend(api.results(not_run(calls, stop)))
            return LoopResult(reply, transcript, stop, turn, api.text(reply))
        if calls:
            transcript.extend(api.results((yield "tools", calls)))
    return LoopResult(reply, transcript, "max_turns", max_turns, api.text(reply))


def run_loop(
    api: LoopApi, request: dict[str, Any], max_turns: int, model: Callable[..., Any], run: Any, tools: Tools
) -> LoopResult[Any]:
    """The tool loop in a plain ``def`` workflow: each turn ``model(**request)`` (the transcript
    in ``request[api.key]``), the reply's tool calls answered through ``tools``, each its step."""
    flow = _flow(api, request, max_turns)
    kind, value = next(flow)
    while True:
        sent = model(**value) if kind == "model" else tools.call_all(run, value)
        try:
            kind, value = flow.send(sent)
        except StopIteration as done:
            return cast(LoopResult[Any], done.value)


async def run_loop_async(
    api: LoopApi, request: dict[str, Any], max_turns: int, model: Callable[..., Any], run: Any, tools: Tools
) -> LoopResult[Any]:
    """``run_loop`` in an ``async def`` workflow: ``model`` and the tools awaited."""
    flow = _flow(api, request, max_turns)
    kind, value = next(flow)
    while True:
        sent = await (model(**value) if kind == "model" else tools.call_all_async(run, value))
        try:
            kind, value = flow.send(sent)
        except StopIteration as done:
            return cast(LoopResult[Any], done.value)
