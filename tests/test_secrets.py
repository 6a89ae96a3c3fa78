"""Credentials never enter the ledger: refused on the way in, redacted from error messages,
and passed to steps as Secret without being recorded or hashed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint._secrets import find_secret, redact

OPENAI = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
STRIPE = "sk_live_" + "51HxYzAbCdEfGhIjKlMnOp"
GITHUB = "ghp_" + "a" * 36
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


@pytest.mark.parametrize("value", [
    {"api_key": "0123456789abcdef"}, {"db_password": "hunter2hunter2"},
    {"headers": {"Authorization": "Basic dXNlcjpwYXNz"}}, {"client_secret": "abcdefgh12"},
    OPENAI, STRIPE, GITHUB, AWS, JWT, f"curl -H 'Authorization: Bearer {'x' * 32}'",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE...", ["fine", {"nested": f"key={OPENAI}"}],
    sp.Secret("anything"),
])
def test_credentials_are_found(value: Any) -> None:
    assert find_secret(value) is not None


@pytest.mark.parametrize("value", [
    {"usage": {"input_tokens": 12, "output_tokens": 5}}, {"token_type": "bearer"},
    {"password": "********"}, {"next_page_token": 42}, "a sketch of the plan", "skip-the-line",
    {"text": "the bearer of bad news"}, {"id": "ch_1", "object": "charges"},
])
def test_ordinary_values_pass(value: Any) -> None:
    assert find_secret(value) is None


def test_redact_keeps_the_message_readable() -> None:
    assert redact(f"401 for key {OPENAI}: rejected") == "401 for key [redacted]: rejected"


def test_a_secret_is_never_printed_or_pickled() -> None:
    secret = sp.Secret("hunter2")
    assert "hunter2" not in repr(secret)
    assert "hunter2" not in str(secret)
    assert "hunter2" not in f"{secret}"
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    assert secret.reveal() == "hunter2"


def _ledger_bytes(store: sp.Store) -> bytes:
    """Every byte the SQLite store has written, WAL included."""
    path = Path(store.url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_a_credential_in_a_result_is_refused_and_never_written(file_store: sp.Store) -> None:
    @sp.workflow("leaky-read")
    def flow(run: sp.Run) -> Any:
        return run.read("config", lambda: {"service": "billing", "api_key": OPENAI})

    with pytest.raises(sp.SecretRefused) as refused:
        sp.start(file_store, flow, run_id="r")
    assert (refused.value.step_id, refused.value.path) == ("config", "$.api_key")
    assert file_store.load_ledger("r").steps == {}
    assert OPENAI.encode() not in _ledger_bytes(file_store)


def test_a_credential_in_a_payload_is_refused_before_anything_is_prepared(
        file_store: sp.Store) -> None:
    sent: list[Any] = []
    effect = sp.Effect("email", execute=lambda payload, key: sent.append(payload) or {"ok": 1})

    @sp.workflow("leaky-payload")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={"to": "ops", "body": f"use {STRIPE}"})

    with pytest.raises(sp.SecretRefused):
        sp.start(file_store, flow, run_id="r")
    assert sent == []
    assert file_store.load_ledger("r").operations == {}
    assert STRIPE.encode() not in _ledger_bytes(file_store)


def test_workflow_inputs_with_a_credential_are_refused(memory_store: sp.Store) -> None:
    @sp.workflow("leaky-inputs")
    def flow(run: sp.Run, token: str) -> str:
        return "done"

    with pytest.raises(sp.SecretRefused):
        sp.start(memory_store, flow, GITHUB, run_id="r")
    with pytest.raises(sp.RunNotFound):
        memory_store.get_run("r")  # nothing was created


def test_a_secret_reaches_the_step_but_not_the_ledger(file_store: sp.Store,
                                                      crash_at: Any) -> None:
    from safepoint._crashpoints import SimulatedCrash

    seen: list[str] = []

    def fetch(invoice: str, api_key: sp.Secret) -> dict[str, str]:
        seen.append(api_key.reveal())
        return {"invoice": invoice, "status": "paid"}

    key = {"value": "k-" + "z" * 30}

    @sp.workflow("uses-a-secret")
    def flow(run: sp.Run) -> Any:
        return run.read("invoice", fetch, "inv_1", api_key=sp.Secret(key["value"]))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    key["value"] = "k-" + "y" * 30  # the key was rotated: the recorded read still answers
    assert sp.resume(file_store, "r") == {"invoice": "inv_1", "status": "paid"}
    assert seen == ["k-" + "z" * 30]
    assert b"zzzzzzzzzz" not in _ledger_bytes(file_store)


def test_error_messages_are_redacted(file_store: sp.Store) -> None:
    def call_api() -> None:
        raise PermissionError(f"401 Unauthorized for key {OPENAI}")

    @sp.workflow("leaky-error")
    def flow(run: sp.Run) -> Any:
        return run.read("call", call_api)

    with pytest.raises(sp.StepFailed) as failed:
        sp.start(file_store, flow, run_id="r")
    assert "[redacted]" in failed.value.error_message
    assert file_store.load_ledger("r").steps["call"].error["message"].endswith("[redacted]")
    assert OPENAI.encode() not in _ledger_bytes(file_store)
