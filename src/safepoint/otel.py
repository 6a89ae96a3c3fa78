"""OpenTelemetry traces and metrics of the runs this process carries out (extra ``otel``).

Call ``instrument()`` once at start-up, as with any OpenTelemetry instrumentation; from then on
every run execution in the process — ``start``, ``resume``, a worker's claim, a retry, sync or
async, on SQLite or PostgreSQL — is traced:

- a span per run execution (``run <workflow>``): each time a claim carries the run, with its run
  id, workflow and version, fence, resume count and how the execution ended
  (``safepoint.run.status``: completed, failed, blocked, waiting, stopped, cancelled, continued,
  unfinished, released, lost, interrupted). Started inside an active span, it is that span's
  child;
- a child span per step (``step <name>``): its kind, id, name, attempt, whether it was replayed
  from the ledger or executed, and its status;
- a child span per call of an effect's owner (``dispatch <effect>`` / ``reconcile <effect>``):
  the operation id, the effect, a digest of its key (never the key), and the outcome (applied,
  rejected, unknown, not_sent; for a reconcile: reconciled, not_applied, unknown).

Every span carries ``safepoint.run.id`` and ``safepoint.run.fence``. No payload, input, result or
receipt is recorded unless asked: ``record_sizes=True`` adds their sizes in bytes,
``record_values=True`` their values, with every credential replaced by its marked digest (the
ledger's own secret rules) and cut at 4,096 characters. An exception is recorded as its type,
never its traceback or arguments; its message — which quotes what the caller's code or an
effect's owner said: a rejection's evidence, a ``NotSent``'s reason, a step's error — only under
``record_values=True`` too (credentials masked), but for safepoint's own errors whose message
names nothing but keys, places and ids (``_OWN_WORDS``).

Metrics (meter ``safepoint``): ``safepoint.steps`` (by kind, replayed, status),
``safepoint.step.duration`` (seconds, executed steps, by kind), ``safepoint.effect.dispatches`` and
``safepoint.effect.reconciliations`` (by effect and outcome), ``safepoint.run.blocks`` (by workflow
and recovery phase) and ``safepoint.run.executions`` (by workflow and status).

This module sits with the operator tools, at the top of the package: it watches the engine through
its private observer seam (``_engine.observe``), which may change with the engine, and nothing in
the package imports it — without ``instrument()`` the engine never reaches OpenTelemetry.
"""

from __future__ import annotations

from typing import Any

from ._engine import observe
from ._engine.crashpoints import SimulatedCrash
from ._engine.observe import EffectSeen, StepSeen
from ._rules.canonical import canonical, dumps, sha256_hex
from ._rules.secrets import redact_json, redacted_message
from .errors import DecryptionFailed, KeyUnavailable, LostOwnership, MissingExtra, RunBlocked
from .types import Claim, RunRecord

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - the extra is part of the development install
    raise MissingExtra("otel", exc.name or "opentelemetry-api", needed_by="safepoint.otel") from exc

__all__ = ["Telemetry", "instrument", "uninstrument"]

_SCOPE = "safepoint"
_VALUE_LIMIT = 4096
# How a step, an effect call or an execution ended that is an error on its span (a wait, a stop
# at a limit or a cancel is how a run is meant to pause or end, not a fault).
_ERRORS = frozenset(
    {"failed", "retrying", "rejected", "blocked", "lost", "crashed", "interrupted", "unknown"}
)
# The errors whose message safepoint writes from key ids, places in the ledger, run ids and
# fences alone — never a value: exported whole, as they say what to do. Every other message
# may quote the caller's data (an owner's evidence, a reconcile's reason, an exception raised
# by a step's function, a person's words), and is exported only with ``record_values``.
_OWN_WORDS = (KeyUnavailable, DecryptionFailed, LostOwnership, SimulatedCrash)


def _version() -> str:
    from . import __version__

    return __version__


