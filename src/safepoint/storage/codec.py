"""How a value is sealed on its way into the ledger and opened on its way out: the codec, one
small protocol at the stores' boundary (``SqliteStore(path, codec=…)``, ``PostgresStore``,
``AsyncPostgresStore``), and the envelope it leaves in a column.

A store without a codec writes and reads exactly as before: every helper here is behind a
``codec is None`` check. With one (``safepoint.storage.Encrypted``), every value that can hold
what a run was given and found, or what a person wrote about it — run inputs, results and
errors, step results and errors, failed attempts' errors, operations' receipts and errors,
messages' payloads, approvals' evidence and revocation reasons, what a run waiting at an
approval gate waits for (why no approval holds, which may quote a revocation's reason), and
every artifact (effect payloads, large values), a recovery record's reason and evidence
(``SEALED_RECORD``, sealed inside the record), and the details of the events that can quote
one of them (``SEALED_EVENTS``) — are stored sealed, each as an envelope naming the key that
sealed it::

    {"$sp_enc":1,"kid":"2026-06","ct":"<base64 of nonce, ciphertext and tag>"}

An envelope is JSON, so a column that holds JSON holds it too, and a statement that treats a
column as JSON (a re-plan's event copies a step's result) still can. Each value is sealed for
its place: the table, the column and the row's whole key are its associated data, so a
ciphertext copied to another row — or another column of the same row — does not open. An event
or a message is keyed by the number the database gives it (``event_id``, ``seq``): a store
takes that number from the table's sequence before it seals the row's value (the
``next_event_id`` and ``next_message_seq`` queries), in the transaction that inserts the row.
An artifact's place is its digest, which stays the digest of the plaintext: approvals bind to
it, replay compares input hashes over the plaintext, and deduplication by digest is unchanged.

Values sealed before events and messages were bound to their own row — for (run, kind) and
(run, message name) only (``UNBOUND``; a ``step.abandoned`` event's copies, for their step) —
still open for that place, tried only where the row's own does not open them; ``safepoint keys
reencrypt`` seals each again for its row (with the active key, which it may already be under),
and a rotation that has run to the end leaves none. Why not refuse them, or migrate them: a
schema migration cannot seal — SQL has no key — and refusing them would make every encrypted
ledger unreadable on upgrade. Until the rotation has run, two such older values of one run and
kind (or name) can still trade places unnoticed, as they always could; every value written
since is bound to its row.

A value stored before the store had a codec (plain JSON, or an artifact's plain bytes) is read
as it is: a ledger may start being encrypted at any time, and ``safepoint keys reencrypt``
seals what is left. A store opened without a codec on a ledger that holds sealed values refuses
to open (``KeyUnavailable``), rather than hand envelopes out as values.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import DecryptionFailed

# An envelope's text always starts so (it is written by ``envelope``, never by a JSON encoder):
# telling one from a plain value needs no parse.
PREFIX = '{"$sp_enc":1,'
PREFIX_BYTES = PREFIX.encode()

# The values a codec seals, by table: the columns, and the columns of the row's key that make
# the place each is sealed for (artifacts are sealed for their digest).
SEALED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # waiting_for: an approval gate's says why no approval holds, quoting a revocation's reason
    "safepoint_runs": (("inputs", "result", "error", "waiting_for"), ("run_id",)),
    "safepoint_steps": (("result", "error"), ("run_id", "step_id")),
    "safepoint_attempts": (("error",), ("run_id", "step_id", "attempt")),
    "safepoint_operations": (("receipt", "error"), ("run_id", "operation_id")),
    "safepoint_messages": (("payload",), ("run_id", "name", "seq")),
    "safepoint_events": (("detail",), ("run_id", "kind", "event_id")),
    # a person's words, as given (text, not JSON)
    "safepoint_approvals": (("evidence", "revoke_reason"), ("run_id", "approval_id")),
}
# The tables whose values were once sealed for the first columns of their place only (how
# many): see the module's docstring.
UNBOUND = {"safepoint_messages": 2, "safepoint_events": 2}
# The events whose detail can quote the caller's data or a person's words — a failure's error,
# an effect's error or receipt (a NotSent's reason: ``effect.prepared``), a person's receipt,
# evidence or reason (an approval gate's ``run.waiting``: why no approval holds), a retried
# step's record: their detail is sealed too. (A writer leaves in clear a detail of these kinds
# that holds none of it — the effect and payload digest an ``effect.prepared`` records when it
# is prepared, what a wait for a message or a timer waits for — sparing it the sequence's round
# trip; a rotation seals those too, as it seals such a ``waiting_for``.)
SEALED_EVENTS = frozenset(
    {
        "run.failed",
        "run.blocked",
        "run.stopped",
        "run.resolved",
        "run.retried",
        "run.cancel_requested",
        "run.cancelled",
        "run.forked",
        "run.fork_made",
        "run.limits_extended",
        "run.waiting",
        "step.retried",
        "effect.prepared",
        "effect.applied",
        "effect.rejected",
        "effect.unknown",
        "effect.accepted",
        "effect.approved",
        "effect.approval_revoked",
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


def unbound(table: str, column: str, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The place a value of this row was sealed for before it was bound to its row
    (``UNBOUND``): (table, column, the first parts of the key); None for a table always bound."""
    kept = UNBOUND.get(table)
    if kept is None or column not in SEALED[table][0]:
        return None
    return (table, column, *key[:kept])


