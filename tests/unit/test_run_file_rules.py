"""The run file (``_rules.run_file``): what a document that cannot be read is refused with —
``RunFileInvalid``, naming the place and what to do, the document left as it was — how a payload
whose stored bytes are not canonical JSON is carried whole, and the published JSON Schema, held
to the records it describes."""

from __future__ import annotations

import copy
import dataclasses
import json
import typing
from collections.abc import Callable, Iterator
from enum import StrEnum
from importlib import resources
from typing import Any

import jsonschema
import pytest

import safepoint as sp
from run_file_flows import record_every_part
from safepoint._rules.canonical import canonical, digest
from safepoint._rules.run_file import FORMAT, VERSION, RecordedRun, recorded_run, run_document
from safepoint.errors import RunFileInvalid, UsageError
from safepoint.types import (
    ApprovalRecord,
    AttemptRecord,
    EffectState,
    EventRecord,
    MessageRecord,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepRecord,
)


@pytest.fixture(scope="module")
def document() -> Iterator[dict[str, Any]]:
    """The run file of a run with something in every part, through JSON text."""
    store = sp.open_store("memory:")
    record_every_part(store, "r")
    yield json.loads(json.dumps(sp.export_run(store, "r")))
    store.close()


def refused(document: Any) -> RunFileInvalid:
    """The error reading ``document`` raises; the document itself is left as it was given."""
    given = copy.deepcopy(document)
    with pytest.raises(RunFileInvalid) as caught:
        recorded_run(document)
    assert document == given
    assert isinstance(caught.value, UsageError)
    return caught.value


def changed(document: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    change(copied)
    return copied


def test_a_document_reads_back_to_the_records_it_was_written_from(document: dict[str, Any]) -> None:
    given = copy.deepcopy(document)
    recorded = recorded_run(document)
    assert document == given
    assert json.loads(json.dumps(run_document(recorded))) == document
    assert recorded.run.status is RunStatus.COMPLETED
    assert recorded.run.step_attempts == sp.Retry(attempts=2, backoff=0.0)
    assert {type(op.state) for op in recorded.operations.values()} == {EffectState}
    recorded.steps["read.quote"].result["case"] = "changed"  # the records share nothing with it
    assert document == given


def test_what_is_not_a_json_object_is_no_run_file() -> None:
    for value in ([], "safepoint.run", None, 1):
        error = refused(value)
        assert error.path == "$"
        assert "not a JSON object" in error.message


def test_another_format_is_no_run_file(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d.update(format="safepoint.recovery")))
    assert error.path == "format"
    assert "'safepoint.recovery', not 'safepoint.run'" in error.message
    assert refused(changed(document, lambda d: d.pop("format"))).path == "format"


def test_a_newer_version_asks_for_a_newer_safepoint(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d.update(version=VERSION + 1)))
    assert error.path == "version"
    assert f"version {VERSION + 1}" in error.message
    assert f"reads versions up to {VERSION}" in error.message
    assert "upgrade safepoint" in error.message
    for version in ("1", 0, 1.0, True, None):
        assert refused(changed(document, lambda d, v=version: d.update(version=v))).path == "version"


def test_a_part_missing_or_unknown_is_named(document: dict[str, Any]) -> None:
    assert refused(changed(document, lambda d: d.pop("events"))).path == "events"
    assert refused(changed(document, lambda d: d.update(notes=[]))).path == "notes"
    assert refused(changed(document, lambda d: d.update(steps={}))).path == "steps"


def test_a_field_missing_is_named_by_its_path(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["steps"][3].pop("kind")))
    assert error.path == "steps[3].kind"
    assert error.message.startswith("run file refused at steps[3].kind: is missing; export the run again")
    assert refused(changed(document, lambda d: d["operations"][1].pop("payload"))).path == (
        "operations[1].payload"
    )
    assert refused(changed(document, lambda d: d["run"]["step_attempts"].pop("jitter"))).path == (
        "run.step_attempts.jitter"
    )


def test_a_field_no_record_has_is_refused_rather_than_dropped(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["events"][2].update(colour="red")))
    assert error.path == "events[2].colour"
    assert f"no field of EventRecord in a run file of version {VERSION}" in error.message


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("run", "fence"), "7", "a string, not an integer"),
        (("run", "fence"), 7.0, "a number, not an integer"),
        (("run", "owner"), 3, "an integer, not a string"),
        (("run", "cost_spent"), True, "a boolean, not a finite number"),
        (("operations", 0, "approval_required"), "yes", "a string, not true or false"),
        (("steps", 0, "error"), [], "an array, not an object"),
        (("approvals", 0, "approved_at"), None, "null, not an integer"),
    ],
)
def test_a_field_of_another_type_is_refused(
    document: dict[str, Any], path: tuple[str | int, ...], value: Any, said: str
) -> None:
    def put(d: dict[str, Any]) -> None:
        target: Any = d
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    error = refused(changed(document, put))
    assert error.path == ".".join(str(p) for p in path).replace(".0.", "[0].")
    assert said in error.message


def test_a_value_no_json_holds_is_refused_where_it_is(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["steps"][0]["result"].update(rate=float("nan"))))
    assert error.path == "steps[0].result.rate"
    assert "not a JSON value" in error.message