class Telemetry:
    """The observer ``instrument()`` installs: spans on ``tracer_provider`` and metrics on
    ``meter_provider`` (the global providers when None). ``record_sizes`` adds the size in
    bytes of each step's result and each effect's payload and receipt; ``record_values`` adds
    the values themselves, credentials masked and cut at 4,096 characters, and the message of
    every error (otherwise only its type)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        record_sizes: bool = False,
        record_values: bool = False,
    ) -> None:
        self.record_sizes = record_sizes
        self.record_values = record_values
        self.tracer = trace.get_tracer(_SCOPE, _version(), tracer_provider)
        meter = metrics.get_meter(_SCOPE, _version(), meter_provider)
        self.steps = meter.create_counter(
            "safepoint.steps", unit="{step}", description="Steps replayed or executed"
        )
        self.step_duration = meter.create_histogram(
            "safepoint.step.duration", unit="s", description="How long an executed step's call took"
        )
        self.dispatches = meter.create_counter(
            "safepoint.effect.dispatches", unit="{dispatch}", description="Calls of an effect's execute"
        )
        self.reconciliations = meter.create_counter(
            "safepoint.effect.reconciliations",
            unit="{reconciliation}",
            description="Calls of an effect's reconcile",
        )
        self.blocks = meter.create_counter(
            "safepoint.run.blocks", unit="{block}", description="Run executions that ended blocked"
        )
        self.executions = meter.create_counter(
            "safepoint.run.executions", unit="{execution}", description="Run executions, by how they ended"
        )

    def started(self, run: RunRecord, claim: Claim, start_ns: int) -> _Execution:
        """A run execution began: its span, a child of the caller's active span if any."""
        ids: dict[str, Any] = {"safepoint.run.id": run.run_id, "safepoint.run.fence": claim.fence}
        span = self.tracer.start_span(
            f"run {run.workflow}",
            kind=SpanKind.INTERNAL,
            attributes={
                **ids,
                "safepoint.workflow.name": run.workflow,
                "safepoint.workflow.version": run.workflow_version,
                "safepoint.run.resume_count": run.resume_count,
            },
            start_time=start_ns,
        )
        return _Execution(self, span, ids, run.workflow)

    def size(self, value: Any) -> int | None:
        try:
            return len(canonical(value))
        except Exception:  # a telemetry attribute is never worth failing a run for
            return None

    def value(self, value: Any) -> str | None:
        try:
            return dumps(redact_json(value))[:_VALUE_LIMIT]
        except Exception:
            return None

    def add_recorded(self, attributes: dict[str, Any], name: str, value: Any) -> None:
        """The size (``record_sizes``) and value (``record_values``) of ``value``, when asked."""
        if value is None:
            return
        if self.record_sizes and (size := self.size(value)) is not None:
            attributes[f"{name}_size"] = size
        if self.record_values and (text := self.value(value)) is not None:
            attributes[name] = text


