"""Credentials never enter the ledger.

A ledger is read by operators, copied to backups and kept for a long time: the worst place for
an API key. So every value safepoint is about to store (run inputs, step results, effect
payloads and receipts, run results) is searched first, and one that looks like a credential is
refused with ``SecretRefused``; error messages, which cannot be refused, are redacted instead.

"Looks like a credential" means either a key name that says so (``password``, ``api_key``,
``client_secret``, …) holding a string, or a string in a well-known token format (OpenAI and
Anthropic keys, Stripe, GitHub, Slack, AWS and Google keys, JWTs, bearer headers, PEM private
keys). A credential that a step needs travels as ``Secret``: step inputs are hashed, never
stored, and a ``Secret`` hashes as a fixed marker — rotating a key does not invalidate a run.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from ._transcript import Transcript
from .errors import SecretRefused

# Key names, lower-cased with "_", "-" and "." removed, that hold credentials; exact names,
# and endings (so "stripe_api_key" and "db_password" count, but "input_tokens" does not).
# A bare "token" is left out on purpose: model outputs (logprobs) and paging cursors use it.
_SECRET_KEYS = frozenset({
    "password", "passwd", "passphrase", "secret", "apikey", "apisecret", "apitoken",
    "accesstoken", "refreshtoken", "authtoken", "idtoken", "sessiontoken", "bearertoken",
    "privatekey", "secretkey", "accesskey", "clientsecret", "authorization", "credentials",
})
_SECRET_KEY_ENDINGS = ("password", "passwd", "apikey", "apisecret", "apitoken", "secretkey",
                       "secretaccesskey", "privatekey", "clientsecret", "accesstoken",
                       "refreshtoken", "authtoken", "sessiontoken", "privatetoken", "bottoken",
                       "hftoken", "webhooksecret", "signingsecret")

_TOKEN_FORMATS: tuple[tuple[str, str], ...] = (
    ("an Anthropic API key", r"sk-ant-[A-Za-z0-9_-]{20,}"),
    ("an OpenAI API key", r"sk-(?:proj-)?[A-Za-z0-9_-]{20,}"),
    ("a Stripe secret key", r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("a GitHub token", r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("a Slack token", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("an AWS access key id", r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),
    ("a Google API key", r"AIza[0-9A-Za-z_-]{35}"),
    ("a JSON Web Token", r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    ("a bearer credential", r"(?i:bearer)\s+[A-Za-z0-9._~+/-]{20,}=*"),
    ("a basic credential", r"(?i:basic)\s+[A-Za-z0-9+/]{12,}=*"),
    ("a password in a URL", r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]{3,}@"),
    ("a Hugging Face token", r"hf_[A-Za-z0-9]{30,}"),
    ("a private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)
_TOKENS = re.compile("|".join(f"(?P<t{index}>(?<![A-Za-z0-9]){pattern})"
                              for index, (_, pattern) in enumerate(_TOKEN_FORMATS)))
_MIN_KEYED_LENGTH = 8  # shorter values under a secret-sounding key are placeholders, not keys
REDACTED = "[redacted]"


class Secret:
    """A credential that may be passed to steps but is never recorded, printed or pickled.

    >>> key = Secret("sk-live-…")
    >>> run.read("invoice", fetch_invoice, invoice_id, api_key=key)  # fetch calls key.reveal()
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("a Secret holds a string")
        self._value = value

    def reveal(self) -> str:
        """The credential itself, for the one place that sends it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is never serialized")


SECRET_MARKER = {"$secret": "********"}


def hashed_form(value: Any) -> Any:
    """A copy of step inputs as their hash covers them: every ``Secret`` replaced by a fixed
    marker (a credential is passed on, never hashed), every ``Transcript`` by its reference
    (its length and chain digest: a constant cost, however long it grew)."""
    if isinstance(value, Secret):
        return SECRET_MARKER
    if isinstance(value, Transcript):
        return value.reference()
    if isinstance(value, dict):
        return {key: hashed_form(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [hashed_form(item) for item in value]
    return value


def _secret_key(key: str) -> bool:
    name = key.lower().replace("_", "").replace("-", "").replace(".", "")
    return name in _SECRET_KEYS or name.endswith(_SECRET_KEY_ENDINGS)


def _token_kind(text: str) -> str | None:
    match = _TOKENS.search(text)
    if match is None:
        return None
    return _TOKEN_FORMATS[int(str(match.lastgroup)[1:])][0]


def find_secret(value: Any, path: str = "$") -> tuple[str, str] | None:
    """(path, why) of the first part of ``value`` that looks like a credential, or None."""
    if isinstance(value, Secret):
        return path, "it is a Secret"
    if isinstance(value, str):
        kind = _token_kind(value)
        return (path, f"it looks like {kind}") if kind else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if (isinstance(key, str) and _secret_key(key) and isinstance(item, str)
                    and len(item) >= _MIN_KEYED_LENGTH and item.strip("*x") != ""
                    and item != REDACTED):
                return where, f"the key {key!r} names a credential"
            found = find_secret(item, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_secret(item, f"{path}[{index}]")
            if found:
                return found
    return None


def refuse_secrets(value: Any, what: str, step_id: str | None = None) -> None:
    """Raise ``SecretRefused`` if ``value`` holds anything that looks like a credential."""
    found = find_secret(value)
    if found:
        raise SecretRefused(what, found[0], found[1], step_id)


def error_evidence(exc: BaseException) -> dict[str, str]:
    """What of an exception may be recorded: its type, and its message redacted and cut."""
    return {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}


def redact(text: str) -> str:
    """``text`` with every well-known token format replaced: for error messages we must keep."""
    return _TOKENS.sub(REDACTED, text)


def redact_json(value: Any) -> Any:
    """A JSON value with every well-known token format redacted from its strings, and every
    string under a credential-sounding key replaced: for evidence and receipts we must keep."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: REDACTED if (isinstance(key, str) and _secret_key(key)
                                      and isinstance(item, str) and item)
                else redact_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_json(item) for item in value]
    return value
