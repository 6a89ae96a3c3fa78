"""Credentials never enter the ledger: refused on the way in, redacted from error messages,
and passed to steps as Secret without being recorded or hashed."""

from __future__ import annotations

import hashlib
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint._rules.secrets import find_secret, marker, redact_json, redact_text, refuse_secrets
from safepoint.errors import EffectRejected, RunNotFound, SecretRefused
from safepoint.types import RunStatus

ANTHROPIC = "sk-ant-api03-" + "Q" * 30
OPENAI = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
STRIPE = "sk_live_" + "51HxYzAbCdEfGhIjKlMnOp"
GITHUB = "ghp_" + "a" * 36
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


FOUND = [
    {"api_key": "0123456789abcdef"},
    {"db_password": "hunter2hunter2"},
    {"headers": {"Authorization": "Basic dXNlcjpwYXNz"}},
    {"client_secret": "abcdefgh12"},
    OPENAI,
    STRIPE,
    GITHUB,
    AWS,
    JWT,
    f"curl -H 'Authorization: Bearer {'x' * 32}'",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE...",
    ["fine", {"nested": f"key={OPENAI}"}],
    sp.Secret("anything"),
    # a value given to a credential's name, in text
    "password=hunter2hunter2",
    "connect failed: db_password=pw1 host=db",
    "--password=pw1",
    "GET /v1/items?api_key=abc123&page=2",
    "https://x.io/cb#access_token=abc&state=1",
    "client_secret=c1",
    "token=t1",
    "passwd=p1",
    "pwd=p1",
    "apikey=k1",
    "secret: s1",
    "password: hunter2 was rejected",
    "password=hunter2... was rejected",
    "new password: correcthorse",
    'password = "hunter2"',
    "DB_PASSWORD=hunter2",
    "API key: abc123",
    "X-Api-Key: abc123",
    "login failed for {'user': 'bob', 'password': 'x'}",
    'bad body {"password": "pw1"}',
    '{\\"password\\": \\"pw1\\"}',
    "{'password': ['a', 'b']}",
    "{'password': {'value': 'v'}}",
    "{'password': 1234}",
    "Cookie: sid=abc; theme=dark",
    "Set-Cookie: sid=abc; Path=/; HttpOnly",
    "Authorization: Bearer short",
    "Authorization: token ghx",
    "authorization: abc123",
    "redis://:pw@localhost:6379/0",
    "postgresql://u:pw@h/db",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    # everything under a credential's key, however short, however nested
    {"password": "pw1"},
    {"password": "x"},
    {"password": 1234},
    {"password": ["x"]},
    {"password": {"value": "v"}},
    {"auth": {"client_secret": "c"}},
    [[[{"passwords": ["a"]}]]],
    # header dicts, any case
    {"Cookie": "sid=abc"},
    {"headers": {"set-cookie": ["a=b"]}},
    {"X-API-KEY": "k"},
    {"cookies": {"sid": "abc"}},
    {"cookie": "abc123def"},
    {"Authorization": "Bearer x"},
    {"name": "Cookie", "value": "sid=1"},  # a header as HAR and form fields hold it
    # a credential used as a dict key
    {OPENAI: 1},
    {"ok": {"password=hunter2": True}},
]


@pytest.mark.parametrize("value", FOUND)
def test_credentials_are_found(value: Any) -> None:
    assert find_secret(value) is not None


@pytest.mark.parametrize(
    "value",
    [
        {"usage": {"input_tokens": 12, "output_tokens": 5}},
        {"token_type": "bearer"},
        {"password": "********"},
        {"next_page_token": 42},
        "a sketch of the plan",
        "skip-the-line",
        {"text": "the bearer of bad news"},
        {"id": "ch_1", "object": "charges"},
        # what agents record every day
        {"max_tokens": 100},
        {"token_count": 5},
        {"token": "Hello", "logprob": -0.2},
        {"logprobs": [{"token": "pass", "top_logprobs": [{"token": "word", "logprob": -1}]}]},
        {"next_page_token": "abc"},
        "next_page_token=abc",
        "pageToken=CAUQAA",
        "max_tokens=100",
        "tokens_used: 12",
        "input_tokens: 12, output_tokens: 5",
        "keyword=abc",
        "key: value",
        "please send a password reset email",
        "Password: reset it from the login page",
        "The secret: practice daily.",
        "The token: a unit of text",
        "is_secret=True",
        "basic understanding of the problem",
        "Authorization: required for this endpoint",
        "Set the Authorization: header",
        "see http://localhost:8080/path",
        "PWD=/home/ops",
        "ASIAPACIFICSOUTHEAST1",
        "task-abcdefghijklmnopqrstuvwxyz",
        {"cookie": "chocolate chip"},
        # placeholders under a credential's key, and code that names where a credential comes from
        {"password": ""},
        {"password": None},
        {"secret": False},
        {"password": "<your password>"},
        {"password": "${DB_PASSWORD}"},
        "password=${DB_PASSWORD}",
        "password=<password>",
        {"password": "sp_redacted:sha256:0123456789abcdef"},
        "Authorization: Bearer <token>",
        "api_key=os.getenv('OPENAI_API_KEY')",
        "client = OpenAI(api_key=api_key)",
        "password=settings.DB_PASSWORD",
        "token=token",
        "api_key=API_KEY",
        "if password == typed:",
        {"password_hint": "pet name"},
        {"secret_name": "prod/db"},
        {"api_key_id": "k_1"},
        {"private_key_id": "abc"},
        "export OPENAI_API_KEY=your-key-here",
        "export OPENAI_API_KEY=sk-proj-...",
        {"password": "your password"},
    ],
)
def test_ordinary_values_pass(value: Any) -> None:
    assert find_secret(value) is None


