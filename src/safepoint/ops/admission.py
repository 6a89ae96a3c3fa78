"""What the dashboard admits: I/O-free decisions about who is asking and what a request holds.

The dashboard serves one operator's browser on this machine. Other pages the same browser opens
must not read the ledger through it (a DNS-rebinding page reaches the port under a name of its
own: the ``Host`` check) nor act through it (a form another site submits: the ``Origin`` check,
and the token). A request's body is read only as far as it says, and only in one meaning: a
length that is not one plain number, a JSON body that is not an object, a field given twice or
one the action does not take are refused, never guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

from .._rules.canonical import decode_json, too_deep

DEFAULT_PORT = 8470  # the dashboard's, unless --port says otherwise
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
MAX_BODY_BYTES = 1024 * 1024
JSON_FIELDS = frozenset({"receipt"})  # form fields whose value is itself JSON


def host_allowed(host: str | None, port: int, names: Iterable[str] = LOOPBACK_NAMES) -> bool:
    """Whether a request's ``Host`` header names this dashboard: one of its loopback ``names``
    and its ``port`` (which may go unsaid only when it is 80).

    A DNS-rebinding page reaches the port under a host name of its own, and the browser sends
    that name: refusing every other name keeps the ledger from it. The match is exact (no
    trailing dot, no leading zeros, no spaces): anything unusual is somebody else's request.
    """
    if not host:
        return False
    allowed = {name.lower() for name in names}
    host = host.lower()
    if port == 80 and host in allowed:
        return True
    name, colon, given = host.rpartition(":")
    return bool(colon) and given == str(port) and name in allowed


def origins_of(port: int, names: Iterable[str] = LOOPBACK_NAMES) -> frozenset[str]:
    """The origins the dashboard's own pages send their forms from."""
    return frozenset(
        {f"http://{name.lower()}:{port}" for name in names}
        | ({f"http://{name.lower()}" for name in names} if port == 80 else set())
    )


def post_refusal(
    origin: str | None, fetch_site: str | None, has_bearer: bool, origins: Collection[str]
) -> str | None:
    """Why a POST may not act (None: it may). Browsers send ``Origin`` with every POST, so a
    form another site submits through the operator's browser names that site; a request
    without ``Origin`` is a program's, and must then carry the token as a Bearer header, which
    no cross-site form can set."""
    if fetch_site is not None and fetch_site.strip().lower() not in ("same-origin", "none"):
        return (
            f"a {fetch_site.strip()} request cannot act on the dashboard: use the"
            " dashboard's own page, or send the token as `Authorization: Bearer …`"
            " without an Origin"
        )
    if origin is None:
        if has_bearer:
            return None
        return (
            "a request without an Origin header must send the dashboard's token as `Authorization: Bearer …`"
        )
    if origin.strip().lower() in origins:
        return None
    return (
        f"a page of {origin.strip()[:100]!r} cannot act on the dashboard: only its own"
        f" pages ({', '.join(sorted(origins))}) or a program sending"
        " `Authorization: Bearer …` can"
    )


def bearer_token(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer …`` header (the scheme in any case)."""
    scheme, _, credential = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip() or None


class Refusal(Exception):
    """A request answered with an error before it reached the ledger: nothing changed."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def body_length(declared: list[str], limit: int = MAX_BODY_BYTES) -> int:
    """The body's length from its ``Content-Length`` headers (none: no body). Anything but one
    plain decimal number is refused: two lengths, a sign, an exponent — a server and a proxy
    that read them differently disagree on where the next request starts."""
    if not declared:
        return 0
    if len(declared) > 1:
        raise Refusal(HTTPStatus.BAD_REQUEST, "the request has more than one Content-Length")
    text = declared[0].strip()
    if not (text.isascii() and text.isdigit()):
        raise Refusal(HTTPStatus.BAD_REQUEST, f"Content-Length {text[:40]!r} is not a number of bytes")
    length = int(text)
    if length > limit:
        raise Refusal(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body is too large: {length} bytes, at most {limit}"
        )
    return length


def parse_form(body: bytes, content_type: str, action: str, fields: Collection[str]) -> dict[str, str]:
    """The fields of ``action``'s form, from a urlencoded form or a JSON object.

    Nothing ambiguous is guessed at: a field given twice (two resolutions, two names), a field
    the action does not take (a mistyped or foreign one), a list or an object where one value
    belongs, a body that is not UTF-8 or not a JSON object — each is refused, naming it.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(HTTPStatus.BAD_REQUEST, "the body is not UTF-8") from None
    pairs: list[tuple[str, str]] = []
    if "application/json" in content_type.lower():
        try:
            loaded = decode_json(text or "{}", object_pairs_hook=_one_value_each)
        except ValueError as exc:
            raise Refusal(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise Refusal(
                HTTPStatus.BAD_REQUEST,
                f"the body must be a JSON object of the form's fields, not {_kind(loaded)}",
            )
        for key, value in loaded.items():
            if value is None:
                continue  # null: the field is not given
            if isinstance(value, str):
                pairs.append((key, value))
            elif key in JSON_FIELDS or (isinstance(value, int | float) and not isinstance(value, bool)):
                pairs.append((key, _written(key, value)))
            else:
                raise Refusal(
                    HTTPStatus.BAD_REQUEST,
                    f"the field {key!r} takes one value, not {_kind(value)} ({_written(key, value)[:60]})",
                )
    else:
        try:
            pairs = parse_qsl(text, errors="strict")
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refusal(HTTPStatus.BAD_REQUEST, f"the form is malformed: {exc}") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        if key not in fields:
            raise Refusal(
                HTTPStatus.BAD_REQUEST,
                f"the {action} form has no field {key!r}: it takes {', '.join(sorted(fields))}",
            )
        if key in form:
            raise Refusal(HTTPStatus.BAD_REQUEST, f"the field {key!r} is given twice: say one thing")
        form[key] = value
    return form


def _written(key: str, value: Any) -> str:
    """A field's JSON value as text again: the form's fields are text. Writing it goes a little
    deeper than reading it did, so a body read at the very edge of what decodes is refused here
    the same way."""
    try:
        return json.dumps(value)
    except RecursionError:
        raise Refusal(HTTPStatus.BAD_REQUEST, f"the field {key!r} is not JSON: {too_deep()}") from None


def _one_value_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when it names a key twice (``json`` would keep the last)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the object names {key!r} twice: say one thing")
        found[key] = value
    return found


def _kind(value: Any) -> str:
    """A JSON value's kind, as JSON names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "a number"
