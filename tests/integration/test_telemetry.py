"""OpenTelemetry (``safepoint.otel``) on real stores, read back through the SDK's in-memory span
exporter and metric reader: a span per run execution with its steps and effect calls as
children, the ids and fence on every span, how each ended — and no payload, input, result or
receipt anywhere in what is exported unless the user asks for it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import safepoint as sp
from safepoint import otel
from safepoint.testing import SimulatedCrash

# Put in every input, result, payload and receipt: it must never reach the exported data.
MARKER = "MARKER-payload-5d1c"


@dataclass
class Exported:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer_provider: TracerProvider

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name.startswith(prefix)]

    def text(self) -> str:
        """Every exported byte: the spans (attributes, events, status) and the metrics."""
        spans = "\n".join(s.to_json() for s in self.finished())
        data = self.metrics.get_metrics_data()
        return spans + "\n" + (data.to_json() if data is not None else "")

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value) of each data point of the metric ``name``."""
        data = self.metrics.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data is not None else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            value = getattr(point, "value", None)
                            found.append(
                                (dict(point.attributes or {}), value if value is not None else point)
                            )
        return found

    def total(self, name: str, **where: Any) -> int:
        """The sum of the counter ``safepoint.<name>`` over the points that match ``where``
        (``step__kind="pure"``: the attribute ``safepoint.step.kind``)."""
        return sum(
            int(value)
            for attrs, value in self.points(f"safepoint.{name}")
            if all(attrs.get(f"safepoint.{k.replace('__', '.')}") == v for k, v in where.items())
        )


def _exported(**options: Any) -> Iterator[Exported]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    otel.instrument(tracer_provider, meter_provider, **options)
    try:
        yield Exported(spans, reader, tracer_provider)
    finally:
        otel.uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


@pytest.fixture
def exported() -> Iterator[Exported]:
    yield from _exported()


class Owner:
    """An in-process effect owner that remembers what it applied, by key."""

    def __init__(self) -> None:
        self.applied: dict[str, dict[str, Any]] = {}
        self.calls = 0

    def execute(self, payload: dict[str, Any], key: sp.EffectKey) -> dict[str, Any]:
        self.calls += 1
        receipt = {"id": f"t-{len(self.applied) + 1}", "note": payload["note"]}
        self.applied[str(key)] = receipt
        return receipt

    def reconcile(self, key: sp.EffectKey) -> Any:
        found = self.applied.get(str(key))
        return sp.Applied(found) if found is not None else sp.NotApplied()


def fetch_case(case_id: str) -> dict[str, Any]:
    return {"case": case_id, "body": f"{MARKER} the printer is on fire"}


