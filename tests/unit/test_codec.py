"""The codec of encryption at rest, on its own: sealing and opening values for their place,
keyrings and rotation, and the typed errors of a missing or wrong key."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

import safepoint as sp
from safepoint.errors import DecryptionFailed, KeyUnavailable, UsageError
from safepoint.storage import Encrypted, Keyring, SqliteStore
from safepoint.storage.codec import (
    PREFIX,
    bound,
    envelope,
    is_sealed,
    open_artifact,
    open_text,
    seal_artifact,
    seal_text,
    sealed_key_id,
)

K1, K2 = bytes(range(32)), bytes(range(32, 64))  # fixed: test ids name them
PLACE = ("safepoint_steps", "result", "run-1", "step-a")


def ring(*ids: str) -> Keyring:
    keys = {"k1": K1, "k2": K2}
    return Keyring({key_id: keys[key_id] for key_id in ids}, ids[0])


def test_a_value_round_trips_and_its_envelope_names_the_key() -> None:
    codec = Encrypted(ring("k1"))
    text = json.dumps({"note": "hello", "n": [1, 2.5, None]})
    sealed = seal_text(codec, text, *PLACE)
    assert sealed is not None
    assert is_sealed(sealed)
    assert sealed.startswith(PREFIX)
    assert "hello" not in sealed
    assert sealed_key_id(sealed) == "k1"
    assert open_text(codec, sealed, *PLACE) == text
    assert seal_text(codec, None, *PLACE) is None  # NULL stays NULL


def test_every_value_gets_its_own_random_nonce() -> None:
    codec = Encrypted(ring("k1"))
    first, second = (seal_text(codec, '"same"', *PLACE) for _ in range(2))
    assert first != second
    raw = base64.b64decode(json.loads(first or "")["ct"])
    assert len(raw) == 12 + len(b'"same"') + 16  # nonce, ciphertext, tag


def test_a_value_opened_for_another_place_fails_naming_its_key_and_place() -> None:
    codec = Encrypted(ring("k1"))
    sealed = seal_text(codec, '"v"', *PLACE) or ""
    for other in (
        ("safepoint_steps", "result", "run-2", "step-a"),  # another run
        ("safepoint_steps", "result", "run-1", "step-b"),  # another step
        ("safepoint_steps", "error", "run-1", "step-a"),  # another column of the row
        ("safepoint_runs", "result", "run-1", "step-a"),  # another table
    ):
        with pytest.raises(DecryptionFailed) as failed:
            open_text(codec, sealed, *other)
        assert failed.value.key_id == "k1"
        assert failed.value.where == f"{other[0]}.{other[1]} ({', '.join(other[2:])})"


def test_an_event_or_message_sealed_for_its_run_alone_still_opens_where_its_row_does_not() -> None:
    """A value an earlier release sealed for (run, kind) — before events were bound to their
    row — opens for any row of that run and kind (and ``bound`` says it is not its row's); one
    sealed for its row opens for that row only; a table always bound has no such fallback."""
    codec = Encrypted(ring("k1"))
    event = ("safepoint_events", "detail", "run-1", "effect.rejected")
    older = seal_text(codec, '{"n": 1}', *event)
    newer = seal_text(codec, '{"n": 2}', *event, 7)
    assert older is not None
    assert newer is not None
    assert open_text(codec, older, *event, 7) == open_text(codec, older, *event, 8) == '{"n": 1}'
    assert not bound(codec, older, *event, 7)
    assert open_text(codec, newer, *event, 7) == '{"n": 2}'
    assert bound(codec, newer, *event, 7)
    with pytest.raises(DecryptionFailed) as moved:  # another row of its kind
        open_text(codec, newer, *event, 8)
    assert moved.value.where == "safepoint_events.detail (run-1, effect.rejected, 8)"
    with pytest.raises(DecryptionFailed):  # another kind: neither place opens it
        open_text(codec, older, "safepoint_events", "detail", "run-1", "effect.unknown", 7)
    step = seal_text(codec, '"x"', "safepoint_steps", "result", "run-1")
    assert step is not None
    with pytest.raises(DecryptionFailed):  # steps were always bound to their row
        open_text(codec, step, *PLACE)


def test_an_artifact_is_sealed_for_its_digest_and_plain_bytes_pass_as_they_are() -> None:
    codec = Encrypted(ring("k1"))
    data = b'{"amount": 5}'
    sealed = seal_artifact(codec, data, "sha256:aa")
    assert b"amount" not in sealed
    assert open_artifact(codec, sealed, "sha256:aa") == data
    with pytest.raises(DecryptionFailed):
        open_artifact(codec, sealed, "sha256:bb")
    assert open_artifact(codec, data, "sha256:aa") == data  # stored before the ledger had a codec


def test_rotation_seals_with_the_new_key_and_opens_with_the_old() -> None:
    old = Encrypted(ring("k1"))
    rotated = Encrypted(ring("k2", "k1"))
    before = seal_text(old, '"before"', *PLACE) or ""
    after = seal_text(rotated, '"after"', *PLACE) or ""
    assert (sealed_key_id(before), sealed_key_id(after)) == ("k1", "k2")
    assert open_text(rotated, before, *PLACE) == '"before"'
    assert open_text(rotated, after, *PLACE) == '"after"'
    with pytest.raises(KeyUnavailable) as missing:  # the old keyring never had the new key
        open_text(old, after, *PLACE)
    assert missing.value.key_id == "k2"
    assert "k2" in missing.value.message
    assert "safepoint_steps.result" in missing.value.message


def test_a_wrong_key_under_the_right_id_and_an_altered_value_fail_typed() -> None:
    codec = Encrypted(ring("k1"))
    sealed = seal_text(codec, '"v"', *PLACE) or ""
    impostor = Encrypted(Keyring({"k1": K2}, "k1"))
    with pytest.raises(DecryptionFailed) as wrong:
        open_text(impostor, sealed, *PLACE)
    assert wrong.value.key_id == "k1"
    parts = json.loads(sealed)
    raw = bytearray(base64.b64decode(parts["ct"]))
    raw[-1] ^= 1
    with pytest.raises(DecryptionFailed):
        open_text(codec, envelope("k1", bytes(raw)), *PLACE)
    with pytest.raises(DecryptionFailed):
        open_text(codec, PREFIX + '"kid":"k1","ct":"not base64!"}', *PLACE)
    with pytest.raises(DecryptionFailed):
        open_text(codec, envelope("k1", b"short"), *PLACE)


def test_a_keyring_is_read_from_its_text_and_never_shows_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = f"# active first\nk2:{base64.b64encode(K2).decode()}\n\nk1:{base64.b64encode(K1).decode()}\n"
    parsed = Keyring.parse(text)
    assert (parsed.active, parsed.key_ids, parsed.key("k1")) == ("k2", ("k2", "k1"), K1)
    assert Keyring.parse(parsed.text()).key_ids == ("k2", "k1")
    assert Keyring.parse(text.replace("\n\n", ",").replace("\n", ",")).key_ids == ("k2", "k1")
    shown = repr(Encrypted(parsed))
    assert base64.b64encode(K1).decode() not in shown
    assert "k2" in shown
    monkeypatch.delenv("SAFEPOINT_KEYRING", raising=False)
    monkeypatch.delenv("SAFEPOINT_KEYRING_FILE", raising=False)
    assert Keyring.from_env() is None
    (tmp_path / "ring").write_text(text)
    monkeypatch.setenv("SAFEPOINT_KEYRING_FILE", str(tmp_path / "ring"))
    assert (Keyring.from_env() or parsed).key_ids == ("k2", "k1")
    monkeypatch.setenv("SAFEPOINT_KEYRING", f"k1:{base64.b64encode(K1).decode()}")
    assert (Keyring.from_env() or parsed).key_ids == ("k1",)  # the variable wins over the file
    monkeypatch.delenv("SAFEPOINT_KEYRING")
    monkeypatch.setenv("SAFEPOINT_KEYRING_FILE", str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="cannot read the keyring file"):
        Keyring.from_env()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "holds no key"),
        ("k1", "id:base64-key"),
        ("k1:***", "not base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "32 bytes"),
        (f"bad id:{base64.b64encode(K1).decode()}", "is not one"),
        (f"k1:{base64.b64encode(K1).decode()},k1:{base64.b64encode(K2).decode()}", "twice"),
    ],
)
def test_a_keyring_that_is_not_one_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        Keyring.parse(text)


def test_no_keyring_is_a_usage_error_that_says_what_to_set() -> None:
    with pytest.raises(UsageError, match="SAFEPOINT_KEYRING"):
        Encrypted(None)
    with pytest.raises(UsageError, match="not in the keyring"):
        Keyring({"k1": K1}, "k2")


def test_a_store_runs_the_same_with_and_without_its_codec() -> None:
    @sp.workflow("codec-unit")
    def flow(run: sp.Run, n: int) -> dict[str, int]:
        return {"n": run.pure("double", lambda: n * 2)}

    results = {}
    for name, codec in (("plain", None), ("sealed", Encrypted(ring("k1")))):
        store = SqliteStore(":memory:", codec=codec)
        results[name] = (sp.start(store, flow, 21, run_id="r"), store.load_ledger("r").steps["double"])
        store.close()
    (plain, plain_step), (sealed, sealed_step) = results["plain"], results["sealed"]
    assert plain == sealed == {"n": 42}
    assert (plain_step.result, plain_step.input_hash) == (sealed_step.result, sealed_step.input_hash)
