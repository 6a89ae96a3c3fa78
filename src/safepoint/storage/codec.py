"""How a value is sealed on its way into the ledger and opened on its way out: the codec, one
small protocol at the stores' boundary (``SqliteStore(path, codec=…)``, ``PostgresStore``,
``AsyncPostgresStore``), and the envelope it leaves in a column.

A store without a codec writes and reads exactly as before: every helper here is behind a
``codec is None`` check. With one (``safepoint.storage.Encrypted``), the values that hold what
a run was given and found — run inputs, results and errors, step results and errors, failed
attempts' errors, operations' receipts and errors, messages' payloads, and every artifact
(effect payloads, large values), a recovery record's reason and evidence (``SEALED_RECORD``,
sealed inside the record), and the details of the events that repeat one of them
(``SEALED_EVENTS``) — are stored sealed, each as an envelope naming the key that
sealed it::

    {"$sp_enc":1,"kid":"2026-06","ct":"<base64 of nonce, ciphertext and tag>"}

An envelope is JSON, so a column that holds JSON holds it too, and a statement that treats a
column as JSON (a re-plan's event copies a step's result) still can. Each value is sealed for
its place: the table, the column and the row's key are its associated data, so a ciphertext
copied to another row — or another column of the same row — does not open. An artifact's place
is its digest, which stays the digest of the plaintext: approvals bind to it, replay compares
input hashes over the plaintext, and deduplication by digest is unchanged.

A value stored before the store had a codec (plain JSON, or an artifact's plain bytes) is read
as it is: a ledger may start being encrypted at any time, and ``safepoint keys reencrypt``
seals what is left. A store opened without a codec on a ledger that holds sealed values refuses
to open (``KeyUnavailable``), rather than hand envelopes out as values.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Protocol, runtime_checkable

from ..errors import DecryptionFailed

# An envelope's text always starts so (it is written by ``envelope``, never by a JSON encoder):
# telling one from a plain value needs no parse.
PREFIX = '{"$sp_enc":1,'
PREFIX_BYTES = PREFIX.encode()

# The values a codec seals, by table: the columns, and the columns of the row's key that make
# the place each is sealed for (artifacts are sealed for their digest).
SEALED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "safepoint_runs": (("inputs", "result", "error"), ("run_id",)),
    "safepoint_steps": (("result", "error"), ("run_id", "step_id")),
    "safepoint_attempts": (("error",), ("run_id", "step_id", "attempt")),
    "safepoint_operations": (("receipt", "error"), ("run_id", "operation_id")),
    "safepoint_messages": (("payload",), ("run_id", "name")),
    "safepoint_events": (("detail",), ("run_id", "kind")),
}
# The events whose detail repeats what a sealed column holds — a failure's error, an effect's
# error or receipt, a person's receipt, a retried step's record: their detail is sealed too.
SEALED_EVENTS = frozenset(
    {
        "run.failed",
        "run.blocked",
        "run.stopped",
        "run.resolved",
        "run.retried",
        "step.retried",
        "effect.applied",
        "effect.rejected",
        "effect.unknown",
        "effect.accepted",
    }
)
ARTIFACTS = "safepoint_artifacts"
# The parts of a run's recovery record that quote what owners, reconcile and verifiers said (a
# rejection's error, a verifier's answer): sealed inside the record, which stays a JSON object
# (the statement that blocks the run writes its state revision into it).
SEALED_RECORD = ("reason", "evidence")


@runtime_checkable
class Codec(Protocol):
    """What a store seals values with. ``key_id``: the key new values are sealed with."""

    key_id: str

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
        """``plaintext`` sealed for ``aad``: (the id of the key used, the ciphertext)."""
        ...

    def open(self, key_id: str, ciphertext: bytes, aad: bytes, where: str) -> bytes:
        """The plaintext of ``ciphertext``, sealed for ``aad`` with key ``key_id``;
        ``KeyUnavailable`` when the codec lacks the key, ``DecryptionFailed`` when it does not
        open (``where`` names the value in both)."""
        ...


def place(table: str, column: str, *key: Any) -> bytes:
    """The associated data a value is sealed for: where it is stored."""
    return json.dumps([table, column, *(str(part) for part in key)], ensure_ascii=False).encode()


def where(table: str, column: str, *key: Any) -> str:
    """The place, as an error names it."""
    return f"{table}.{column} ({', '.join(str(part) for part in key)})"


def envelope(key_id: str, ciphertext: bytes) -> str:
    """The text a sealed value is stored as (``PREFIX`` first)."""
    return f'{PREFIX}"kid":{json.dumps(key_id)},"ct":"{base64.b64encode(ciphertext).decode()}"}}'


def is_sealed(text: Any) -> bool:
    """Whether a stored column's value is an envelope."""
    return text.__class__ is str and text.startswith(PREFIX)