def test_an_enum_value_this_safepoint_does_not_know_is_refused(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["steps"][3].update(kind="telepathy")))
    assert error.path == "steps[3].kind"
    assert "'telepathy' is not a StepKind this safepoint knows (pure, read," in error.message
    assert "upgrade safepoint" in error.message
    assert refused(changed(document, lambda d: d["run"].update(status="paused"))).path == "run.status"
    assert refused(changed(document, lambda d: d["operations"][0].update(state=1))).path == (
        "operations[0].state"
    )


def test_a_payload_that_is_not_the_one_recorded_is_refused(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["operations"][0]["payload"].update(amount=13)))
    assert error.path == "operations[0].payload"
    assert f"not its payload_ref {document['operations'][0]['payload_ref']}" in error.message
    moved = refused(changed(document, lambda d: d["operations"][0].update(payload_ref="sha256:" + "0" * 64)))
    assert moved.path == "operations[0].payload"


def test_a_record_of_another_run_or_twice_is_refused(document: dict[str, Any]) -> None:
    assert refused(changed(document, lambda d: d["events"][0].update(run_id="other"))).path == (
        "events[0].run_id"
    )
    assert refused(changed(document, lambda d: d["steps"].append(d["steps"][0]))).path == (
        f"steps[{len(document['steps'])}].step_id"
    )
    error = refused(
        changed(document, lambda d: d["attempts"].update({"model.draft": d["attempts"]["read.quote"]}))
    )
    assert error.path == 'attempts["model.draft"][0].step_id'


def test_a_step_attempts_policy_retry_refuses_is_refused(document: dict[str, Any]) -> None:
    error = refused(changed(document, lambda d: d["run"]["step_attempts"].update(attempts=0)))
    assert error.path == "run.step_attempts"
    assert "attempts counts every call" in error.message


def _op(payload_ref: str) -> OperationRecord:
    return OperationRecord("r", f"op-{payload_ref[-6:]}", "s", "e", EffectState.PREPARED, payload_ref, "k")


def _run() -> RunRecord:
    return RunRecord(
        "r", "wf", "wf@1", RunStatus.RUNNING, "h", {}, 1, None, None, 1, 0, 0, None, None, None, 1, 1
    )


@pytest.mark.parametrize(
    "stored",
    [b'{"b": 1, "a": 2}', b"\x00\xff not utf-8 \xfe", b"NaN", b"[9007199254740993]"],
    ids=["not canonical", "not JSON", "NaN", "past 2**53"],
)
def test_payload_bytes_that_are_not_canonical_json_are_carried_whole(stored: bytes) -> None:
    """A store keeps whatever bytes its caller gives (the engine gives canonical JSON): the
    file carries them whole, beside the JSON value they hold, if any."""
    op = _op(digest(stored))
    recorded = RecordedRun(_run(), operations={op.operation_id: op}, payloads={op.payload_ref: stored})
    document = json.loads(json.dumps(run_document(recorded)))
    [entry] = document["operations"]
    assert entry["payload"] == (json.loads(stored) if stored.startswith(b"{") else None)
    assert "payload_base64" in entry
    assert recorded_run(document) == recorded
    entry["payload_base64"] = entry["payload_base64"][:-4]
    assert refused(document).path == "operations[0].payload_base64"


def test_a_canonical_payload_is_carried_as_its_value_alone() -> None:
    stored = canonical({"amount": 12.5, "note": "café"})
    op = _op(digest(stored))
    recorded = RecordedRun(_run(), operations={op.operation_id: op}, payloads={op.payload_ref: stored})
    [entry] = run_document(recorded)["operations"]
    assert entry["payload"] == {"amount": 12.5, "note": "café"}
    assert "payload_base64" not in entry
    entry["payload_base64"] = "e30="  # {}: bytes that are not the payload's
    assert refused({**run_document(recorded), "operations": [entry]}).path == "operations[0].payload_base64"


# -- the published schema ------------------------------------------------------------------------


def schema() -> dict[str, Any]:
    text = resources.files("safepoint").joinpath("schemas", f"run-file.v{VERSION}.schema.json")
    loaded: dict[str, Any] = json.loads(text.read_text("utf-8"))
    return loaded


def test_an_exported_document_is_valid_under_the_published_schema(document: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(document, schema(), cls=jsonschema.Draft202012Validator)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(changed(document, lambda d: d["steps"][0].pop("seq")), schema())
    assert schema()["properties"]["format"] == {"const": FORMAT}
    assert schema()["properties"]["version"] == {"const": VERSION}


RECORDS = {
    "run": RunRecord,
    "step": StepRecord,
    "operation": OperationRecord,
    "attempt": AttemptRecord,
    "approval": ApprovalRecord,
    "message": MessageRecord,
    "event": EventRecord,
}


@pytest.mark.parametrize("name", RECORDS)
def test_the_schema_describes_every_field_of_every_record(name: str) -> None:
    """A record that gains a field fails here until the schema says it — and a field added to a
    record is a new version of the run file (the module's docstring: a reader of this version
    would drop it)."""
    cls = RECORDS[name]
    described = schema()["$defs"][name]
    fields = [f.name for f in dataclasses.fields(cls)]
    extra = ["payload"] if name == "operation" else []
    assert described["required"] == fields + extra
    assert list(described["properties"]) == fields + extra + (["payload_base64"] if extra else [])
    assert described["additionalProperties"] is False
    hints = typing.get_type_hints(cls)
    for field_name in fields:
        hint = hints[field_name]
        kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
        if isinstance(kinds[0], type) and issubclass(kinds[0], StrEnum):
            listed = described["properties"][field_name]["enum"]
            assert [v for v in listed if v is not None] == [m.value for m in kinds[0]], field_name
