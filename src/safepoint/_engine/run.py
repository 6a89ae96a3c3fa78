"""``Run`` and ``AsyncRun``: the step methods a workflow calls.

Every step method is written once, as a flow (see ``flow``) that holds all the logic and never
performs I/O itself; ``Run`` carries it out with ``drive`` for plain ``def`` workflows,
``AsyncRun`` with ``adrive`` for ``async def`` ones, so the sync and async shells cannot drift
apart. The flows are the run core's (``core``: pure, read, model, decision and value steps) and
the dispatch protocol's (``dispatch``: effect steps); this module shapes the user's call into
them, and fans out (``parallel`` / ``gather``).
"""

from __future__ import annotations

import asyncio
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal, NoReturn, ParamSpec, overload

from .._rules.canonical import input_hash, require_json
from .._rules.effects import Effect
from .._rules.ids import id_problem
from .._rules.limits import UsageFn, as_retry
from .._rules.secrets import refuse_secrets
from .._rules.transcript import Transcript, is_reading_only
from ..errors import UsageError
from ..types import JSON, Budget, Retry, StepKind
from . import host
from .core import RunCore
from .current import running
from .dispatch import effect_flow
from .flow import Flow, R, adrive, callable_name, drive, is_async_callable
from .transactions import transaction_flow
from .waits import sleep_flow, wait_flow

P = ParamSpec("P")

# What a read or model step does with a credential in its result (see ``_redacts``).
SecretsPolicy = Literal["redact", "refuse"]

# Parameters of a model call that vary between identical requests and must not move its hash.
_UNHASHED_MODEL_PARAMS = frozenset({"request_id", "timeout", "extra_headers", "stream_options"})


