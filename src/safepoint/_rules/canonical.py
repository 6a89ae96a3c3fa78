"""Canonical JSON (RFC 8785), input hashes and content digests.

Everything the ledger compares byte for byte goes through here: step input hashes, payload
digests, artifact addresses. RFC 8785 gives one serialization per JSON value, so the same
inputs hash the same on every machine and every Python version.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import rfc8785

from ..errors import NotJSON
from ..types import JSON

# rfc8785 refuses integers outside IEEE-754's exact range, as I-JSON requires.
_MAX_SAFE_INT = 2**53 - 1


class _Unsafe(Exception):
    """Raised by ``_scan`` at the first part of a value that is not JSON."""


def _scan(value: Any, allow_tuples: bool) -> bool:
    """Check that ``value`` is JSON (``_Unsafe`` otherwise) and say whether Python's own JSON
    encoder writes it exactly as RFC 8785 does: True unless it holds a float (JCS writes numbers
    as ECMAScript does) or a key beyond the Basic Multilingual Plane (JCS sorts keys by UTF-16
    code units). One walk, no paths built: ``find_non_json`` builds them only on failure.

    Every step's inputs go through here, on replay too: exact types are tested before
    ``isinstance``, the strings and integers in a container are checked in its loop, with no
    call of their own, and a list's items are walked without the keys a dict's have. One frame
    per level of nesting, so that any value the encoder can write is scanned (a deeper one
    raises RecursionError: not JSON that can be hashed)."""
    kind = type(value)
    if (
        kind is list
        or (kind is tuple and allow_tuples)
        or (kind is not dict and (isinstance(value, list) or (allow_tuples and isinstance(value, tuple))))
    ):
        plain = True
        for item in value:
            kind = type(item)
            if kind is str:
                if not item.isascii():
                    item.encode("utf-8")  # UnicodeEncodeError: a lone surrogate
            elif kind is int:
                if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                    raise _Unsafe
            elif item is not None and kind is not bool:
                plain = _scan(item, allow_tuples) and plain
        return plain
    if kind is not dict and not isinstance(value, dict):
        return _scan_leaf(value)
    plain = True
    for key, item in value.items():
        if type(key) is not str and not isinstance(key, str):
            raise _Unsafe
        if not key.isascii():
            key.encode("utf-8")
            if max(key) > "\uffff":
                plain = False
        kind = type(item)
        if kind is str:
            if not item.isascii():
                item.encode("utf-8")
        elif kind is int:
            if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                raise _Unsafe
        elif item is not None and kind is not bool:
            plain = _scan(item, allow_tuples) and plain
    return plain


def _scan_leaf(value: Any) -> bool:
    """``_scan`` for a value that is no list, dict or (allowed) tuple."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        if not value.isascii():
            value.encode("utf-8")  # UnicodeEncodeError: a lone surrogate
        return True
    if isinstance(value, int):
        if abs(value) > _MAX_SAFE_INT:
            raise _Unsafe
        return True
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Unsafe
        return False
    raise _Unsafe


def _plain(value: Any, allow_tuples: bool = False) -> bool | None:
    """``_scan`` as a value: None when ``value`` is not JSON."""
    try:
        return _scan(value, allow_tuples)
    except (_Unsafe, UnicodeEncodeError, RecursionError):
        return None


def find_non_json(value: Any, *, allow_tuples: bool = False, path: str = "$") -> tuple[str, str] | None:
    """Return (path, type name) of the first part of ``value`` that is not JSON, or None.

    Results must round-trip exactly, so tuples are refused there (they would come back as
    lists); inputs only need a stable hash, so call arguments may be tuples.
    """
    if _plain(value, allow_tuples) is not None:
        return None
    try:
        return _locate(value, allow_tuples, path, frozenset())
    except RecursionError:
        return (path, f"value nested deeper than {sys.getrecursionlimit()} levels")


def _locate(value: Any, allow_tuples: bool, path: str, around: frozenset[int]) -> tuple[str, str] | None:
    """The slow walk that names where ``value`` stops being JSON; ``around`` holds the ids
    of the containers it is inside, so a value that contains itself is named as such."""
    if isinstance(value, (list, tuple, dict)):
        if id(value) in around:
            return (path, f"{type(value).__name__} that contains itself")
        around = around | {id(value)}
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return (path, "string with a lone surrogate")
        return None
    if isinstance(value, int):
        return None if abs(value) <= _MAX_SAFE_INT else (path, "integer beyond 2**53")
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"non-finite float {value!r}")
    if isinstance(value, list) or (allow_tuples and isinstance(value, tuple)):
        for index, item in enumerate(value):
            found = _locate(item, allow_tuples, f"{path}[{index}]", around)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"{path} key {key!r}", type(key).__name__)
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                return (f"{path} key {key!r}", "string with a lone surrogate")
            found = _locate(item, allow_tuples, f"{path}.{key}", around)
            if found:
                return found
        return None
    return (path, type(value).__name__)