def test_the_marker_is_a_stable_digest_of_the_credential() -> None:
    digest = hashlib.sha256(OPENAI.encode()).hexdigest()[:16]
    assert marker(OPENAI) == f"sp_redacted:sha256:{digest}"
    assert redact_text(f"a {OPENAI} b {OPENAI}") == f"a {marker(OPENAI)} b {marker(OPENAI)}"
    assert redact_json({"password": "pw1"}) == {"password": marker("pw1")}
    assert redact_text("password=pw1") == f"password={marker('pw1')}"  # the same everywhere


@pytest.mark.parametrize("value", FOUND)
def test_what_is_redacted_is_no_credential_any_more(value: Any) -> None:
    redacted = redact_json(value)
    assert find_secret(redacted) is None
    assert redact_json(redacted) == redacted  # a replay of a redacted value sees it unchanged


def test_redaction_keeps_the_structure_and_copies_only_what_it_changes() -> None:
    clean = {"rows": [{"id": 1}], "usage": {"input_tokens": 3}}
    assert redact_json(clean) is clean
    value = {
        "keep": clean,
        "request": {"headers": ({"Cookie": "sid=abc", "Accept": "*/*"},)},
        OPENAI: {"password": "pw1"},
    }
    assert redact_json(value) == {
        "keep": clean,
        "request": {"headers": [{"Cookie": marker("sid=abc"), "Accept": "*/*"}]},
        marker(OPENAI): {"password": marker("pw1")},
    }
    assert redact_json(value)["keep"] is clean
    assert value["request"]["headers"][0]["Cookie"] == "sid=abc"  # the original is untouched


def test_a_refusal_names_the_place_but_never_the_credential() -> None:
    for value, path in [
        ({"a": [{OPENAI: 1}]}, f"$.a[0].{marker(OPENAI)}"),
        ({"db": {"password": "pw1"}}, "$.db.password"),
        ({f"note {OPENAI}": 1}, f"$.note {marker(OPENAI)}"),
        (OPENAI, "$"),
    ]:
        with pytest.raises(SecretRefused) as refused:
            refuse_secrets(value, "the run id")
        assert refused.value.path == path
        assert OPENAI not in str(refused.value)
        assert "pw1" not in str(refused.value)


def test_values_of_any_depth_are_scanned() -> None:
    deep: Any = {"password": "pw1"}
    for _ in range(100_000):
        deep = [deep]
    assert find_secret(deep) is not None
    assert find_secret(redact_json(deep)) is None
    clean: Any = "fine"
    for _ in range(100_000):
        clean = {"next": clean}
    assert find_secret(clean) is None


def test_definitions_that_would_record_a_credential_are_refused() -> None:
    with pytest.raises(SecretRefused):
        sp.Effect(f"charge-{STRIPE}", execute=lambda payload, key: {})
    with pytest.raises(SecretRefused):
        sp.workflow(f"flow-{GITHUB}")
    with pytest.raises(SecretRefused):
        sp.workflow("flow", models=[f"gpt?key={OPENAI}"])


def test_redact_keeps_the_message_readable() -> None:
    assert redact_text(f"401 for key {OPENAI}: rejected") == (f"401 for key {marker(OPENAI)}: rejected")


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

    with pytest.raises(SecretRefused) as refused:
        sp.start(file_store, flow, run_id="r")
    assert (refused.value.step_id, refused.value.path) == ("config", "$.api_key")
    assert file_store.load_ledger("r").steps == {}
    assert OPENAI.encode() not in _ledger_bytes(file_store)


def test_a_credential_in_a_payload_is_refused_before_anything_is_prepared(file_store: sp.Store) -> None:
    sent: list[Any] = []
    effect = sp.Effect("email", execute=lambda payload, key: sent.append(payload) or {"ok": 1})

    @sp.workflow("leaky-payload")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={"to": "ops", "body": f"use {STRIPE}"})

    with pytest.raises(SecretRefused):
        sp.start(file_store, flow, run_id="r")
    assert sent == []
    assert file_store.load_ledger("r").operations == {}
    assert STRIPE.encode() not in _ledger_bytes(file_store)


def test_workflow_inputs_with_a_credential_are_refused(memory_store: sp.Store) -> None:
    @sp.workflow("leaky-inputs")
    def flow(run: sp.Run, token: str) -> str:
        return "done"

    with pytest.raises(SecretRefused):
        sp.start(memory_store, flow, GITHUB, run_id="r")
    with pytest.raises(RunNotFound):
        memory_store.get_run("r")  # nothing was created