def draft(*, model: str, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
    return {"text": f"{MARKER} reply to {messages[-1]['content']}", "usage": {"total_tokens": 12}}


def _ticketing(name: str, owner: Owner, *, reconcile: bool = True) -> sp.Workflow:
    tickets = sp.Effect(
        "ticket.create", execute=owner.execute, reconcile=owner.reconcile if reconcile else None
    )

    @sp.workflow(name)
    def follow_up(run: sp.Run, case_id: str, note: str) -> dict[str, Any]:
        case = run.read("case.fetch", fetch_case, case_id)
        title = run.pure("title", lambda c: f"{MARKER} {c['body'][:20]}", case)
        reply = run.model("draft", draft, model="fake-1", messages=[{"role": "user", "content": title}])
        receipt = run.effect(
            "ticket",
            tickets,
            payload={"note": note, "reply": reply["text"]},
            operation_id=f"ticket:{case_id}",
        )
        return {"ticket": receipt["id"], "note": note}

    return follow_up


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_run_is_a_span_with_its_steps_and_dispatch_as_children(
    exported: Exported, file_store: sp.Store
) -> None:
    owner = Owner()
    wf = _ticketing("otel-follow-up", owner)
    caller = exported.tracer_provider.get_tracer("test")
    with caller.start_as_current_span("handle request") as outer:
        result = sp.start(file_store, wf, "c1", f"{MARKER} note", run_id="r1")
    assert result["note"] == f"{MARKER} note"

    (run_span,) = exported.named("run ")
    assert run_span.name == "run otel-follow-up"
    assert run_span.parent is not None
    assert run_span.parent.span_id == outer.get_span_context().span_id
    run_attrs = _attrs(run_span)
    fence = run_attrs["safepoint.run.fence"]
    assert isinstance(fence, int)
    assert run_attrs == {
        "safepoint.run.id": "r1",
        "safepoint.run.fence": fence,
        "safepoint.workflow.name": "otel-follow-up",
        "safepoint.workflow.version": wf.version,
        "safepoint.run.resume_count": 0,
        "safepoint.run.status": "completed",
    }

    steps = exported.named("step ")
    assert [(_attrs(s)["safepoint.step.id"], _attrs(s)["safepoint.step.kind"]) for s in steps] == [
        ("case.fetch", "read"),
        ("title", "pure"),
        ("draft", "model"),
        ("ticket", "effect"),
    ]
    for step in steps:
        attrs = _attrs(step)
        assert attrs["safepoint.step.replayed"] is False
        assert attrs["safepoint.step.status"] == "completed"
        assert attrs["safepoint.step.attempt"] == 1
        assert step.end_time is not None
        assert step.start_time is not None
        assert step.end_time >= step.start_time
    (dispatch,) = exported.named("dispatch ")
    assert dispatch.name == "dispatch ticket.create"
    attrs = _attrs(dispatch)
    assert attrs["safepoint.operation.id"] == "ticket:c1"
    assert attrs["safepoint.effect.outcome"] == "applied"
    assert attrs["safepoint.effect.dispatch_count"] == 1
    (key,) = owner.applied
    assert attrs["safepoint.effect.key_digest"] not in key
    assert key not in exported.text()

    for span in [*steps, dispatch]:
        assert span.parent is not None
        assert span.parent.span_id == run_span.context.span_id
        assert span.context.trace_id == outer.get_span_context().trace_id
    for span in exported.finished():
        if span.name != "handle request":
            assert _attrs(span)["safepoint.run.id"] == "r1"
            assert _attrs(span)["safepoint.run.fence"] == fence

    assert MARKER not in exported.text()
    assert exported.total("steps", step__kind="pure", step__replayed=False) == 1
    assert exported.total("steps", step__kind="effect", step__replayed=False) == 1
    assert exported.total("steps") == 4
    assert exported.total("effect.dispatches", effect__outcome="applied") == 1
    assert exported.total("run.executions", run__status="completed") == 1
    durations = exported.points("safepoint.step.duration")
    assert sum(point.count for _, point in durations) == 4


def test_a_crash_and_resume_show_replayed_steps_and_a_reconciled_effect(
    exported: Exported, file_store: sp.Store, crash_at: Any
) -> None:
    owner = Owner()
    wf = _ticketing("otel-crash", owner)
    crash_at("effect.after_receiver_commit")  # the owner applied it; the receipt never reached the ledger
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, wf, "c2", f"{MARKER} note", run_id="r2", lease_ms=0)
    crash_at(None)
    first = {s.context.span_id for s in exported.named("run ")}
    assert sp.resume(file_store, "r2")["ticket"] == "t-1"
    assert owner.calls == 1  # reconciled, not sent again

    runs = exported.named("run ")
    assert [_attrs(s)["safepoint.run.status"] for s in runs] == ["crashed", "completed"]
    crashed, resumed = runs
    assert _attrs(resumed)["safepoint.run.fence"] > _attrs(crashed)["safepoint.run.fence"]
    assert _attrs(resumed)["safepoint.run.resume_count"] == 1
    assert crashed.status.status_code is StatusCode.ERROR
    (event,) = crashed.events
    assert event.name == "exception"
    assert set(event.attributes or {}) == {
        "exception.type",
        "exception.message",
    }
    assert (event.attributes or {})["exception.type"] == "SimulatedCrash"

    def under(run: ReadableSpan, prefix: str) -> list[ReadableSpan]:
        return [s for s in exported.named(prefix) if s.parent and s.parent.span_id == run.context.span_id]

    replayed = {
        _attrs(s)["safepoint.step.id"]: _attrs(s)["safepoint.step.replayed"] for s in under(resumed, "step ")
    }
    # the pure step went into the ledger with the next write (the effect's), so it replays too
    assert replayed == {"case.fetch": True, "title": True, "draft": True, "ticket": False}
    (reconciled,) = under(resumed, "reconcile ")
    assert _attrs(reconciled)["safepoint.effect.outcome"] == "reconciled"
    assert _attrs(reconciled)["safepoint.run.fence"] == _attrs(resumed)["safepoint.run.fence"]
    assert not under(resumed, "dispatch ")
    assert [_attrs(s)["safepoint.effect.outcome"] for s in under(crashed, "dispatch ")] == ["applied"]
    assert first == {crashed.context.span_id}

    assert exported.total("effect.reconciliations", effect__outcome="reconciled") == 1
    assert exported.total("effect.dispatches") == 1
    assert exported.total("steps", step__replayed=True) == 3
    assert exported.total("run.executions", run__status="crashed") == 1
    assert MARKER not in exported.text()