def _model_inputs(
    model: str, messages: JSON, tools: JSON, params: dict[str, Any]
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(hashed inputs, prompt hash, call kwargs) of a model step."""
    hashed_params = {k: v for k, v in params.items() if k not in _UNHASHED_MODEL_PARAMS}
    call = {"model": model, "messages": messages, **params}
    if tools is not None:
        call["tools"] = tools
    hashed = {"model": model, "messages": messages, "tools": tools, "params": hashed_params}
    prompt: JSON
    if isinstance(messages, Transcript):
        prompt = messages.reference()
    else:
        require_json(messages, "messages", allow_tuples=True)
        prompt = messages
    return hashed, input_hash({"messages": prompt}), call


def _listing_messages(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with its ``messages`` transcript as a plain list: of fresh values, or —
    ``fn`` marked ``reads_messages_only`` (the integrations' SDK calls) — of the items the
    transcript decoded once and keeps, so that a turn does not decode the conversation again."""
    as_list: Callable[[Transcript], list[Any]] = Transcript.kept_items if is_reading_only(fn) else list
    if is_async_callable(fn):

        async def listing_async(*, messages: Transcript, **kwargs: Any) -> Any:
            return await fn(messages=as_list(messages), **kwargs)

        return listing_async

    def listing(*, messages: Transcript, **kwargs: Any) -> Any:
        return fn(messages=as_list(messages), **kwargs)

    return listing


def _redacts(secrets: SecretsPolicy, step_id: str) -> bool:
    """The ``secrets=`` policy of a read or model step: ``"redact"`` or ``"refuse"``."""
    if secrets not in ("redact", "refuse"):
        raise UsageError(
            f'step {step_id!r}: secrets={secrets!r}; say "redact" (a credential in the result is'
            ' recorded as its marked digest) or "refuse" (the step fails with SecretRefused)',
            step_id=step_id,
        )
    return secrets == "redact"


def _as_max_age(max_age: timedelta | float | None) -> timedelta | None:
    if max_age is None or isinstance(max_age, timedelta):
        return max_age
    return timedelta(seconds=max_age)


_VALUES: dict[str, Callable[[], str | float]] = {
    "now": lambda: host.current.wall_now().isoformat(),
    "random": lambda: host.current.random(),  # noqa: PLW0108 (the host of the moment, not of import)
    "uuid": lambda: str(uuidlib.UUID(host.current.token(), version=4)),
}

# Branches run on threads in a plain workflow: enough for I/O-bound steps, bounded so that a
# fan-out over a long list does not open a connection per item.
_DEFAULT_PARALLEL_THREADS = 8


def _branches(group: str, branches: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    """(name, function) of each branch: a mapping name → function, or a list (named 0, 1, …)."""
    if isinstance(branches, Mapping):
        named = [(name, fn) for name, fn in branches.items()]
    elif isinstance(branches, Sequence) and not isinstance(branches, str):
        named = [(str(index), fn) for index, fn in enumerate(branches)]
    else:
        raise UsageError(
            f"fan-out {group!r} takes a mapping name → function or a list of"
            " functions, each called with the branch's run"
        )
    for name, fn in named:
        refuse_secrets(name, f"a branch name of {group!r}")  # part of its steps' ids
        problem = id_problem(name) or ("it contains '/' or '#'" if any(c in name for c in "/#") else None)
        if problem is not None:
            raise UsageError(
                f"branch name {name!r} of {group!r}: {problem}; a branch name is a"
                " non-empty string without '/', '#', NUL or lone surrogates (it"
                " becomes part of every step id in the branch)"
            )
        if not callable(fn):
            raise UsageError(f"branch {name!r} of {group!r} is not callable")
    return named


def _outcome(
    named: list[tuple[str, Any]], results: list[Any], errors: list[BaseException | None], as_mapping: bool
) -> Any:
    """The branches' results in their order — or the first branch's error, in branch order, so
    which error a fan-out raises does not depend on timing."""
    for error in errors:
        if error is not None:
            raise error
    if as_mapping:
        return {name: result for (name, _), result in zip(named, results, strict=True)}
    return results


class _RunBase:
    def __init__(self, core: RunCore, prefix: str = "") -> None:
        self._core = core
        self._prefix = prefix  # inside a fan-out branch: "group.branch/"

    @property
    def run_id(self) -> str:
        return self._core.run.run_id

    @property
    def fence(self) -> int:
        """This worker's fence token for the run (grows with every takeover)."""
        return self._core.claim.fence

    def budget_left(self) -> Budget:
        """What the run may still spend on model calls: each of its budgets (as they stand,
        raised or not) less what its model steps recorded, ``None`` where it has no limit. For a
        loop that counts its own turns or cost per call (an agent CLI's ``max_turns`` and
        ``max_budget_usd``): give it what is left of the run's, so that a resume does not
        grant the whole budget again."""
        record = self._core.run

        def left(budget: float | None, spent: float) -> float | None:
            return None if budget is None else max(budget - spent, 0)

        tokens = left(record.token_budget, record.tokens_spent)
        calls = left(record.model_call_budget, record.model_calls_spent)
        return Budget(
            tokens=None if tokens is None else int(tokens),
            cost=left(record.cost_budget, record.cost_spent),
            model_calls=None if calls is None else int(calls),
        )

    def _sync(self, flow: Flow[R]) -> R:
        return drive(self._core.store, flow, self._core)

    async def _async(self, flow: Flow[R]) -> R:
        return await adrive(self._core.store, flow, self._core)

    # The flows of each step method, shared by Run and AsyncRun.

    def _step(
        self,
        kind: StepKind,
        step_id: str,
        fn: Callable[..., R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        **options: Any,
    ) -> Flow[R]:
        options.setdefault("hashed_inputs", [args, kwargs])
        return self._core.step_flow(kind, step_id, fn, args, kwargs, prefix=self._prefix, **options)

    def _model(
        self,
        step_id: str,
        fn: Callable[..., R],
        model: str,
        messages: JSON,
        tools: JSON,
        params: dict[str, Any],
        retry: Retry | int | None,
        usage: UsageFn | None,
        name: str | None = None,
        secrets: SecretsPolicy = "redact",
    ) -> Flow[R]:
        refuse_secrets(model, "the model id", step_id)  # recorded with the step
        redact = _redacts(secrets, step_id)
        hashed, prompt_hash, call = _model_inputs(model, messages, tools, params)
        if name is not None:
            refuse_secrets(name, "the step's name", step_id)  # recorded with the step
        name = name or callable_name(fn)
        if isinstance(messages, Transcript):
            fn = _listing_messages(fn)  # model SDKs want a list; built only if it is called
        return self._step(
            StepKind.MODEL,
            step_id,
            fn,
            (),
            call,
            hashed_inputs=hashed,
            name=name,
            model_id=model,
            prompt_hash=prompt_hash,
            retry=as_retry(retry, "retry"),
            usage=usage,
            redact=redact,
        )

    def _read(
        self,
        step_id: str,
        fn: Callable[..., R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        max_age: timedelta | float | None,
        retry: Retry | int | None,
        secrets: SecretsPolicy,
    ) -> Flow[R]:
        return self._step(
            StepKind.READ,
            step_id,
            fn,
            args,
            kwargs,
            max_age=_as_max_age(max_age),
            retry=as_retry(retry, "retry"),
            redact=_redacts(secrets, step_id),
        )

    def _effect(
        self, step_id: str, effect: Effect[Any], payload: JSON, operation_id: str | None, approval: bool
    ) -> Flow[Any]:
        return effect_flow(self._core, step_id, effect, payload, operation_id, approval, self._prefix)

    def _transaction(
        self,
        step_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry: Retry | int | None,
    ) -> Flow[Any]:
        return transaction_flow(
            self._core,
            step_id,
            fn,
            args,
            kwargs,
            hashed_inputs=[args, kwargs],
            retry=as_retry(retry, "retry"),
            prefix=self._prefix,
        )

    def _wait(self, name: str, timeout: timedelta | float | None, step_id: str | None) -> Flow[Any]:
        return wait_flow(self._core, step_id, name, timeout, self._prefix)

    def _sleep(self, duration: timedelta | float, step_id: str | None) -> Flow[None]:
        return sleep_flow(self._core, step_id, duration, self._prefix)

    def _value(self, kind: str, step_id: str) -> Flow[Any]:
        return self._step(StepKind.VALUE, step_id, _VALUES[kind], (), {}, hashed_inputs={}, name=kind)

    def _group(self, step_id: str, branches: Any) -> tuple[list[tuple[str, Any]], list[str]]:
        """The branches of a fan-out and the step-id prefix of each: ``group.name/``."""
        self._core.check_halt()
        group = self._core.occurrence(step_id, self._prefix)
        named = _branches(group, branches)
        if len({name for name, _ in named}) != len(named):
            raise UsageError(f"fan-out {group!r} names a branch twice")
        prefixes = [f"{group}.{name}/" for name, _ in named]
        self._core.fanouts.append(prefixes)
        with self._core.seq_lock:
            self._core.open_branches.update(prefixes)
        return named, prefixes


class Run(_RunBase):
    """What a plain ``def`` workflow receives. Every method records or replays one step, and
    returns what the step's function returned (its type too).

    >>> @workflow("greet")
    ... def greet(run: Run, name: str) -> str:
    ...     return run.pure("format", lambda n: f"hello {n}", name)
    """

    def pure(self, step_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """A deterministic computation; recorded so a resume need not recompute it."""
        return self._sync(self._step(StepKind.PURE, step_id, fn, args, kwargs))

    def read(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        secrets: SecretsPolicy = "refuse",
        **kwargs: Any,
    ) -> R:
        """An observation of the world; replayed until ``max_age`` says it expired.

        ``retry`` (a ``Retry``, or a number of attempts) overrides the run's ``step_attempts``:
        a failed attempt is recorded, then tried again after its back-off. ``secrets="redact"``
        records a credential the observation holds (an inbox quoting an API key) as its marked
        digest, and returns that, on the first run as on replay; by default such a result is
        refused (``SecretRefused``)."""
        return self._sync(self._read(step_id, fn, args, kwargs, max_age, retry, secrets))

    def model(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *,
        model: str,
        messages: JSON,
        tools: JSON = None,
        retry: Retry | int | None = None,
        usage: UsageFn | None = None,
        name: str | None = None,
        secrets: SecretsPolicy = "redact",
        **params: Any,
    ) -> R:
        """A model call, ``fn(model=, messages=, tools=, **params)``; replayed, never re-generated.

        The input hash covers ``model``, ``messages``, ``tools`` and ``params`` (but for
        ``request_id``, ``timeout``, ``extra_headers`` and ``stream_options``): pass what
        identifies the request, and hand ``fn`` the rest (transport, billing) through a closure.
        The tokens it used are recorded (read from a ``usage`` field of the response, or from
        ``usage(response) -> {"tokens": int, "cost": float}``) and count against the run's
        budget. ``retry`` as for ``read``. ``name`` is the step's recorded name (by default the
        function's qualified name); a replay checks it. A credential the reply quotes is recorded
        as its marked digest and returned so (``secrets="redact"``, the default: a model's words
        are an observation), or refused (``secrets="refuse"``)."""
        return self._sync(
            self._model(step_id, fn, model, messages, tools, params, retry, usage, name, secrets)
        )

    def decide(self, step_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """The planner's choice: ``fn`` returns the next step id (or a dict with
        ``next_step_id``); the choice is replayed, never asked again."""
        return self._sync(self._step(StepKind.DECISION, step_id, fn, args, kwargs))

    def effect(
        self,
        step_id: str,
        effect: Effect[R],
        /,
        *,
        payload: JSON,
        operation_id: str | None = None,
        approval: bool = False,
    ) -> R:
        """A change in another system, dispatched at most once; returns the owner's receipt.

        With ``approval=True`` it is prepared, then dispatched only under a person's approval
        of this very payload (and target state, see ``Effect.target_state``): without one the
        run waits (``AwaitingApproval``) until ``safepoint.approve`` releases it."""
        receipt: R = self._sync(self._effect(step_id, effect, payload, operation_id, approval))
        return receipt

    def transaction(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        retry: Retry | int | None = None,
        **kwargs: Any,
    ) -> R:
        """Writes to the ledger's own database, exactly once: ``fn(tx, *args, **kwargs)`` runs
        in the one transaction that checks this worker's fence first, then records the step
        with ``fn``'s JSON result and commits — the writes and the record together, or
        neither. Returns that result; a replay returns it without calling ``fn``.

        ``tx`` (``safepoint.types.Transaction``) runs statements on the store's own
        connection: ``tx.execute("INSERT INTO orders (id) VALUES (?)", (order_id,))`` on
        SQLite (``%s`` on PostgreSQL; ``tx.dialect`` says which). ``fn`` must not commit, roll
        back or close it (``UsageError``, rolled back), nor call other steps; raising rolls
        everything back and fails the step (tried again as ``retry`` allows: nothing of a
        failed attempt is left). On SQLite the file's write lock is held while ``fn`` runs:
        keep it short. The inputs (``args``, ``kwargs``) are hashed and checked on replay.

        >>> order = run.transaction("order.insert", insert_order, cart)  # doctest: +SKIP
        """
        result: R = self._sync(self._transaction(step_id, fn, args, kwargs, retry))
        return result

    def now(self, step_id: str = "now") -> datetime:
        """The current time, recorded: a resume sees the same instant."""
        return datetime.fromisoformat(self._sync(self._value("now", step_id)))

    def random(self, step_id: str = "random") -> float:
        """A random float in [0, 1), recorded."""
        return float(self._sync(self._value("random", step_id)))

    def uuid(self, step_id: str = "uuid") -> str:
        """A random UUID string, recorded."""
        return str(self._sync(self._value("uuid", step_id)))

    def wait_for(
        self, name: str, *, timeout: timedelta | float | None = None, step_id: str | None = None
    ) -> Any:
        """Wait for a message named ``name`` (``safepoint.send``): return its JSON payload,
        recorded as this step's result and replayed.

        A message sent before the run got here is taken at once (the oldest of that name not
        taken yet; a second one waits for the next wait). With none, the run waits — status
        ``waiting``, released, no worker holds it — and the caller of ``start`` / ``resume``
        gets ``AwaitingMessage``; the send makes it runnable again. ``timeout`` (a timedelta,
        or seconds) counts from when the wait first waited, on the store's clock, and no
        restart moves it: once it passed with no message, a worker takes the run, the step is
        recorded failed and ``WaitTimedOut`` is raised here — on every replay too. The step id
        is ``name`` unless ``step_id`` says otherwise.

        >>> answer = run.wait_for("manager.answer", timeout=timedelta(days=2))
        """
        return self._sync(self._wait(name, timeout, step_id))

    def sleep(self, duration: timedelta | float, *, step_id: str | None = None) -> None:
        """Sleep durably for ``duration`` (a timedelta, or seconds): the run is released, and
        a worker carries it on once it is due. The due instant is recorded at the first run, on
        the store's clock, so a restart neither shortens nor restarts the sleep; the caller of
        ``start`` / ``resume`` meanwhile gets ``Sleeping``. The step id is ``sleep`` unless
        ``step_id`` says otherwise.

        >>> run.sleep(timedelta(hours=1))
        """
        self._sync(self._sleep(duration, step_id))

    @overload
    def parallel(
        self, step_id: str, branches: Mapping[str, Callable[[Run], R]], /, *, max_threads: int = ...
    ) -> dict[str, R]: ...
    @overload
    def parallel(
        self, step_id: str, branches: Sequence[Callable[[Run], R]], /, *, max_threads: int = ...
    ) -> list[R]: ...
    def parallel(
        self,
        step_id: str,
        branches: Mapping[str, Callable[[Run], Any]] | Sequence[Callable[[Run], Any]],
        /,
        *,
        max_threads: int = _DEFAULT_PARALLEL_THREADS,
    ) -> Any:
        """Fan out: call each branch with a run of its own, at once, and return their results
        (a dict for a mapping of branches, a list for a list).

        Every step id in a branch is prefixed with the branch (``fetch.eu/price``), so the ids
        are stable however the branches interleave. After a crash the finished branches replay
        from the ledger and only the unfinished ones do anything; each branch's effects are
        recovered operation by operation. The first error, in branch order, is raised once
        every branch has stopped.

        >>> prices = run.parallel("fetch", {r: lambda b, r=r: b.read("price", get, r)
        ...                                 for r in ("eu", "us")})
        """
        named, prefixes = self._group(step_id, branches)
        if max_threads < 1:
            raise UsageError("max_threads must be 1 or more")
        outcomes = host.current.fan_out(
            [
                partial(_branch, self._core, fn, Run(self._core, prefix), prefix)
                for (_, fn), prefix in zip(named, prefixes, strict=True)
            ],
            max_threads,
            f"safepoint-{step_id}",
        )
        results = [value for value, _ in outcomes]
        errors = [error for _, error in outcomes]
        return _outcome(named, results, errors, isinstance(branches, Mapping))

    def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """End this run and carry on in a successor called with ``args`` and ``kwargs`` (after
        its ``run``): same workflow and version, a fresh history, the same chain. Keeps a long
        run under its history limit; call it at a deterministic point (every N iterations).

        The state must be JSON (and never a credential). Effects settled in this run or any run
        before it in the chain are found by their ``operation_id`` — never dispatched again —
        when that id was given explicitly. The run blocks instead while an effect of it is
        uncertain, and ends cancelled if a cancel was asked for. ``start`` and ``resume`` of
        the first run's id return the result of the chain's last run.

        >>> if step % 1000 == 999:
        ...     run.continue_as_new(step + 1, totals)
        """
        raise self._core.continue_as_new(args, kwargs)


class AsyncRun(_RunBase):
    """What an ``async def`` workflow receives: the methods of ``Run``, awaited. A step's
    function may be plain or ``async``; the step returns what it returned, awaited."""

    @overload
    async def pure(
        self, step_id: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...
    @overload
    async def pure(self, step_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    async def pure(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return await self._async(self._step(StepKind.PURE, step_id, fn, args, kwargs))

    @overload
    async def read(
        self,
        step_id: str,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        secrets: SecretsPolicy = "refuse",
        **kwargs: Any,
    ) -> R: ...
    @overload
    async def read(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        secrets: SecretsPolicy = "refuse",
        **kwargs: Any,
    ) -> R: ...
    async def read(
        self,
        step_id: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        max_age: timedelta | float | None = None,
        retry: Retry | int | None = None,
        secrets: SecretsPolicy = "refuse",
        **kwargs: Any,
    ) -> Any:
        return await self._async(self._read(step_id, fn, args, kwargs, max_age, retry, secrets))

    @overload
    async def model(
        self,
        step_id: str,
        fn: Callable[..., Awaitable[R]],
        /,
        *,
        model: str,
        messages: JSON,
        tools: JSON = None,
        retry: Retry | int | None = None,
        usage: UsageFn | None = None,
        name: str | None = None,
        secrets: SecretsPolicy = "redact",
        **params: Any,
    ) -> R: ...
    @overload
    async def model(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *,
        model: str,
        messages: JSON,
        tools: JSON = None,
        retry: Retry | int | None = None,
        usage: UsageFn | None = None,
        name: str | None = None,
        secrets: SecretsPolicy = "redact",
        **params: Any,
    ) -> R: ...
    async def model(
        self,
        step_id: str,
        fn: Callable[..., Any],
        /,
        *,
        model: str,
        messages: JSON,
        tools: JSON = None,
        retry: Retry | int | None = None,
        usage: UsageFn | None = None,
        name: str | None = None,
        secrets: SecretsPolicy = "redact",
        **params: Any,
    ) -> Any:
        return await self._async(
            self._model(step_id, fn, model, messages, tools, params, retry, usage, name, secrets)
        )

    @overload
    async def decide(
        self, step_id: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...
    @overload
    async def decide(self, step_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    async def decide(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return await self._async(self._step(StepKind.DECISION, step_id, fn, args, kwargs))

    @overload
    async def effect(
        self,
        step_id: str,
        effect: Effect[Awaitable[R]],
        /,
        *,
        payload: JSON,
        operation_id: str | None = None,
        approval: bool = False,
    ) -> R: ...
    @overload
    async def effect(
        self,
        step_id: str,
        effect: Effect[R],
        /,
        *,
        payload: JSON,
        operation_id: str | None = None,
        approval: bool = False,
    ) -> R: ...
    async def effect(
        self,
        step_id: str,
        effect: Effect[Any],
        /,
        *,
        payload: JSON,
        operation_id: str | None = None,
        approval: bool = False,
    ) -> Any:
        return await self._async(self._effect(step_id, effect, payload, operation_id, approval))

    @overload
    async def transaction(
        self,
        step_id: str,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        retry: Retry | int | None = None,
        **kwargs: Any,
    ) -> R: ...
    @overload
    async def transaction(
        self,
        step_id: str,
        fn: Callable[..., R],
        /,
        *args: Any,
        retry: Retry | int | None = None,
        **kwargs: Any,
    ) -> R: ...
    async def transaction(
        self,
        step_id: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        retry: Retry | int | None = None,
        **kwargs: Any,
    ) -> Any:
        """``Run.transaction``, awaited. On ``AsyncPostgresStore``, ``fn`` is an ``async def``
        given a ``safepoint.types.AsyncTransaction`` (``await tx.execute(…)``); on a sync
        store (SQLite), a plain function given a ``Transaction``."""
        return await self._async(self._transaction(step_id, fn, args, kwargs, retry))

    # Recording a value is a ledger write, which an async store can only do awaited.
    async def now(self, step_id: str = "now") -> datetime:
        return datetime.fromisoformat(await self._async(self._value("now", step_id)))

    async def random(self, step_id: str = "random") -> float:
        return float(await self._async(self._value("random", step_id)))

    async def uuid(self, step_id: str = "uuid") -> str:
        return str(await self._async(self._value("uuid", step_id)))

    async def wait_for(
        self, name: str, *, timeout: timedelta | float | None = None, step_id: str | None = None
    ) -> Any:
        """``Run.wait_for``, awaited: ``answer = await run.wait_for("manager.answer")``."""
        return await self._async(self._wait(name, timeout, step_id))

    async def sleep(self, duration: timedelta | float, *, step_id: str | None = None) -> None:
        """``Run.sleep``, awaited: ``await run.sleep(timedelta(hours=1))``."""
        await self._async(self._sleep(duration, step_id))

    @overload
    async def gather(
        self,
        step_id: str,
        branches: Mapping[str, Callable[[AsyncRun], Awaitable[R]]],
        /,
    ) -> dict[str, R]: ...
    @overload
    async def gather(
        self, step_id: str, branches: Sequence[Callable[[AsyncRun], Awaitable[R]]], /
    ) -> list[R]: ...
    async def gather(
        self,
        step_id: str,
        branches: Mapping[str, Callable[[AsyncRun], Any]] | Sequence[Callable[[AsyncRun], Any]],
        /,
    ) -> Any:
        """``Run.parallel`` for async workflows: each branch is a coroutine function called
        with a run of its own, all awaited together on this event loop."""
        named, prefixes = self._group(step_id, branches)
        settled = await asyncio.gather(
            *(
                _branch_async(self._core, fn, AsyncRun(self._core, prefix), prefix)
                for (_, fn), prefix in zip(named, prefixes, strict=True)
            ),
            return_exceptions=True,
        )
        errors = [r if isinstance(r, BaseException) else None for r in settled]
        return _outcome(named, list(settled), errors, isinstance(branches, Mapping))

    async def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """``Run.continue_as_new``, awaited: ``await run.continue_as_new(step + 1, totals)``."""
        raise self._core.continue_as_new(args, kwargs)


def _branch(core: RunCore, fn: Callable[[Any], Any], run: Run, prefix: str) -> Any:
    """Call a fan-out branch; once it ended, it is no longer open (see ``open_branches``)."""
    try:
        with running(run):  # a thread of the pool: the branch's run is its current run
            return fn(run)
    finally:
        with core.seq_lock:
            core.open_branches.discard(prefix)


async def _branch_async(core: RunCore, fn: Callable[[Any], Any], run: AsyncRun, prefix: str) -> Any:
    try:
        with running(run):  # a task of its own, holding a copy of the caller's context
            return await fn(run)
    finally:
        with core.seq_lock:
            core.open_branches.discard(prefix)