def require_json(value: Any, what: str, step_id: str | None = None, *, allow_tuples: bool = False) -> None:
    """Raise ``NotJSON`` naming the step and the offending part unless ``value`` is JSON."""
    found = find_non_json(value, allow_tuples=allow_tuples)
    if found:
        raise NotJSON(what, found[0], found[1], step_id)


def canonical(value: JSON) -> bytes:
    """The RFC 8785 serialization of a JSON value (tuples serialize as arrays).

    Most values — no floats, keys within the Basic Multilingual Plane — are written exactly the
    same by Python's own encoder (sorted keys, no spaces, the same string escapes, integers as
    digits), which is several times faster than the pure-Python RFC 8785 encoder: it is used
    for them, and the RFC 8785 library for the rest."""
    return _encode(value, bool(_plain(value, allow_tuples=True)))


def checked_canonical(
    value: Any, what: str, step_id: str | None = None, *, allow_tuples: bool = False
) -> bytes:
    """``require_json`` and ``canonical`` in one walk of the value: a step's inputs and an
    effect's payload are checked and encoded on every call, and may be large."""
    plain = _plain(value, allow_tuples)
    if plain is None:
        require_json(value, what, step_id, allow_tuples=allow_tuples)  # names the part
    return _encode(value, bool(plain))


def canonical_if_json(value: Any, *, allow_tuples: bool = False) -> bytes | None:
    """``canonical(value)``, or None when ``value`` is not JSON — found in the same walk, for
    callers with another way to go on (``checked_canonical`` names the offending part)."""
    plain = _plain(value, allow_tuples)
    return None if plain is None else _encode(value, plain)


# Built once: ``json.dumps`` with any option but the defaults builds an encoder per call.
_PLAIN_CANONICAL = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _plain_chunks() -> Callable[[Any, int], Any] | None:
    """The C encoder ``_PLAIN_CANONICAL.encode`` makes on every call, made once (None where
    Python has none): the same options, so the same text, less the per-call set-up that costs
    a small input as much as its encoding. No check for a value that contains itself: a value
    is encoded here only once ``_scan`` walked it to its end."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encoder = _PLAIN_CANONICAL
    chunks: Callable[[Any, int], Any] = make(
        None,  # no markers: no check for cycles (see above)
        encoder.default,
        json.encoder.encode_basestring,  # what JSONEncoder writes strings with, ensure_ascii off
        encoder.indent,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    return chunks


_PLAIN_CHUNKS = _plain_chunks()


def _encode(value: JSON, plain: bool) -> bytes:
    if plain:
        if _PLAIN_CHUNKS is not None:
            return "".join(_PLAIN_CHUNKS(value, 0)).encode("utf-8")
        return _PLAIN_CANONICAL.encode(value).encode("utf-8")
    return rfc8785.dumps(value)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_hash(value: JSON) -> str:
    """sha256 of the canonical JSON of a step's inputs."""
    return sha256_hex(canonical(value))


def digest(data: bytes) -> str:
    """The content address of an artifact: ``sha256:<hex>``."""
    return "sha256:" + sha256_hex(data)


def dumps(value: JSON) -> str:
    """Compact JSON text for storage (not canonical: cheaper, and only hashed values need it)."""
    return _COMPACT.encode(value)


# What ``json.loads`` decodes text with, given no options, and the scanner under it: a ledger's
# load reads a thousand results, and the text the ledger wrote has no whitespace around its
# value, so the scanner alone reads it, without the decoder's two whitespace matches.
_DECODER = json.JSONDecoder()
_DECODE = _DECODER.decode
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def decode_json(
    text: str | bytes, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """The value of JSON text from outside — a request's body, a command's argument — or
    ``ValueError`` saying why it is none. Text nested deeper than Python's decoder goes makes
    the decoder raise ``RecursionError``, no ``ValueError``: left as it is, that reaches whoever
    reads the text as a fault of their own, not of the text, so it is a ``ValueError`` here too."""
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise ValueError(too_deep()) from None


def too_deep() -> str:
    """Why a value nested deeper than Python reads or writes is refused."""
    limit = sys.getrecursionlimit()
    return f"it nests arrays and objects too deeply to be read: keep it well under {limit} levels"


def loads(text: str | bytes) -> Any:
    """The value of stored JSON text: plain dicts and lists (see ``types.Recorded``)."""
    if isinstance(text, str):
        try:
            value, end = _SCAN(text, 0)
        except StopIteration:  # no value at its start: json.loads says why
            return json.loads(text)
        if end == len(text):
            return value
        return _DECODE(text)  # whitespace after the value, or more than one: as json.loads does
    return json.loads(text)  # bytes