def test_a_blocked_run_counts_a_block(exported: Exported, file_store: sp.Store, crash_at: Any) -> None:
    owner = Owner()
    wf = _ticketing("otel-blocked", owner, reconcile=False)  # no way to settle a crash in flight
    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, wf, "c3", "note", run_id="r3", lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(file_store, "r3")
    blocked = exported.named("run ")[-1]
    assert _attrs(blocked)["safepoint.run.status"] == "blocked"
    assert _attrs(blocked)["safepoint.run.block_phase"] == "reconcile_effect"
    assert blocked.status.status_code is StatusCode.ERROR
    (ticket,) = [s for s in exported.named("step ticket") if s.parent.span_id == blocked.context.span_id]  # type: ignore[union-attr]
    assert _attrs(ticket)["safepoint.step.status"] == "blocked"
    assert exported.total("run.blocks", run__block_phase="reconcile_effect") == 1
    assert exported.total("run.blocks") == 1
    assert exported.total("run.executions", run__status="blocked") == 1


def test_the_metrics_count_what_the_spans_show(exported: Exported, file_store: sp.Store) -> None:
    owner = Owner()
    wf = _ticketing("otel-counts", owner)
    for index in range(3):
        sp.start(file_store, wf, f"c{index}", "note", run_id=f"m{index}")
    sp.start(file_store, wf, "c0", "note", run_id="m0")  # attaches: the recorded result, no execution
    spans = Counter(
        (_attrs(s)["safepoint.step.kind"], _attrs(s)["safepoint.step.replayed"])
        for s in exported.named("step ")
    )
    counted = Counter(
        {
            (attrs["safepoint.step.kind"], attrs["safepoint.step.replayed"]): int(value)
            for attrs, value in exported.points("safepoint.steps")
        }
    )
    assert spans == counted == Counter({(k, False): 3 for k in ("read", "pure", "model", "effect")})
    assert exported.total("effect.dispatches") == len(exported.named("dispatch ")) == 3
    assert exported.total("run.executions") == len(exported.named("run ")) == 3


def test_a_failed_step_records_its_error_as_its_type(exported: Exported, file_store: sp.Store) -> None:
    """The exception's type, on the step's event and status; its message is the caller's code's
    own words, exported only with ``record_values`` (see the tests at the end)."""
    calls: list[str] = []

    def flaky(value: str) -> str:
        calls.append(value)
        if len(calls) == 1:
            raise ValueError("the parser choked")
        return "parsed"

    def broken(value: str) -> str:
        raise ValueError("the parser choked")

    @sp.workflow("otel-failing")
    def failing(run: sp.Run, value: str) -> str:
        run.read("flaky", flaky, value, retry=sp.Retry(attempts=2, backoff=0))
        return run.read("parse", broken, value, retry=1)

    with pytest.raises(sp.StepFailed):
        sp.start(file_store, failing, MARKER, run_id="f1")
    steps = [_attrs(s) for s in exported.named("step ")]
    assert [
        (a["safepoint.step.id"], a["safepoint.step.attempt"], a["safepoint.step.status"]) for a in steps
    ] == [
        ("flaky", 1, "retrying"),
        ("flaky", 2, "completed"),
        ("parse", 1, "failed"),
    ]
    for span in exported.named("step "):
        if _attrs(span)["safepoint.step.status"] == "completed":
            assert not span.events
            assert span.status.status_code is StatusCode.UNSET
            continue
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events
        assert dict(event.attributes or {}) == {"exception.type": "ValueError"}
        assert span.status.description == "ValueError"
    (run_span,) = exported.named("run ")
    assert _attrs(run_span)["safepoint.run.status"] == "failed"
    assert MARKER not in exported.text()


