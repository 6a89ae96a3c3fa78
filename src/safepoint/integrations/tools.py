"""A tool registry: each tool a model may call is declared once, as the kind of step it is.

``Tools`` holds a workflow's tools. Each is declared by what a resume may do with it:

- ``pure`` — a computation of its arguments alone: recorded (``run.pure``), never run again;
- ``read`` — an observation of the world: recorded (``run.read``) and replayed until its
  ``max_age`` expires; tried once unless it declares ``retry=`` (a failure is the model's to
  handle, not a reason to stop the run); a credential-shaped string in what it returns is
  recorded redacted;
- ``effect`` — a change in another system: dispatched at most once per operation
  (``run.effect``) under an idempotency key the function receives, reconciled with its owner
  after a crash, approved first where it says ``approval=True``.

From the same declaration come the definitions each API takes (``anthropic()``,
``openai_chat()``, ``openai_responses()``: JSON schemas generated from the signature with
pydantic, without titles, so a definition changes only when the tool does), and the steps that
answer the model's calls: ``call(run, ToolCall(call_id, name, arguments))`` runs one call as the
step ``tool.<call_id>`` and returns a ``ToolOutcome`` to send back.

What the model asked for wrongly — an unknown tool, arguments that are not JSON or do not fit
the signature — is an ``is_error`` outcome and no step: it follows from the model's recorded
reply, so a replay gives the same outcome. A tool that raises is a recorded failure, an
``is_error`` outcome now and on every replay, from the ledger; an effect its owner refused is
one too. What must end the workflow function is never caught: a blocked run, a wait for
approval, a limit reached, a cancel.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from functools import partial
from typing import Any, Literal, TypeVar, overload

import safepoint as sp
from safepoint.errors import EffectRejected, StepFailed, UsageError
from safepoint.types import JSON, Retry

from ._tool_arguments import (
    Invalid,
    Signature,
    Written,
    checked_schema,
    description_of,
    is_async,
    jsonable,
    parameters_of,
    parsed,
)

__all__ = ["ToolCall", "ToolKind", "ToolOutcome", "Tools"]

ToolKind = Literal["pure", "read", "effect"]
F = TypeVar("F", bound=Callable[..., Any])

# Both APIs accept this much of a function tool's name, and no more.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# What each kind takes besides a name and a description: an effect built from a function takes
# the options of ``sp.Effect`` itself; one given as an ``sp.Effect`` carries its owner's options
# already and takes only the two each call decides.
_GIVEN_EFFECT_OPTIONS = frozenset({"key_fields", "approval"})
_OPTIONS: dict[str, frozenset[str]] = {
    "pure": frozenset(),
    "read": frozenset({"max_age", "retry"}),
    "effect": _GIVEN_EFFECT_OPTIONS
    | {f.name for f in fields(sp.Effect) if f.name not in ("name", "execute")},
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call a model asked for: the provider's ``call_id`` (Anthropic's ``tool_use``
    id, OpenAI's ``tool_calls[i].id`` or ``call_id``), the tool's ``name`` and its
    ``arguments`` — a dict, or the JSON text OpenAI sends."""

    call_id: str
    name: str
    arguments: Mapping[str, Any] | str

    def __post_init__(self) -> None:
        if not isinstance(self.call_id, str) or not self.call_id:
            raise UsageError(
                f"ToolCall needs the provider's call id as a non-empty string, not {self.call_id!r}"
            )
        if not isinstance(self.name, str):
            raise UsageError(f"ToolCall {self.call_id!r}: the tool's name is a string, not {self.name!r}")
        if not isinstance(self.arguments, (Mapping, str)):
            raise UsageError(
                f"ToolCall {self.call_id!r}: the arguments are a dict or JSON text, not"
                f" {type(self.arguments).__name__}"
            )


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What to send back to the model for one call: ``content`` is ``value`` as text (``value``
    itself when it is a string, else its compact JSON); ``is_error`` says the call failed, and
    ``value`` is then the text saying why."""

    call_id: str
    name: str
    content: str
    is_error: bool
    value: JSON

    @classmethod
    def of(cls, call: ToolCall, value: JSON, *, is_error: bool = False) -> ToolOutcome:
        """The outcome of ``call`` whose result is ``value``."""
        content = (
            value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        )
        return cls(call.call_id, call.name, content, is_error, value)


# -- the tools --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tool:
    """One declared tool: what the model is told, how its arguments are checked, and the step
    that answers a call — its function (pure, read) or its ``sp.Effect``, built once."""

    name: str
    kind: ToolKind
    description: str
    arguments: Signature | Written
    step: Callable[..., Any] | None  # pure and read: called with the arguments as recorded
    effect: sp.Effect[Any] | None
    is_async: bool
    max_age: timedelta | float | None = None
    retry: Retry | int | None = None
    key_fields: tuple[str, ...] = ()
    approval: bool = False

    def operation_id(self, arguments: Mapping[str, Any]) -> str | None:
        """The operation ``arguments`` name: with ``key_fields``, the tool and a digest of those
        fields — the same for two calls that ask for the same change, whatever their call ids
        (a model re-planning mints new ones); without, None (the call's step names it)."""
        if not self.key_fields:
            return None
        named = {name: arguments.get(name) for name in self.key_fields}
        text = json.dumps(named, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return f"{self.name}:{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _calling(
    fn: Callable[..., Any], kwargs_of: Callable[[Any], dict[str, Any]], key: str | None, name: str
) -> tuple[Callable[..., Any], Callable[[Any, sp.EffectKey], Any]]:
    """(the step function of a pure or read tool, called with the recorded arguments; the
    ``execute`` of an effect tool, called with the recorded payload and the key). Both check
    the arguments again — what was recorded is what they run on — and return JSON."""

    def with_key(payload: Any, effect_key: sp.EffectKey) -> dict[str, Any]:
        try:
            kwargs = kwargs_of(payload)
        except Invalid as exc:  # before anything left: the owner was not asked
            raise sp.NotSent(f"the recorded arguments of tool {name!r} no longer fit it: {exc}") from exc
        if key is not None:
            kwargs[key] = effect_key
        return kwargs

    if is_async(fn):

        async def step_async(arguments: Any) -> Any:
            return jsonable(await fn(**kwargs_of(arguments)))

        async def execute_async(payload: Any, effect_key: sp.EffectKey) -> Any:
            return jsonable(await fn(**with_key(payload, effect_key)))

        step, execute = step_async, execute_async
    else:

        def step_sync(arguments: Any) -> Any:
            return jsonable(fn(**kwargs_of(arguments)))

        def execute_sync(payload: Any, effect_key: sp.EffectKey) -> Any:
            return jsonable(fn(**with_key(payload, effect_key)))

        step, execute = step_sync, execute_sync
    # The step's recorded name is the tool's: a replay checks it, and the model knows the tool
    # by it, whatever the Python function is called.
    step.__name__ = step.__qualname__ = name
    return step, execute


@dataclass(frozen=True, slots=True)
class _Made:
    """An effect operation made earlier in this run's execution: the call that asked for it,
    its arguments and what it came to."""

    call_id: str
    arguments: dict[str, Any]
    outcome: ToolOutcome


class Tools:
    """The tools of a workflow: declared with ``@tools.pure``, ``@tools.read``,
    ``@tools.effect`` (bare or with options) or ``tools.add(...)``; offered to a model with
    ``anthropic()``, ``openai_chat()`` or ``openai_responses()``; the model's calls answered
    with ``call`` / ``call_all`` (``call_async`` / ``call_all_async`` in an ``async def``
    workflow), each through a step of its own.

    >>> tools = Tools()
    >>> @tools.read
    ... def get_order(order_id: str) -> dict:
    ...     '''Look up an order by its id.'''
    ...     return {"id": order_id, "total_cents": 1200}
    """

    def __init__(self) -> None:
        self._tools: dict[str, _Tool] = {}
        # Per run object (one execution of a workflow function): the effect operations its
        # calls made, by operation id — rebuilt as a resume replays the same calls.
        self._made: weakref.WeakKeyDictionary[Any, dict[str, _Made]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- declaring ------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        kind: ToolKind,
        fn: Callable[..., Any] | None = None,
        *,
        effect: sp.Effect[Any] | None = None,
        schema: Mapping[str, Any] | None = None,
        description: str = "",
        **options: Any,
    ) -> None:
        """Declare the tool ``name`` of ``kind`` (``"pure"``, ``"read"`` or ``"effect"``).

        ``fn`` is called with the arguments by name; its schema is generated from its
        signature (pydantic), unless ``schema=`` gives one (then the arguments are passed as
        sent). An effect tool may instead be an existing ``effect=sp.Effect(...)``, whose
        ``execute`` receives the call's arguments dict as its payload (a ``schema=`` is needed
        then). ``description`` defaults to the first paragraph of ``fn``'s docstring. Options:
        a read takes ``max_age`` and ``retry``; an effect ``key_fields``, ``approval``, and —
        when built from ``fn`` — ``reconcile``, ``verify``, ``verify_timeout``,
        ``dedup_retention``, ``max_dispatches`` and ``target_state``, as ``sp.Effect`` does."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise UsageError(f"tool name {name!r}: 1 to 64 letters, digits, '_' or '-', as both APIs require")
        if name in self._tools:
            raise UsageError(f"tool {name!r} is declared twice: give each tool a name of its own")
        if kind not in _OPTIONS:
            raise UsageError(f"tool {name!r}: kind {kind!r} is none of 'pure', 'read', 'effect'")
        allowed = _GIVEN_EFFECT_OPTIONS if effect is not None else _OPTIONS[kind]
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise UsageError(
                f"tool {name!r} ({kind}{' given as an Effect' if effect is not None else ''}) takes no"
                f" {', '.join(unknown)}; it takes: {', '.join(sorted(allowed)) or 'no options'}"
            )
        if effect is not None and (kind != "effect" or fn is not None or not isinstance(effect, sp.Effect)):
            raise UsageError(
                f"tool {name!r}: effect= is an sp.Effect, for an effect tool declared without fn"
            )
        if fn is None and effect is None:
            raise UsageError(f"tool {name!r}: give the function that answers it (or, for an effect, effect=)")
        if fn is not None and not callable(fn):
            raise UsageError(f"tool {name!r}: {fn!r} is not callable")
        self._tools[name] = _declare(name, kind, fn, effect, schema, description_of(fn, description), options)

    @overload
    def pure(self, fn: F, /) -> F: ...
    @overload
    def pure(
        self, fn: None = None, /, *, name: str | None = None, description: str = ""
    ) -> Callable[[F], F]: ...
    def pure(
        self, fn: F | None = None, /, *, name: str | None = None, description: str = ""
    ) -> F | Callable[[F], F]:
        """Declare a pure tool: its result follows from its arguments alone, so a resume takes
        it from the ledger and never runs it again. Bare (``@tools.pure``) or with options."""
        return self._decorate("pure", fn, name, description, {})

    @overload
    def read(self, fn: F, /) -> F: ...
    @overload
    def read(
        self,
        fn: None = None,
        /,
        *,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        name: str | None = None,
        description: str = "",
    ) -> Callable[[F], F]: ...
    def read(
        self,
        fn: F | None = None,
        /,
        *,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        name: str | None = None,
        description: str = "",
    ) -> F | Callable[[F], F]:
        """Declare a read tool: an observation, replayed on a resume until ``max_age`` (a
        timedelta or seconds; None: forever) says it expired. Tried once unless ``retry`` (a
        ``sp.Retry`` or a number of attempts) says otherwise: a failure is an ``is_error``
        outcome for the model. A credential in what it returns is recorded redacted."""
        return self._decorate("read", fn, name, description, {"max_age": max_age, "retry": retry})

    @overload
    def effect(self, fn: F, /) -> F: ...
    @overload
    def effect(
        self,
        fn: None = None,
        /,
        *,
        key_fields: Iterable[str] = (),
        reconcile: Callable[[sp.EffectKey], Any] | None = None,
        approval: bool = False,
        dedup_retention: timedelta | None = None,
        max_dispatches: int = 3,
        verify: Callable[[Any], Any] | None = None,
        verify_timeout: timedelta | float | None = None,
        target_state: Callable[[Any], Any] | None = None,
        name: str | None = None,
        description: str = "",
    ) -> Callable[[F], F]: ...
    def effect(
        self,
        fn: F | None = None,
        /,
        *,
        key_fields: Iterable[str] = (),
        reconcile: Callable[[sp.EffectKey], Any] | None = None,
        approval: bool = False,
        dedup_retention: timedelta | None = None,
        max_dispatches: int = 3,
        verify: Callable[[Any], Any] | None = None,
        verify_timeout: timedelta | float | None = None,
        target_state: Callable[[Any], Any] | None = None,
        name: str | None = None,
        description: str = "",
    ) -> F | Callable[[F], F]:
        """Declare an effect tool: a change in another system, made at most once per
        operation. A parameter annotated ``sp.EffectKey`` (any name) is left out of the schema
        and receives the operation's key: send ``str(key)`` as the owner's idempotency key.
        ``key_fields`` name the arguments that make two calls the same operation (the order
        id of a refund): calls that agree on them are one operation whatever their call ids.
        ``reconcile(key)`` asks the owner after a crash (``sp.Applied(receipt)``,
        ``sp.NotApplied()``, ``sp.Unknown(reason)``); without it an uncertain outcome blocks
        the run. ``approval=True``: each call waits for a person's ``safepoint.approve``. The
        other options are ``sp.Effect``'s; its payload is the call's arguments dict."""
        options = {
            "key_fields": key_fields,
            "reconcile": reconcile,
            "approval": approval,
            "dedup_retention": dedup_retention,
            "max_dispatches": max_dispatches,
            "verify": verify,
            "verify_timeout": verify_timeout,
            "target_state": target_state,
        }
        return self._decorate("effect", fn, name, description, options)

    def _decorate(
        self, kind: ToolKind, fn: F | None, name: str | None, description: str, options: dict[str, Any]
    ) -> F | Callable[[F], F]:
        def declare(target: F) -> F:
            self.add(name or target.__name__, kind, target, description=description, **options)
            return target  # unchanged: the function may still be called directly

        return declare if fn is None else declare(fn)

    # -- offering them to a model ---------------------------------------------------------------

    def names(self) -> list[str]:
        """The tools' names, in the order they were declared."""
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def anthropic(self) -> list[dict[str, Any]]:
        """The definitions for Anthropic's Messages API (``tools=``)."""
        return [
            {"name": t.name, "description": t.description, "input_schema": t.arguments.schema()}
            for t in self._tools.values()
        ]

    def openai_chat(self) -> list[dict[str, Any]]:
        """The definitions for OpenAI's Chat Completions API (``tools=``)."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.arguments.schema(),
                },
            }
            for t in self._tools.values()
        ]

    def openai_responses(self) -> list[dict[str, Any]]:
        """The definitions for OpenAI's Responses API (``tools=``). ``strict`` is false: a
        strict schema must require every property, which a parameter with a default is not."""
        return [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.arguments.schema(),
                "strict": False,
            }
            for t in self._tools.values()
        ]

    # -- answering the model's calls ------------------------------------------------------------

    def call(self, run: sp.Run | None, call: ToolCall) -> ToolOutcome:
        """Answer one tool call in a plain ``def`` workflow, through the step ``tool.<call_id>``
        (``run=None``: the run whose workflow is executing)."""
        run = _sync_run(run)
        answered = self._answer(run, call)
        if isinstance(answered, ToolOutcome):
            return answered
        tool, step, arguments = answered
        if tool.is_async:
            raise UsageError(
                f"tool {tool.name!r} is async: answer its calls in an async def workflow (AsyncRun)"
                " with `await tools.call_async(run, call)`, or declare it with a plain def"
            )
        try:
            value = step()
        except (StepFailed, EffectRejected) as failed:
            return self._settled(run, tool, call, arguments, _failure(call, failed))
        return self._settled(run, tool, call, arguments, ToolOutcome.of(call, value))

    async def call_async(self, run: sp.AsyncRun | None, call: ToolCall) -> ToolOutcome:
        """``call`` in an ``async def`` workflow: ``await tools.call_async(run, call)``; the
        tool's function may be ``async def`` or plain."""
        run = _async_run(run)
        answered = self._answer(run, call)
        if isinstance(answered, ToolOutcome):
            return answered
        tool, step, arguments = answered
        try:
            value = await step()
        except (StepFailed, EffectRejected) as failed:
            return self._settled(run, tool, call, arguments, _failure(call, failed))
        return self._settled(run, tool, call, arguments, ToolOutcome.of(call, value))

    def call_all(self, run: sp.Run | None, calls: Iterable[ToolCall]) -> list[ToolOutcome]:
        """Answer the calls of one model turn, in the order given, each through its own step."""
        return [self.call(run, call) for call in calls]

    async def call_all_async(self, run: sp.AsyncRun | None, calls: Iterable[ToolCall]) -> list[ToolOutcome]:
        """``call_all`` in an ``async def`` workflow, the calls one after another."""
        return [await self.call_async(run, call) for call in calls]

    def _answer(
        self, run: sp.Run | sp.AsyncRun, call: ToolCall
    ) -> ToolOutcome | tuple[_Tool, Callable[[], Any], dict[str, Any]]:
        """The outcome of a call that needs no step (it asks for what cannot be done, or for an
        operation this run already made) — or its tool, the step that answers it, unstarted,
        and its arguments as recorded."""
        if not isinstance(call, ToolCall):
            raise UsageError(
                f"a tool call is a ToolCall(call_id, name, arguments), not {type(call).__name__}"
            )
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolOutcome.of(call, f"unknown tool {call.name!r}; the tools are: {known}", is_error=True)
        try:
            arguments, _ = tool.arguments.validate(parsed(call.arguments))
        except Invalid as exc:
            return ToolOutcome.of(call, f"invalid arguments for tool {call.name!r}: {exc}", is_error=True)
        sid = f"tool.{call.call_id}"
        if tool.effect is None:  # pure or read: a step of the tool's function
            assert tool.step is not None
            if tool.kind == "pure":
                return tool, partial(run.pure, sid, tool.step, arguments), arguments
            # A tool is tried once unless it says otherwise: a failure is the model's to handle.
            retry = tool.retry if tool.retry is not None else 1
            step = partial(
                run.read, sid, tool.step, arguments, max_age=tool.max_age, retry=retry, secrets="redact"
            )
            return tool, step, arguments
        operation_id = tool.operation_id(arguments)
        made = self._made_before(run, operation_id)
        if made is not None:
            return _again(tool, call, made, arguments)
        step = partial(
            run.effect, sid, tool.effect, payload=arguments, operation_id=operation_id, approval=tool.approval
        )
        return tool, step, arguments

    def _made_before(self, run: sp.Run | sp.AsyncRun, operation_id: str | None) -> _Made | None:
        if operation_id is None:
            return None
        with self._lock:
            return self._made.get(run, {}).get(operation_id)

    def _settled(
        self,
        run: sp.Run | sp.AsyncRun,
        tool: _Tool,
        call: ToolCall,
        arguments: dict[str, Any],
        outcome: ToolOutcome,
    ) -> ToolOutcome:
        """``outcome``, remembered for the run when it settled an operation named by its key
        fields: a later call naming it again gets it without another step."""
        operation_id = tool.operation_id(arguments) if tool.kind == "effect" else None
        if operation_id is not None:
            with self._lock:
                self._made.setdefault(run, {})[operation_id] = _Made(call.call_id, arguments, outcome)
        return outcome


def _again(tool: _Tool, call: ToolCall, made: _Made, arguments: dict[str, Any]) -> ToolOutcome:
    """A second call for an operation this run already made (same key fields, another call id):
    what the first came to — the operation is made once — or, asked with other arguments, an
    error saying so (as an owner refuses an idempotency key reused with other parameters)."""
    if arguments == made.arguments:
        first = made.outcome
        return ToolOutcome(call.call_id, call.name, first.content, first.is_error, first.value)
    return ToolOutcome.of(
        call,
        f"tool {call.name!r}: call {made.call_id!r} already asked for this operation (the same"
        f" {', '.join(tool.key_fields)}) with other arguments; it is made once, as that"
        " call asked, and not again",
        is_error=True,
    )


def _failure(call: ToolCall, failed: StepFailed | EffectRejected) -> ToolOutcome:
    """The ``is_error`` outcome of a recorded failure: the same text on the first run as on a
    replay, since both come from what the ledger holds."""
    if isinstance(failed, StepFailed):
        return ToolOutcome.of(call, f"{failed.error_type}: {failed.error_message}", is_error=True)
    evidence = failed.evidence
    reason = (
        evidence
        if isinstance(evidence, str)
        else json.dumps(evidence, ensure_ascii=False, separators=(",", ":"))
    )
    return ToolOutcome.of(call, f"Rejected: {reason}", is_error=True)


def _sync_run(run: sp.Run | None) -> sp.Run:
    found = sp.current_run() if run is None else run
    if not isinstance(found, sp.Run):
        raise UsageError(
            "tools.call answers calls in a plain def workflow (a Run); in an async def workflow,"
            " `await tools.call_async(run, call)`"
        )
    return found


def _async_run(run: sp.AsyncRun | None) -> sp.AsyncRun:
    found = sp.current_run() if run is None else run
    if not isinstance(found, sp.AsyncRun):
        raise UsageError(
            "tools.call_async answers calls in an async def workflow (an AsyncRun); in a plain def"
            " workflow, `tools.call(run, call)`"
        )
    return found


def _declare(
    name: str,
    kind: ToolKind,
    fn: Callable[..., Any] | None,
    effect: sp.Effect[Any] | None,
    schema: Mapping[str, Any] | None,
    description: str,
    options: dict[str, Any],
) -> _Tool:
    """The tool as declared: its arguments' check, its step function or ``sp.Effect``."""
    key: str | None = None
    arguments: Signature | Written
    if fn is not None:
        parameters, key, hints = parameters_of(name, fn, written=schema is not None)
        if key is not None and kind != "effect":
            raise UsageError(f"tool {name!r}: only an effect tool receives an EffectKey ({key!r} is one)")
        arguments = (
            Written(checked_schema(name, schema))
            if schema is not None
            else Signature.of(name, fn, parameters, hints)
        )
    elif schema is None:
        raise UsageError(
            f"tool {name!r}: an effect given as an sp.Effect needs schema= (it has no signature to read)"
        )
    else:
        arguments = Written(checked_schema(name, schema))
    given = options.pop("key_fields", ()) or ()
    key_fields = (given,) if isinstance(given, str) else tuple(given)
    properties = arguments.schema().get("properties", {})
    missing = [field for field in key_fields if field not in properties]
    if missing or any(not isinstance(field, str) for field in key_fields):
        raise UsageError(
            f"tool {name!r}: key_fields {list(key_fields)!r} must name its arguments"
            f" ({', '.join(properties)})"
        )
    step = None
    if fn is not None:
        step, execute = _calling(fn, lambda args: arguments.validate(args)[1], key, name)
        if kind == "effect":
            try:
                effect = sp.Effect(
                    name, execute=execute, **{k: v for k, v in options.items() if k != "approval"}
                )
            except (ValueError, TypeError) as exc:
                raise UsageError(f"tool {name!r}: {exc}") from exc
    return _Tool(
        name=name,
        kind=kind,
        description=description,
        arguments=arguments,
        step=step,
        effect=effect,
        is_async=is_async(fn) if fn is not None else effect is not None and is_async(effect.execute),
        max_age=options.get("max_age"),
        retry=options.get("retry"),
        key_fields=key_fields,
        approval=bool(options.get("approval", False)),
    )