def test_a_secret_reaches_the_step_but_not_the_ledger(file_store: sp.Store, crash_at: Any) -> None:
    from safepoint.testing import SimulatedCrash

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
    assert failed.value.error_message.endswith(marker(OPENAI))
    assert file_store.load_ledger("r").steps["call"].error["message"].endswith(marker(OPENAI))
    assert OPENAI.encode() not in _ledger_bytes(file_store)


def test_what_the_workflow_saw_of_a_credential_is_what_a_resume_sees(
    file_store: sp.Store, crash_at: Any
) -> None:
    from safepoint.testing import SimulatedCrash

    def call() -> None:
        raise PermissionError(f"401 for password=pw1Zq9 and {OPENAI}")

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise sp.Rejected({"declined": True, "request": {"headers": {"Cookie": "sid=abc"}}})

    decline = sp.Effect("decline", execute=execute)

    @sp.workflow("sees-redacted")
    def flow(run: sp.Run) -> Any:
        seen = []
        try:
            run.read("call", call)
        except sp.StepFailed as failed:
            seen.append(failed.error_message)
        try:
            run.effect("charge", decline, payload={"amount": 5})
        except EffectRejected as rejected:
            seen.append(rejected.evidence)
        # what it saw goes into the next step's inputs: a resume asks the same question
        return run.pure("summary", lambda s: s, seen)

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    first = file_store.load_ledger("r").steps["summary"].result
    crash_at(None)
    assert sp.resume(file_store, "r") == first
    assert first == [
        f"401 for password={marker('pw1Zq9')} and {marker(OPENAI)}",
        {"declined": True, "request": {"headers": {"Cookie": marker("sid=abc")}}},
    ]
    assert b"pw1Zq9" not in _ledger_bytes(file_store)
    assert b"sid=abc" not in _ledger_bytes(file_store)


def test_credentials_in_reasons_and_evidence_are_redacted(memory_store: sp.Store) -> None:
    effect = sp.Effect(
        "charge",
        execute=lambda p, k: (_ for _ in ()).throw(TimeoutError()),
        reconcile=lambda key: sp.Unknown(f"lookup with key {ANTHROPIC} failed"),
        dedup_retention=timedelta(hours=1),
    )

    @sp.workflow("leaky-reason")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    record = memory_store.get_run("r").recovery_record
    assert ANTHROPIC not in str(record)
    assert marker(ANTHROPIC) in record["reason"]
    with pytest.raises(SecretRefused):
        sp.cancel(memory_store, "r", by="ops", reason=f"rotated {ANTHROPIC}")


def test_rejections_keep_their_evidence_without_credentials(memory_store: sp.Store) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise sp.Rejected(
            {
                "request": {"Authorization": "Basic dXNlcjpwYXNzd29yZA==", "api_token": "9f8e7d6c5b4a"},
                "status": 402,
            }
        )

    effect = sp.Effect("charge", execute=execute)

    @sp.workflow("leaky-rejection")
    def flow(run: sp.Run) -> Any:
        try:
            return run.effect("charge", effect, payload={})
        except EffectRejected:
            return "declined"

    assert sp.start(memory_store, flow, run_id="r") == "declined"
    error = memory_store.load_ledger("r").operations["charge"].error
    assert error == {
        "request": {
            "Authorization": marker("Basic dXNlcjpwYXNzd29yZA=="),
            "api_token": marker("9f8e7d6c5b4a"),
        },
        "status": 402,
    }


def test_a_receipt_with_a_client_secret_is_kept_masked(memory_store: sp.Store) -> None:
    effect = sp.Effect("intent", execute=lambda p, k: {"id": "pi_1", "client_secret": "pi_1_secret_abcdefgh"})

    @sp.workflow("masked-receipt")
    def flow(run: sp.Run) -> Any:
        return run.effect("intent", effect, payload={"amount": 5})

    assert sp.start(memory_store, flow, run_id="r") == {
        "id": "pi_1",
        "client_secret": marker("pi_1_secret_abcdefgh"),
    }
    assert memory_store.get_run("r").status is RunStatus.COMPLETED


@pytest.mark.parametrize(
    "value",
    [
        "postgresql://app:S3cr3tPass@db.internal/app",
        {"aws_secret_access_key": "wJalrXUtnFEMI/K7"},
        {"api_token": "9f8e7d6c5b4a3f2e"},
        {"webhook_secret": "whsec_abcdefgh"},
        "hf_" + "a" * 34,
    ],
)
def test_more_credential_forms_are_found(value: Any) -> None:
    assert find_secret(value) is not None


@pytest.mark.parametrize(
    "value",
    [
        {"logprobs": {"content": [{"token": "understanding", "logprob": -0.1}]}},
        {"token": "CAUQAA", "next": "CAUQAQ"},
        {"cookie": "chocolate chip"},
        "ASIAPACIFICSOUTHEAST1",
    ],
)
def test_ordinary_agent_data_is_not_taken_for_a_credential(value: Any) -> None:
    assert find_secret(value) is None