def test_sizes_and_values_are_recorded_only_when_asked(file_store: sp.Store) -> None:
    owner = Owner()
    wf = _ticketing("otel-opt-in", owner)
    for got in _exported(record_sizes=True):
        sp.start(file_store, wf, "c1", f"{MARKER} note", run_id="s1")
        assert MARKER not in got.text()
        (ticket,) = got.named("dispatch ")
        assert _attrs(ticket)["safepoint.effect.payload_size"] > len(MARKER)
        assert _attrs(ticket)["safepoint.effect.receipt_size"] > 0
        sizes = [_attrs(s).get("safepoint.step.result_size") for s in got.named("step ")]
        assert all(isinstance(size, int) and size > 0 for size in sizes)
    for got in _exported(record_values=True):
        sp.start(file_store, wf, "c2", f"{MARKER} note", run_id="s2")
        (ticket,) = got.named("dispatch ")
        assert MARKER in _attrs(ticket)["safepoint.effect.payload"]


def test_values_asked_for_are_redacted_by_the_secret_rules(file_store: sp.Store) -> None:
    key = "sk-live-" + "4eC39HqLyjWDarjtT1zdp7dc"

    def inbox() -> dict[str, str]:
        return {"text": f"use api_key={key} to log in"}

    @sp.workflow("otel-secret")
    def reads(run: sp.Run) -> str:
        return str(run.read("inbox", inbox, secrets="redact")["text"])

    for got in _exported(record_values=True):
        sp.start(file_store, reads, run_id="k1")
        (step,) = got.named("step ")
        assert "use api_key=" in _attrs(step)["safepoint.step.result"]
        assert key not in got.text()


def test_nothing_is_traced_once_uninstrumented(file_store: sp.Store) -> None:
    owner = Owner()
    wf = _ticketing("otel-off", owner)
    for got in _exported():
        spans = got.spans
    sp.start(file_store, wf, "c1", "note", run_id="u1")
    assert spans.get_finished_spans() == ()


def test_an_async_run_on_postgres_is_traced(exported: Exported, pg_url: str, tmp_path: Path) -> None:
    owner = Owner()
    tickets = sp.Effect("ticket.create", execute=owner.execute, reconcile=owner.reconcile)

    async def fetch(case_id: str) -> dict[str, str]:
        await asyncio.sleep(0)
        return {"case": case_id, "body": MARKER}

    @sp.workflow("otel-async")
    async def follow_up(run: sp.AsyncRun, case_id: str) -> str:
        case = await run.read("fetch", fetch, case_id)
        title = await run.pure("title", lambda c: f"{c['body']}!", case)
        receipt = await run.effect("ticket", tickets, payload={"note": title})
        return str(receipt["id"])

    async def main() -> str:
        store = await sp.open_async_store(f"{pg_url}?schema=otel_{tmp_path.name[-8:].lower()}")
        try:
            return str(await sp.start_async(store, follow_up, "c9", run_id="a1"))
        finally:
            await store.close()

    assert asyncio.run(main()) == "t-1"
    (run_span,) = exported.named("run ")
    assert _attrs(run_span)["safepoint.run.status"] == "completed"
    kinds = [_attrs(s)["safepoint.step.kind"] for s in exported.named("step ")]
    assert kinds == ["read", "pure", "effect"]
    for span in [*exported.named("step "), *exported.named("dispatch ")]:
        assert span.parent is not None
        assert span.parent.span_id == run_span.context.span_id
    assert MARKER not in exported.text()
    assert json.loads(run_span.to_json())["attributes"]["safepoint.run.id"] == "a1"


def test_a_wait_is_a_step_that_waits_then_receives(exported: Exported, file_store: sp.Store) -> None:
    @sp.workflow("otel-wait")
    def asks(run: sp.Run) -> str:
        answer = run.wait_for("manager.answer")
        return str(answer["ok"])

    with pytest.raises(sp.AwaitingMessage):
        sp.start(file_store, asks, run_id="w1")
    sp.send(file_store, "w1", "manager.answer", {"ok": MARKER})
    assert sp.resume(file_store, "w1") == MARKER
    assert sp.resume(file_store, "w1") == MARKER  # ended: the recorded result, no execution

    assert [_attrs(s)["safepoint.run.status"] for s in exported.named("run ")] == ["waiting", "completed"]
    waits = [
        (_attrs(s)["safepoint.step.kind"], _attrs(s)["safepoint.step.status"])
        for s in exported.named("step ")
    ]
    assert waits == [("wait", "waiting"), ("wait", "completed")]
    waiting = exported.named("step ")[0]
    assert waiting.status.status_code is StatusCode.UNSET  # a pause, not a fault
    assert exported.total("run.executions", run__status="waiting") == 1
    assert MARKER not in exported.text()


