"""Credentials never reach the ledger, in any placement: a corpus of credential formats by the
places a run records something, each run through the real API on both stores, and then every
byte of the SQLite file (and its WAL) and every row of every PostgreSQL table searched.

Where the caller chose the value (inputs, results, payloads, ids, who and why), it is refused
with ``SecretRefused``; where safepoint records text on the caller's behalf (error messages,
receipts, evidence, reasons), each credential is replaced by its marked digest."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected, SecretRefused, StepAttemptsExhausted, VerificationFailed

MARK = "sp_redacted:sha256:"


@dataclass(frozen=True)
class Credential:
    """A credential as text (``text``, as a message would quote it) and as a JSON value
    (``value``), and what of it must never be found in the ledger (``needles``)."""

    name: str
    text: str
    needles: tuple[str, ...]
    value: Any = None

    @property
    def json(self) -> Any:
        return self.value if self.value is not None else {"detail": [self.text]}


JWT_SIGNATURE = "Jw5Zq8Lm3Xw7Rt2Vn9Kc4Tb6"
CORPUS = [
    Credential(
        "anthropic", "sk-ant-api03-Qx7Lm2Np9Rt4Vw8Yz3Bc6Df1Gh5Jk0", ("Qx7Lm2Np9Rt4Vw8Yz3Bc6Df1Gh5Jk0",)
    ),
    Credential("openai", "sk-proj-Tb3Kx9Qm2Wn7Lp4Rz8Vc1Yd6Hf5Js0", ("Tb3Kx9Qm2Wn7Lp4Rz8Vc1Yd6Hf5Js0",)),
    Credential("stripe", "sk_live_51Hq8Zr3Lm9Xw2Vn7Kc4Tb6Yp", ("51Hq8Zr3Lm9Xw2Vn7Kc4Tb6Yp",)),
    Credential(
        "github", "ghp_Gh7Zq3Lm9Xw2Vn8Kc4Tb6Yp1Rd5Jf0Hs3Azq", ("Gh7Zq3Lm9Xw2Vn8Kc4Tb6Yp1Rd5Jf0Hs3Azq",)
    ),
    Credential("slack", "xoxb-2048-1024-Sl9Zq3Lm7Xw2", ("Sl9Zq3Lm7Xw2",)),
    Credential("aws", "AKIAQ7ZL3MX9RT2VW8YB", ("Q7ZL3MX9RT2VW8YB",)),
    Credential("google", "AIzaGo4Zq8Lm2Xw6Rt9Vn3Kc7Tb1Yp5Hd0Jf3As", ("Go4Zq8Lm2Xw6Rt9Vn3Kc7Tb1Yp5Hd0Jf3As",)),
    Credential(
        "jwt",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0." + JWT_SIGNATURE,
        (JWT_SIGNATURE, "eyJzdWIiOiJhZ2VudC03In0"),
    ),
    Credential("bearer", "Bearer Br8Kq3Lm9Xw2Vn7Tb4Yc6Pd", ("Br8Kq3Lm9Xw2Vn7Tb4Yc6Pd",)),
    Credential("password=", "password=hunter2Zq9", ("hunter2Zq9",)),
    Credential("url", "postgresql://app:Pw9Zq3Lm@db.internal/app", ("Pw9Zq3Lm",)),
    Credential("query string", "https://api.example.com/v1/items?api_key=Ak3Zq9Lm7&page=2", ("Ak3Zq9Lm7",)),
    Credential("authorization", "Authorization: Token Au7Zq3Lm2", ("Au7Zq3Lm2",)),
    Credential("cookie", "Cookie: sid=Ck7Zq2Lm9Xw", ("Ck7Zq2Lm9Xw",)),
    Credential(
        "set-cookie",
        "Set-Cookie: session=Sc4Xq8Lm2; Path=/; HttpOnly",
        ("Sc4Xq8Lm2",),
        {"headers": {"Set-Cookie": ["session=Sc4Xq8Lm2; Path=/; HttpOnly"]}},
    ),
    Credential(
        "pem",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpQIBAAKCAQEAz9Lm3Xw7Rt2\n-----END RSA PRIVATE KEY-----",
        ("MIIEpQIBAAKCAQEAz9Lm3Xw7Rt2",),
    ),
    Credential("json in text", '{"client_secret": "Cs8Zq2Lm4"}', ("Cs8Zq2Lm4",)),
    Credential("short password", "{'password': 'Zq7#Kp'}", ("Zq7#Kp",), {"config": {"password": "Zq7#Kp"}}),
    Credential(
        "nested under a key",
        "{'password': ['Nz4#Qp']}",
        ("Nz4#Qp",),
        {"auth": {"password": {"value": ["Nz4#Qp"]}}},
    ),
]


def ledger_bytes(url: str) -> bytes:
    """Everything the store holds: the SQLite file's bytes (WAL included), or every row of
    every table of the PostgreSQL schema as text."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    schema = parse_qs(parts.query)["schema"][0]
    rows: list[str] = []
    with psycopg.connect(urlunsplit(parts._replace(query=""))) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        assert len(tables) >= 5
        for (table,) in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} t").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
            rows += [row for (row,) in conn.execute(query)]
    return "\n".join(rows).encode()