def _parts(text: str, at: str) -> tuple[str, bytes]:
    try:
        parsed = json.loads(text)
        key_id, ct = parsed["kid"], base64.b64decode(parsed["ct"], validate=True)
        if parsed.get("$sp_enc") != 1 or not isinstance(key_id, str):
            raise ValueError("not an envelope")
        return key_id, ct
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise DecryptionFailed("?", at) from None


def seal_text(codec: Codec, text: str | None, table: str, column: str, *key: Any) -> str | None:
    """A JSON column's text as it is stored (None stays NULL)."""
    if text is None:
        return None
    key_id, ct = codec.seal(text.encode(), place(table, column, *key))
    return envelope(key_id, ct)


def open_text(codec: Codec, text: str, table: str, column: str, *key: Any) -> str:
    """A sealed column's JSON text (``is_sealed(text)``)."""
    at = where(table, column, *key)
    key_id, ct = _parts(text, at)
    plain = codec.open(key_id, ct, place(table, column, *key), at)
    try:
        return plain.decode()
    except UnicodeDecodeError:
        raise DecryptionFailed(key_id, at) from None


def open_copied(codec: Codec, value: Any, table: str, column: str, *key: Any) -> Any:
    """A value as a statement copied it into other JSON (a re-plan's ``step.abandoned`` event
    holds the step's result and error as they were stored): opened for the place it was sealed
    for when it is an envelope, parsed; as it is otherwise."""
    if not (isinstance(value, dict) and value.get("$sp_enc") == 1):
        return value
    return json.loads(
        open_text(codec, envelope(str(value.get("kid")), _ciphertext(value)), table, column, *key)
    )


def _ciphertext(value: dict[str, Any]) -> bytes:
    try:
        return base64.b64decode(str(value.get("ct")), validate=True)
    except (ValueError, binascii.Error):
        return b""


def seal_record(codec: Codec, record: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A recovery record as it is stored: its ``SEALED_RECORD`` parts sealed, each for its
    place in the run's record."""
    sealed = dict(record)
    for part in SEALED_RECORD:
        if sealed.get(part) is not None:
            text = seal_text(
                codec, json.dumps(sealed[part]), "safepoint_runs", f"recovery_record.{part}", run_id
            )
            sealed[part] = json.loads(text or "null")
    return sealed


def open_record(codec: Codec, record: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A stored recovery record with its sealed parts opened (parts stored in clear as they are)."""
    opened = dict(record)
    for part in SEALED_RECORD:
        if part in opened:
            opened[part] = open_copied(
                codec, opened[part], "safepoint_runs", f"recovery_record.{part}", run_id
            )
    return opened


def seal_artifact(codec: Codec, data: bytes, digest: str) -> bytes:
    """An artifact's bytes as they are stored: sealed for its digest (of ``data``)."""
    key_id, ct = codec.seal(data, place(ARTIFACTS, "content", digest))
    return envelope(key_id, ct).encode()


def open_artifact(codec: Codec, data: bytes, digest: str) -> bytes:
    """An artifact's bytes as they were given (plain bytes stored before the codec: as they are)."""
    if not data.startswith(PREFIX_BYTES):
        return data
    at = where(ARTIFACTS, "content", digest)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise DecryptionFailed("?", at) from None
    key_id, ct = _parts(text, at)
    return codec.open(key_id, ct, place(ARTIFACTS, "content", digest), at)


def sealed_key_id(text: str) -> str | None:
    """The key id an envelope names (None when it names none)."""
    try:
        found = json.loads(text).get("kid")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None