def test_the_engine_never_imports_opentelemetry_unless_instrumented(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    script = (
        "import sys\n"
        "import safepoint as sp\n"
        "@sp.workflow('plain')\n"
        "def plain(run):\n"
        "    return run.pure('one', lambda: 1)\n"
        f"store = sp.open_store({url!r})\n"
        "assert sp.start(store, plain, run_id='p') == 1\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_fan_out_branches_and_a_worker_are_traced(exported: Exported, file_store: sp.Store) -> None:
    @sp.workflow("otel-fan-out")
    def prices(run: sp.Run) -> dict[str, Any]:
        branches = {
            region: (lambda b, r=region: b.read("price", fetch_case, r)) for region in ("eu", "us", "jp")
        }
        return run.parallel("fetch", branches)

    sp.submit(file_store, prices, run_id="fan")
    stats = sp.Worker(file_store).run(until_idle=True, handle_signals=False)
    assert stats.completed == 1

    (run_span,) = exported.named("run ")
    assert run_span.parent is None  # a worker's claim starts a trace of its own
    assert _attrs(run_span)["safepoint.run.status"] == "completed"
    steps = exported.named("step ")
    assert sorted(_attrs(s)["safepoint.step.id"] for s in steps) == [
        "fetch.eu/price",
        "fetch.jp/price",
        "fetch.us/price",
    ]
    for step in steps:
        assert step.parent is not None
        assert step.parent.span_id == run_span.context.span_id
    assert exported.total("steps", step__kind="read") == 3
    assert MARKER not in exported.text()


def test_each_run_of_a_continued_chain_is_an_execution_of_its_own(
    exported: Exported, file_store: sp.Store
) -> None:
    @sp.workflow("otel-chain")
    def counts(run: sp.Run, left: int) -> int:
        run.pure("tick", lambda n: n, left)
        if left > 0:
            run.continue_as_new(left - 1)
        return left

    assert sp.start(file_store, counts, 1, run_id="chain") == 0
    runs = exported.named("run ")
    assert [_attrs(s)["safepoint.run.status"] for s in runs] == ["continued", "completed"]
    first, second = (_attrs(s)["safepoint.run.id"] for s in runs)
    assert first == "chain"
    assert second != first
    for run_span in runs:
        (tick,) = [
            s for s in exported.named("step ") if s.parent and s.parent.span_id == run_span.context.span_id
        ]
        assert _attrs(tick)["safepoint.run.id"] == _attrs(run_span)["safepoint.run.id"]


@sp.workflow("otel-sealed")
def _sealed(run: sp.Run, case: str) -> str:
    note = str(run.pure("note", lambda: f"the-plaintext-note of {case}"))
    return str(run.pure("echo", lambda: note))


def test_a_run_whose_key_this_worker_lacks_is_interrupted_not_blocked(
    exported: Exported, tmp_path: Path, crash_at: Any
) -> None:
    """A process without the key a run's steps are sealed with gives the run back (one with the
    keyring carries it on): its execution's span says ``interrupted``, no block is counted, and
    the exception names the key and the place, never the value."""
    from safepoint.errors import KeyUnavailable
    from safepoint.storage import Encrypted, Keyring, open_store

    url = f"sqlite:///{tmp_path / 'sealed.db'}"
    plain = open_store(url)
    sp.submit(plain, _sealed, "c1", run_id="sealed-1")  # its inputs stored before the keyring
    plain.close()
    keyed = open_store(url, codec=Encrypted(Keyring({"k1": Keyring.new_key()}, "k1")))
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.resume(keyed, "sealed-1", lease_ms=0)  # its steps are sealed with k1
    crash_at(None)
    exported.spans.clear()
    lacking = open_store(url, codec=Encrypted(Keyring({"k9": Keyring.new_key()}, "k9")))
    with pytest.raises(KeyUnavailable):
        sp.resume(lacking, "sealed-1")
    (span,) = exported.named("run ")
    assert _attrs(span)["safepoint.run.status"] == "interrupted"
    assert "safepoint.run.block_phase" not in _attrs(span)
    assert exported.total("run.blocks") == 0
    (event,) = [event for event in span.events if event.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "KeyUnavailable"
    assert "'k1'" in str(event.attributes["exception.message"])
    assert "the-plaintext-note" not in json.dumps([dict(e.attributes or {}) for e in span.events])
    assert keyed.get_run("sealed-1").recovery_record is None  # not blocked
    lacking.close()
    keyed.close()


# -- what a failure exports: the caller's data only when asked -----------------------------------


def _rejected(payload: Any, key: sp.EffectKey) -> Any:
    raise sp.Rejected({"why": f"{MARKER} is over the card's limit"})


def _never_left(payload: Any, key: sp.EffectKey) -> Any:
    raise sp.NotSent(f"{MARKER} refused the connection")


def _choked(value: str) -> str:
    raise ValueError(f"the parser choked on {value}")


_refunds = sp.Effect("refund", execute=_rejected)
_emails = sp.Effect("email", execute=_never_left, max_dispatches=1)


@sp.workflow("otel-evidence")
def _evidence_sync(run: sp.Run, case: str, what: str) -> Any:
    if what == "rejection":
        return run.effect("refund", _refunds, payload={"case": case})
    if what == "not_sent":
        return run.effect("email", _emails, payload={"case": case})
    return run.read("parse", _choked, case, retry=1)


@sp.workflow("otel-evidence-async")
async def _evidence_async(run: sp.AsyncRun, case: str, what: str) -> Any:
    if what == "rejection":
        return await run.effect("refund", _refunds, payload={"case": case})
    if what == "not_sent":
        return await run.effect("email", _emails, payload={"case": case})
    return await run.read("parse", _choked, case, retry=1)


def _failures(url: str, mode: str) -> list[str]:
    """A rejection (its evidence), a step whose error message holds the caller's data, and an
    effect whose owner was never reached (the NotSent's reason), each a run of its own on a
    sealed ledger at ``url``, carried out ``mode`` (sync or async): how each run ended."""
    from safepoint import errors
    from safepoint.storage import Encrypted, Keyring

    codec = Encrypted(Keyring({"k1": Keyring.new_key()}, "k1"))
    ended: list[str] = []
    cases = ("rejection", "error", "not_sent")
    expected = (errors.EffectRejected, sp.StepFailed, sp.RunFailed)
    if mode == "sync":
        store = sp.open_store(url, codec=codec)
        try:
            for what, raised in zip(cases, expected, strict=True):
                with pytest.raises(raised):
                    sp.start(store, _evidence_sync, f"{MARKER} case", what, run_id=f"{what}-sync")
                ended.append(store.get_run(f"{what}-sync").status.value)
        finally:
            store.close()
        return ended

    async def main() -> None:
        store: Any = (
            await sp.open_async_store(url, codec=codec)
            if url.startswith("postgresql")
            else sp.open_store(url, codec=codec)
        )
        try:
            for what, raised in zip(cases, expected, strict=True):
                with pytest.raises(raised):
                    await sp.start_async(
                        store, _evidence_async, f"{MARKER} case", what, run_id=f"{what}-async"
                    )
                ended.append((await _maybe(store.get_run(f"{what}-async"))).status.value)
        finally:
            await _maybe(store.close())

    asyncio.run(main())
    return ended


async def _maybe(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failure_exports_no_evidence_reason_or_message_unless_values_are_asked_for(
    store_url: str, mode: str
) -> None:
    """A rejection's evidence, a NotSent's reason and an error message that holds the caller's
    data are the caller's data, as a payload is: on no span attribute, status description or
    event unless ``record_values=True`` — then they are, as a payload is."""
    for got in _exported():
        assert _failures(store_url, mode) == ["failed", "failed", "failed"]
        failing = [s for s in got.finished() if s.status.status_code is StatusCode.ERROR]
        assert {s.name for s in failing} >= {
            "dispatch refund",
            "step _choked",
            "run otel-evidence" + ("" if mode == "sync" else "-async"),
        }
        for span in failing:  # each says what failed, by type
            (event,) = [e for e in span.events if e.name == "exception"]
            assert (event.attributes or {})["exception.type"]
            assert span.status.description
        assert MARKER not in got.text()
    for got in _exported(record_values=True):  # asked for: the messages are exported
        _failures(store_url.replace("ledger.db", "asked.db").replace("?schema=t_", "?schema=v_"), mode)
        text = got.text()
        for said in ("is over the card's limit", "refused the connection", "the parser choked on"):
            assert f"{MARKER} {said}" in text or f"{said} {MARKER}" in text, said
