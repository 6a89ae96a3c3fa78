"""Encryption at rest: ``Encrypted``, the codec (``storage.codec``) that seals values with
AES-256-GCM (``cryptography``, the ``crypto`` extra), and ``Keyring``, the keys it holds.

A keyring holds one active key, which seals every new value, and any number of older ones, kept
to open what they sealed: rotating is adding a key in front and keeping the old ones until
``safepoint keys reencrypt`` has sealed every value again with the new one. Keys come from the
user — never from the ledger, never from a command line ``ps`` shows: ``$SAFEPOINT_KEYRING``
holds the keyring's text, or ``$SAFEPOINT_KEYRING_FILE`` names a file that does. The text is
one ``id:key`` entry per line (or comma), the key 32 bytes in base64, the active one first::

    2026-06:q0yUz0W7…=
    2026-01:Jx9f3LrQ…=

Each value gets a random 96-bit nonce; its place in the ledger is the associated data (see
``storage.codec``), so a value moved to another row does not open.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import DecryptionFailed, KeyUnavailable, MissingExtra, UsageError

__all__ = ["Encrypted", "Keyring"]

KEYRING_ENV = "SAFEPOINT_KEYRING"
KEYRING_FILE_ENV = "SAFEPOINT_KEYRING_FILE"
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NONCE_BYTES = 12


class Keyring:
    """The keys a ledger's values are sealed with: ``active`` seals, every key opens.

    >>> ring = Keyring({"k2": Keyring.new_key(), "k1": Keyring.new_key()}, active="k2")
    >>> ring.active, ring.key_ids
    ('k2', ('k2', 'k1'))
    """

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        for key_id, key in keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise UsageError(
                    f"key id {key_id!r} is not one: use 1 to 64 letters, digits, '.', '_' or '-'"
                )
            if len(key) != 32:
                raise UsageError(
                    f"key {key_id!r} is {len(key)} bytes long: an AES-256 key is 32 bytes"
                    " (make one with `safepoint keys new`)"
                )
        if active not in keys:
            raise UsageError(f"the active key {active!r} is not in the keyring")
        self._keys = dict(keys)
        self.active = active

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key's id, in the keyring's order."""
        return tuple(self._keys)

    def key(self, key_id: str) -> bytes | None:
        """The key under ``key_id``, or None."""
        return self._keys.get(key_id)

    def __repr__(self) -> str:  # never the keys themselves
        return f"Keyring(active={self.active!r}, key_ids={self.key_ids!r})"

    @staticmethod
    def new_key() -> bytes:
        """A new random 256-bit key."""
        return os.urandom(32)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """A keyring from its text: ``id:base64-key`` entries, one per line or comma, the
        active key first; blank lines and ``#`` comments are skipped."""
        keys: dict[str, bytes] = {}
        for raw in re.split(r"[\n,]", text):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue
            key_id, sep, encoded = entry.partition(":")
            key_id = key_id.strip()
            if not sep:
                raise UsageError("a keyring entry is id:base64-key (the active key first)")
            if key_id in keys:
                raise UsageError(f"key id {key_id!r} is in the keyring twice")
            try:
                keys[key_id] = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise UsageError(f"key {key_id!r} is not base64") from None
        if not keys:
            raise UsageError("the keyring holds no key: give one id:base64-key entry at least")
        return cls(keys, next(iter(keys)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring ``$SAFEPOINT_KEYRING`` holds, or the file ``$SAFEPOINT_KEYRING_FILE``
        names; None when neither is set."""
        env = os.environ if environ is None else environ
        text = env.get(KEYRING_ENV)
        if text:
            return cls.parse(text)
        path = env.get(KEYRING_FILE_ENV)
        if path:
            try:
                return cls.parse(Path(path).read_text("utf-8"))
            except OSError as exc:
                raise UsageError(
                    f"cannot read the keyring file {path!r} ({KEYRING_FILE_ENV}): {exc.strerror}"
                ) from None
        return None

    def text(self) -> str:
        """The keyring's text (``parse`` reads it back): it holds the keys — keep it secret."""
        return "".join(f"{key_id}:{base64.b64encode(key).decode()}\n" for key_id, key in self._keys.items())


class Encrypted:
    """The codec that seals every value a run records with AES-256-GCM under the keyring's
    active key, and opens it with whichever key sealed it::

        store = SqliteStore("app.db", codec=Encrypted(Keyring.from_env()))
    """

    def __init__(self, keyring: Keyring | None) -> None:
        if keyring is None:
            raise UsageError(
                f"no keyring: set {KEYRING_ENV} (or {KEYRING_FILE_ENV}) to id:base64-key entries,"
                " the active key first"
            )
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise MissingExtra("crypto", exc.name or "cryptography") from exc
        self.keyring = keyring
        self.key_id = keyring.active
        self._invalid_tag = InvalidTag
        self._ciphers: dict[str, Any] = {key_id: AESGCM(key) for key_id, key in keyring._keys.items()}
        self._sealing = self._ciphers[self.key_id]

    def __repr__(self) -> str:
        return f"Encrypted({self.keyring!r})"

    def seal(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
        """``plaintext`` sealed for ``aad`` with the active key, under a random 96-bit nonce:
        (its key id, nonce + ciphertext + tag)."""
        nonce = os.urandom(_NONCE_BYTES)
        return self.key_id, nonce + self._sealing.encrypt(nonce, plaintext, aad)

    def open(self, key_id: str, ciphertext: bytes, aad: bytes, where: str) -> bytes:
        """The plaintext of a value sealed for ``aad`` with ``key_id``."""
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise KeyUnavailable(key_id, where)
        if len(ciphertext) < _NONCE_BYTES + 16:
            raise DecryptionFailed(key_id, where)
        try:
            plain: bytes = cipher.decrypt(ciphertext[:_NONCE_BYTES], ciphertext[_NONCE_BYTES:], aad)
        except self._invalid_tag:
            raise DecryptionFailed(key_id, where) from None
        return plain