def open_text(
    codec: Codec, text: str, table: str, column: str, *key: Any, earlier: tuple[Any, ...] | None = None
) -> str:
    """A sealed column's text (``is_sealed(text)``), opened for its row — or for the place it
    was sealed for before values were bound to their row (``earlier``; by default
    ``unbound``'s), where that one does not open it."""
    at = where(table, column, *key)
    key_id, ct = _parts(text, at)
    try:
        plain = codec.open(key_id, ct, place(table, column, *key), at)
    except DecryptionFailed:
        before = earlier if earlier is not None else unbound(table, column, key)
        if before is None:
            raise
        plain = codec.open(key_id, ct, place(*before), at)  # DecryptionFailed, naming the row
    try:
        return plain.decode()
    except UnicodeDecodeError:
        raise DecryptionFailed(key_id, at) from None


def bound(codec: Codec, text: str, table: str, column: str, *key: Any) -> bool:
    """Whether a sealed value opens for its row itself (not only for an earlier place)."""
    at = where(table, column, *key)
    try:
        key_id, ct = _parts(text, at)
        codec.open(key_id, ct, place(table, column, *key), at)
    except DecryptionFailed:
        return False
    return True


def copied_text(value: Any) -> str | None:
    """The envelope's text of a value a statement copied into other JSON; None when it is not
    one (a value stored in clear)."""
    if not (isinstance(value, dict) and value.get("$sp_enc") == 1):
        return None
    return envelope(str(value.get("kid")), _ciphertext(value))


def open_copied(
    codec: Codec, value: Any, table: str, column: str, *key: Any, earlier: tuple[Any, ...] | None = None
) -> Any:
    """A value sealed inside other JSON (a recovery record's reason, a re-plan's
    ``step.abandoned`` event's copy of its step's result): opened for its place when it is an
    envelope (or for ``earlier``, see ``open_text``), parsed; as it is otherwise."""
    text = copied_text(value)
    if text is None:
        return value
    return json.loads(open_text(codec, text, table, column, *key, earlier=earlier))


def _ciphertext(value: dict[str, Any]) -> bytes:
    try:
        return base64.b64decode(str(value.get("ct")), validate=True)
    except (ValueError, binascii.Error):
        return b""


def abandoned_places(
    run_id: str, step_id: str, event_id: Any
) -> tuple[Callable[[str], tuple[Any, ...]], Callable[[str], tuple[Any, ...]]]:
    """Where a ``step.abandoned`` event's copies of its step's result and error are sealed for,
    given the part: its own row (the event), and — as the re-plan's statement copies them, and
    as they stayed before values were bound to their row — the step's."""
    return (
        lambda part: ("safepoint_events", f"detail.{part}", run_id, "step.abandoned", event_id),
        lambda part: ("safepoint_steps", part, run_id, step_id),
    )


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