def assert_not_in_ledger(url: str, creds: list[Credential]) -> None:
    held = ledger_bytes(url)
    assert held  # the store did record the runs
    for cred in creds:
        for needle in cred.needles:
            raw = needle.encode()
            assert raw not in held, f"{cred.name}: {needle!r} is in the ledger"
            assert raw.hex().encode() not in held, f"{cred.name}: {needle!r} is in a blob"


def clean(text: str, cred: Credential) -> None:
    for needle in cred.needles:
        assert needle not in text, f"{cred.name}: {needle!r} in {text!r}"


# -- placements where the caller chose the value: refused ------------------------------------------

Action = Callable[[sp.Store, Credential, str], None]


def _refused(action: Callable[[], Any], cred: Credential) -> None:
    with pytest.raises(SecretRefused) as refused:
        action()
    clean(str(refused.value), cred)


def _noop(payload: Any, key: sp.EffectKey) -> Any:
    return {"id": "ok"}


def workflow_input(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-input")
    def flow(run: sp.Run, data: Any) -> str:
        return "done"

    _refused(lambda: sp.start(store, flow, cred.json, run_id=rid), cred)
    _refused(lambda: sp.submit(store, flow, cred.text, run_id=rid + "-s"), cred)


def step_result(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-result")
    def flow(run: sp.Run) -> Any:
        run.pure("fine", lambda: 1)
        return run.read("fetch", lambda: cred.json)

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)
    assert "fetch" not in store.load_ledger(rid).steps


def text_result(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-text-result")
    def flow(run: sp.Run) -> Any:
        return run.read("fetch", lambda: {"content": f"here it is: {cred.text}"})

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def dict_key(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-key")
    def flow(run: sp.Run) -> Any:
        return run.read("fetch", lambda: {"ok": {cred.text: 1}})

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def workflow_result(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-workflow-result")
    def flow(run: sp.Run) -> Any:
        return cred.json

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def effect_payload(store: sp.Store, cred: Credential, rid: str) -> None:
    sent: list[Any] = []
    effect = sp.Effect("corpus.send", execute=lambda p, k: sent.append(p) or {"id": "ok"})

    @sp.workflow("corpus-payload")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={"to": "ops", "body": cred.json})

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)
    assert sent == []


def model_id(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-model")
    def flow(run: sp.Run) -> Any:
        return run.model(
            "draft",
            lambda **kw: {"content": "hi"},
            model=cred.text,
            messages=[{"role": "user", "content": "hi"}],
        )

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def continue_as_new_state(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-continue")
    def flow(run: sp.Run, state: Any = None) -> Any:
        if state is None:
            run.continue_as_new(cred.json)
        return "done"

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def branch_name(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-branch")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {cred.text: lambda b: b.pure("one", lambda: 1)})

    _refused(lambda: sp.start(store, flow, run_id=rid), cred)


def _waiting(store: sp.Store, rid: str) -> None:
    effect = sp.Effect("corpus.refund", execute=_noop)

    @sp.workflow("corpus-approval")
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", effect, payload={"amount": 5}, approval=True)

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id=rid)


def approval(store: sp.Store, cred: Credential, rid: str) -> None:
    _waiting(store, rid)
    _refused(lambda: sp.approve(store, rid, "refund", by="ana", evidence=cred.text), cred)
    _refused(lambda: sp.approve(store, rid, "refund", by=cred.text), cred)
    sp.approve(store, rid, "refund", by="ana", evidence="ticket 8472")
    _refused(lambda: sp.revoke_approval(store, rid, "refund", by="ana", reason=cred.text), cred)


def _charge(
    store: sp.Store, rid: str, raises: type[BaseException] = sp.NeedsReconciliation, **effect: Any
) -> BaseException:
    """Start a run of one effect step, "charge", that raises ``raises`` (by default: the
    owner never answers, and the run blocks)."""

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("no answer")

    charge = sp.Effect("corpus.charge", **{"execute": execute, **effect})

    @sp.workflow("corpus-charge")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", charge, payload={"amount": 5})

    with pytest.raises(raises) as raised:
        sp.start(store, flow, run_id=rid)
    return raised.value


def resolution(store: sp.Store, cred: Credential, rid: str) -> None:
    _charge(store, rid)
    revision = store.get_run(rid).state_revision
    _refused(
        lambda: sp.resolve(
            store, rid, "applied", revision=revision, by="ana", receipt={"id": "ch_1"}, evidence=cred.text
        ),
        cred,
    )
    _refused(lambda: sp.resolve(store, rid, "applied", revision=revision, by="ana", receipt=cred.json), cred)
    _refused(lambda: sp.resolve(store, rid, "abandon", revision=revision, by=cred.text), cred)


def cancellation(store: sp.Store, cred: Credential, rid: str) -> None:
    _waiting(store, rid)
    _refused(lambda: sp.cancel(store, rid, by="ops", reason=cred.text), cred)
    _refused(lambda: sp.cancel(store, rid, by=cred.text), cred)


def run_id(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-run-id")
    def flow(run: sp.Run) -> str:
        return "done"

    with pytest.raises(sp.UsageError) as refused:
        sp.start(store, flow, run_id=cred.text)
    clean(str(refused.value), cred)


def step_id(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-step-id")
    def flow(run: sp.Run) -> Any:
        return run.pure(cred.text, lambda: 1)

    with pytest.raises(sp.UsageError) as refused:
        sp.start(store, flow, run_id=rid)
    clean(str(refused.value), cred)


def operation_id(store: sp.Store, cred: Credential, rid: str) -> None:
    effect = sp.Effect("corpus.op", execute=_noop)

    @sp.workflow("corpus-operation-id")
    def flow(run: sp.Run) -> Any:
        return run.effect("send", effect, payload={}, operation_id=cred.text)

    with pytest.raises(sp.UsageError) as refused:
        sp.start(store, flow, run_id=rid)
    clean(str(refused.value), cred)


REFUSED: dict[str, Action] = {
    "workflow input": workflow_input,
    "step result": step_result,
    "text in a result": text_result,
    "dict key": dict_key,
    "workflow result": workflow_result,
    "effect payload": effect_payload,
    "model id": model_id,
    "continue-as-new state": continue_as_new_state,
    "branch name": branch_name,
    "approval": approval,
    "resolution": resolution,
    "cancellation": cancellation,
}
# Ids are checked by the id rules, which refuse what looks like a credential among the rest.
IDS: dict[str, Action] = {"run id": run_id, "step id": step_id, "operation id": operation_id}


# -- placements where safepoint records on the caller's behalf: redacted -------------------------


def step_error(store: sp.Store, cred: Credential, rid: str) -> None:
    def call() -> Any:
        raise PermissionError(f"401 for {cred.text}")

    @sp.workflow("corpus-step-error")
    def flow(run: sp.Run) -> Any:
        try:
            run.read("call", call, retry=sp.Retry(attempts=2, backoff=0, retry_on=(TimeoutError,)))
        except sp.StepFailed as failed:
            return failed.error_message  # what the workflow sees, first run and replay
        return "unreachable"

    seen = sp.start(store, flow, run_id=rid)
    assert MARK in seen
    clean(seen, cred)
    assert store.load_ledger(rid).steps["call"].error["message"] == seen


def model_reply(store: sp.Store, cred: Credential, rid: str) -> None:
    """A model's reply quotes a credential (a user pasted a key): recorded redacted, and the
    workflow sees what was recorded — the same on replay."""

    @sp.workflow("corpus-model-reply")
    def flow(run: sp.Run) -> Any:
        reply = run.model(
            "draft",
            lambda **kw: {"content": f"here it is: {cred.text}", "meta": cred.json},
            model="m-1",
            messages=[{"role": "user", "content": "hi"}],
        )
        return reply["content"]

    seen = sp.start(store, flow, run_id=rid)
    assert MARK in seen
    assert seen.startswith("here it is: ")
    clean(seen, cred)
    assert sp.resume(store, rid) == seen
    assert store.load_ledger(rid).steps["draft"].result["content"] == seen


def redacted_read(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-redacted-read")
    def flow(run: sp.Run) -> Any:
        return run.read("inbox", lambda: {"body": cred.text, "raw": cred.json}, secrets="redact")

    seen = sp.start(store, flow, run_id=rid)
    clean(json.dumps(seen), cred)
    assert store.load_ledger(rid).steps["inbox"].result == seen


def attempts_stop(store: sp.Store, cred: Credential, rid: str) -> None:
    """A step's every attempt failed quoting a credential: the run stops at its attempts, and
    the stop's error and recovery record quote it redacted."""

    def call() -> Any:
        raise PermissionError(f"401 for {cred.text}")

    @sp.workflow("corpus-attempts-stop")
    def flow(run: sp.Run) -> Any:
        return run.read("call", call, retry=sp.Retry(attempts=2, backoff=0))

    with pytest.raises(StepAttemptsExhausted) as stopped:
        sp.start(store, flow, run_id=rid)
    clean(stopped.value.message, cred)
    record = store.get_run(rid).recovery_record
    assert MARK in record["evidence"]["last_error"]["message"]
    clean(json.dumps(record), cred)


def failed_workflow(store: sp.Store, cred: Credential, rid: str) -> None:
    @sp.workflow("corpus-failed")
    def flow(run: sp.Run) -> Any:
        run.pure("one", lambda: 1)
        raise ValueError(f"could not connect with {cred.text}")

    with pytest.raises(sp.RunFailed) as failed:
        sp.start(store, flow, run_id=rid)
    assert MARK in failed.value.error_message
    clean(str(failed.value), cred)
    assert store.get_run(rid).error["message"] == failed.value.error_message


def usage_error(store: sp.Store, cred: Credential, rid: str) -> None:
    def usage(response: Any) -> Any:
        raise KeyError(f"no usage in {cred.text}")

    @sp.workflow("corpus-usage")
    def flow(run: sp.Run) -> Any:
        return run.model(
            "draft",
            lambda **kw: {"content": "hi"},
            model="m-1",
            messages=[{"role": "user", "content": "hi"}],
            usage=usage,
        )

    with pytest.raises(sp.UsageError) as failed:
        sp.start(store, flow, run_id=rid)
    clean(str(failed.value), cred)
    assert MARK in store.get_run(rid).error["message"]


def receipt(store: sp.Store, cred: Credential, rid: str) -> None:
    effect = sp.Effect(
        "corpus.intent", execute=lambda p, k: {"id": "pi_1", "echo": cred.json, "note": cred.text}
    )

    @sp.workflow("corpus-receipt")
    def flow(run: sp.Run) -> Any:
        return run.effect("intent", effect, payload={"amount": 5})

    got = sp.start(store, flow, run_id=rid)
    assert got["id"] == "pi_1"
    assert MARK in got["note"]
    clean(str(got), cred)
    assert store.load_ledger(rid).operations["intent"].receipt == got


def rejection(store: sp.Store, cred: Credential, rid: str) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise sp.Rejected({"status": 402, "request": cred.json, "message": cred.text})

    effect = sp.Effect("corpus.decline", execute=execute)

    @sp.workflow("corpus-rejection")
    def flow(run: sp.Run) -> Any:
        try:
            return run.effect("charge", effect, payload={"amount": 5})
        except EffectRejected as rejected:
            return rejected.evidence  # as recorded: a replay raises it from the ledger

    seen = sp.start(store, flow, run_id=rid)
    assert seen["status"] == 402
    assert MARK in seen["message"]
    clean(str(seen), cred)
    assert store.load_ledger(rid).operations["charge"].error == seen


def execute_error(store: sp.Store, cred: Credential, rid: str) -> None:
    def execute(payload: Any, key: sp.EffectKey) -> Any:
        raise ConnectionError(f"reset by peer after {cred.text}")

    clean(str(_charge(store, rid, execute=execute)), cred)
    error = store.load_ledger(rid).operations["charge"].error
    assert MARK in error["message"]
    record = store.get_run(rid).recovery_record
    assert record["evidence"]["last_error"] == error


def reconcile_error(store: sp.Store, cred: Credential, rid: str) -> None:
    def reconcile(key: sp.EffectKey) -> Any:
        raise RuntimeError(f"lookup failed with {cred.text}")

    _charge(store, rid, reconcile=reconcile)
    assert MARK in store.get_run(rid).recovery_record["reason"]
    with pytest.raises(sp.NeedsReconciliation) as again:
        sp.resume(store, rid)
    clean(str(again.value), cred)


def reconcile_unknown(store: sp.Store, cred: Credential, rid: str) -> None:
    _charge(store, rid, reconcile=lambda key: sp.Unknown(f"the index says {cred.text}"))
    assert MARK in store.get_run(rid).recovery_record["reason"]


def verify_error(store: sp.Store, cred: Credential, rid: str) -> None:
    def verify(receipt: Any) -> bool:
        raise RuntimeError(f"verifier could not log in with {cred.text}")

    clean(str(_charge(store, rid, VerificationFailed, execute=_noop, verify=verify)), cred)
    assert MARK in store.get_run(rid).recovery_record["reason"]


REDACTED: dict[str, Action] = {
    "model reply": model_reply,
    "observation that opted in": redacted_read,
    "step error": step_error,
    "attempts stop": attempts_stop,
    "failed workflow": failed_workflow,
    "usage error": usage_error,
    "receipt": receipt,
    "rejection evidence": rejection,
    "execute error": execute_error,
    "reconcile error": reconcile_error,
    "reconcile's unknown": reconcile_unknown,
    "verify error": verify_error,
}


@pytest.mark.parametrize("placement", [*REFUSED, *IDS, *REDACTED])
def test_no_credential_reaches_the_ledger(store: sp.Store, store_url: str, placement: str) -> None:
    action = {**REFUSED, **IDS, **REDACTED}[placement]
    for index, cred in enumerate(CORPUS):
        action(store, cred, f"corpus-{index}")
    assert_not_in_ledger(store_url, CORPUS)