class _Execution:
    """One run execution's span, the parent of its steps' and effect calls' spans."""

    __slots__ = ("ids", "parent", "span", "telemetry", "workflow")

    def __init__(self, telemetry: Telemetry, span: Span, ids: dict[str, Any], workflow: str) -> None:
        self.telemetry = telemetry
        self.span = span
        self.parent: Context = trace.set_span_in_context(span)
        self.ids = ids
        self.workflow = workflow

    def step(self, seen: StepSeen) -> None:
        telemetry = self.telemetry
        kind = seen.kind.value
        attributes: dict[str, Any] = {
            **self.ids,
            "safepoint.step.id": seen.step_id,
            "safepoint.step.kind": kind,
            "safepoint.step.name": seen.name,
            "safepoint.step.attempt": seen.attempt,
            "safepoint.step.replayed": seen.replayed,
            "safepoint.step.status": seen.status,
        }
        telemetry.add_recorded(attributes, "safepoint.step.result", seen.result)
        span = telemetry.tracer.start_span(
            f"step {seen.name}", context=self.parent, attributes=attributes, start_time=seen.start_ns
        )
        _ended(span, seen.status, seen.error, seen.end_ns, telemetry.record_values)
        telemetry.steps.add(
            1,
            {
                "safepoint.workflow.name": self.workflow,
                "safepoint.step.kind": kind,
                "safepoint.step.replayed": seen.replayed,
                "safepoint.step.status": seen.status,
            },
        )
        if not seen.replayed:
            telemetry.step_duration.record(
                (seen.end_ns - seen.start_ns) / 1e9,
                {"safepoint.workflow.name": self.workflow, "safepoint.step.kind": kind},
            )

    def effect(self, seen: EffectSeen) -> None:
        telemetry = self.telemetry
        op = seen.operation
        attributes: dict[str, Any] = {
            **self.ids,
            "safepoint.step.id": seen.step_id,
            "safepoint.operation.id": op.operation_id,
            "safepoint.effect.name": op.effect,
            # enough to find the key in the owner's logs, never the key itself
            "safepoint.effect.key_digest": sha256_hex(op.effect_key.encode())[:16],
            "safepoint.effect.action": seen.action,
            "safepoint.effect.outcome": seen.outcome,
            "safepoint.effect.dispatch_count": op.dispatch_count,
        }
        telemetry.add_recorded(attributes, "safepoint.effect.payload", seen.payload)
        telemetry.add_recorded(attributes, "safepoint.effect.receipt", seen.receipt)
        span = telemetry.tracer.start_span(
            f"{seen.action} {op.effect}",
            context=self.parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=seen.start_ns,
        )
        _ended(span, seen.outcome, seen.error, seen.end_ns, telemetry.record_values)
        counter = telemetry.dispatches if seen.action == "dispatch" else telemetry.reconciliations
        counter.add(1, {"safepoint.effect.name": op.effect, "safepoint.effect.outcome": seen.outcome})

    def ended(self, status: str, error: BaseException | None, end_ns: int) -> None:
        telemetry = self.telemetry
        self.span.set_attribute("safepoint.run.status", status)
        if status == "blocked":
            record = error.record if isinstance(error, RunBlocked) else None
            phase = str((record or {}).get("phase", "unknown"))
            self.span.set_attribute("safepoint.run.block_phase", phase)
            telemetry.blocks.add(
                1, {"safepoint.workflow.name": self.workflow, "safepoint.run.block_phase": phase}
            )
        telemetry.executions.add(
            1, {"safepoint.workflow.name": self.workflow, "safepoint.run.status": status}
        )
        _ended(self.span, status, error, end_ns, telemetry.record_values)


def _ended(span: Span, status: str, error: BaseException | None, end_ns: int, values: bool) -> None:
    """End ``span``; one that ended in an error says so, with the exception's type — and its
    message when ``values`` (``record_values``) or when it is one of ``_OWN_WORDS``."""
    if status in _ERRORS:
        if error is not None:
            kind = type(error).__name__
            if values or isinstance(error, _OWN_WORDS):
                message = redacted_message(str(error), 1000)
                span.add_event("exception", {"exception.type": kind, "exception.message": message})
                span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"))
            else:
                span.add_event("exception", {"exception.type": kind})
                span.set_status(Status(StatusCode.ERROR, kind))
        else:
            span.set_status(Status(StatusCode.ERROR, status))
    span.end(end_time=end_ns)


def instrument(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    *,
    record_sizes: bool = False,
    record_values: bool = False,
) -> Telemetry:
    """Trace and measure every run this process carries out from now on (see the module's
    docstring); return the installed ``Telemetry``. Called again, it replaces the one before.

    >>> from safepoint import otel
    >>> otel.instrument()            # the global providers  # doctest: +SKIP
    """
    telemetry = Telemetry(
        tracer_provider, meter_provider, record_sizes=record_sizes, record_values=record_values
    )
    observe.install(telemetry)
    return telemetry


def uninstrument() -> None:
    """Stop tracing and measuring runs: the engine is back to reporting to nobody."""
    observe.install(None)
