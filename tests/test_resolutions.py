"""A person settles a blocked run: mark applied (with the owner's receipt), mark not applied,
or abandon — checked against the state revision, recorded, and harmless to repeat."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint.cli import cli
from safepoint.testing.effects import owner_effect
from safepoint.testing.owner import OwnerService


def _blocked_notify(store: sp.Store, owner: OwnerService, name: str) -> sp.RunRecord:
    """A notification whose response was lost: no read path, so the run blocks."""
    effect = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow(name)
    def flow(run: sp.Run) -> Any:
        receipt = run.effect("notify", effect, payload={"to": "ops"})
        return {"sent": receipt["id"]}

    owner.client.set_faults(drop_after_commit=1)
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert run.status is sp.RunStatus.BLOCKED
    return run


def test_mark_applied_carries_the_run_on_from_the_receipt(store_url: str,
                                                          owner_env: OwnerService) -> None:
    store = sp.open_store(store_url)
    run = _blocked_notify(store, owner_env, "resolve-applied")
    revision = run.recovery_record["state_revision"]
    resolved = sp.resolve(store, "r", "applied", revision=revision, by="ana",
                          receipt={"id": "nt_1"}, evidence="seen in the provider's log")
    assert (resolved.status, resolved.owner) == (sp.RunStatus.RUNNING, None)
    # repeating the same decision is harmless
    assert sp.resolve(store, "r", "applied", revision=revision, by="ana",
                      receipt={"id": "nt_1"}, evidence="seen in the provider's log"
                      ).state_revision == resolved.state_revision
    assert sp.resume(store, "r") == {"sent": "nt_1"}
    assert owner_env.client.stats()["applied"] == 1  # nothing was sent again
    event = [e for e in store.events("r") if e.kind == "run.resolved"]
    assert len(event) == 1
    assert (event[0].worker, event[0].detail["evidence"]) == ("ana", "seen in the provider's log")


def test_mark_not_applied_dispatches_again_under_the_same_key(memory_store: sp.Store) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        if len(keys) == 1:
            raise TimeoutError("no answer")
        return {"id": "tk_1"}

    effect = sp.Effect("ticket", execute=execute)

    @sp.workflow("resolve-not-applied")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", effect, payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    revision = memory_store.get_run("r").recovery_record["state_revision"]
    sp.resolve(memory_store, "r", sp.ResolutionAction.NOT_APPLIED, revision=revision, by="bo")
    assert sp.resume(memory_store, "r") == {"id": "tk_1"}
    assert len(keys) == 2
    assert len(set(keys)) == 1  # never a fresh key


def test_abandon_ends_the_run_cancelled(memory_store: sp.Store, owner_env: OwnerService) -> None:
    run = _blocked_notify(memory_store, owner_env, "resolve-abandon")
    sp.resolve(memory_store, "r", "abandon", revision=run.state_revision, by="cy",
               evidence="customer withdrew")
    ended = memory_store.get_run("r")
    assert ended.status is sp.RunStatus.CANCELLED
    assert ended.error == {"type": "Abandoned", "message": "abandoned by cy: customer withdrew"}
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")


def test_a_decision_on_a_stale_record_is_refused(memory_store: sp.Store,
                                                 owner_env: OwnerService) -> None:
    run = _blocked_notify(memory_store, owner_env, "resolve-stale")
    with pytest.raises(sp.ResolutionRefused, match="moved on"):
        sp.resolve(memory_store, "r", "abandon", revision=run.state_revision - 1, by="dee")
    with pytest.raises(sp.UsageError, match="receipt"):
        sp.resolve(memory_store, "r", "applied", revision=run.state_revision, by="dee")
    with pytest.raises(sp.SecretRefused):
        sp.resolve(memory_store, "r", "applied", revision=run.state_revision, by="dee",
                   receipt={"id": "nt_1", "api_key": "sk_live_0123456789abcdefXYZ"})
    assert memory_store.get_run("r").status is sp.RunStatus.BLOCKED  # nothing changed
    sp.resolve(memory_store, "r", "abandon", revision=run.state_revision, by="dee")
    with pytest.raises(sp.ResolutionRefused, match="not blocked"):
        sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision + 1, by="eve")


def test_resolve_from_the_command_line(file_store: sp.Store, owner_env: OwnerService) -> None:
    run = _blocked_notify(file_store, owner_env, "resolve-cli")
    url = file_store.url
    runner = CliRunner()
    refused = runner.invoke(cli, ["--store", url, "resolve", "r", "--applied", "--revision",
                                  str(run.state_revision), "--by", "fay"])
    assert refused.exit_code == 1
    assert "receipt" in refused.output
    done = runner.invoke(cli, ["--store", url, "resolve", "r", "--applied", "--receipt",
                               '{"id": "nt_1"}', "--revision", str(run.state_revision),
                               "--by", "fay", "--evidence", "provider log"])
    assert done.exit_code == 0, done.output
    assert "now running" in done.output
    assert file_store.get_run("r").status is sp.RunStatus.RUNNING


def test_recovery_records_match_the_published_schema(memory_store: sp.Store,
                                                     owner_env: OwnerService) -> None:
    import jsonschema

    from safepoint._recovery import record_schema

    run = _blocked_notify(memory_store, owner_env, "record-schema")
    schema = record_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(run.recovery_record, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema can say no
        jsonschema.validate({**run.recovery_record, "phase": "improvised"}, schema)
