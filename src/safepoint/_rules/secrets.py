"""Credentials never enter the ledger.

A ledger is read by operators, copied to backups and kept for a long time: the worst place for
an API key. So every value and every string safepoint is about to store goes through one
scanner first (``findings``), and one of two policies decides what happens to what it finds:

* **refuse** (``refuse_secrets``) where the caller chose the value — run inputs, step results,
  effect payloads, ids, model ids, continue-as-new state, who approved or resolved and why:
  ``SecretRefused`` names the place and the reason, never the credential itself;
* **redact** (``redact_text``, ``redact_json``) where safepoint records text on the caller's
  behalf — error messages, receipts, rejection evidence, reasons, recovery records: each
  credential is replaced by a marked digest, ``sp_redacted:sha256:<16 hex>``, the same for the
  same credential everywhere. What is recorded is what the workflow sees, on the first run and
  on replay, so a resume walks the same path.

What the scanner finds in any string (dict keys included, at any depth) — token formats, and a
value given to a credential name in text — is ``_rules.credential_text``'s to say. In a
structure it finds, besides, every value held, at any depth, under a key that names a
credential (``password``, ``api_key``, ``Authorization``, ``Cookie``, ``X-Api-Key``, …) —
strings of any length, numbers, nested lists and dicts — unless it stands in for one
(``""``, ``"********"``, ``None``, ``"<your key>"``, a marked digest).

A credential that a step needs travels as ``Secret``: step inputs are hashed, never stored, and
a ``Secret`` hashes as a fixed marker — rotating a key does not invalidate a run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn

from ..errors import SecretRefused
from .credential_text import Span, credential_name, given_value, text_spans
from .transcript import Transcript

# -- the marked digest ----------------------------------------------------------------------------

MARK = "sp_redacted:sha256:"


def marker(secret: str) -> str:
    """The marked digest that stands for ``secret`` in the ledger: the same for the same
    secret everywhere, so a redacted value is stable across runs and resumes."""
    data = secret.encode("utf-8", "surrogatepass")
    return MARK + hashlib.sha256(data).hexdigest()[:16]


def _redacted(text: str, spans: list[Span]) -> str:
    parts, at = [], 0
    for start, stop, _ in spans:
        parts += [text[at:start], marker(text[start:stop])]
        at = stop
    parts.append(text[at:])
    return "".join(parts)


# -- credentials in a value ----------------------------------------------------------------------

Path = tuple[Any, ...] | None  # a linked path: (parent path, key or index), None at the top


@dataclass(frozen=True, slots=True)
class Finding:
    """One credential the scanner found: where (``path``, keys and indexes from the top), why,
    and how it is redacted: the spans of a string (``spans``), a whole value (``spans`` None),
    or the dict key itself (``in_key``)."""

    path: tuple[Any, ...]
    why: str
    spans: list[Span] | None = None
    in_key: bool = False

    def where(self) -> str:
        """The path as ``$.headers.Cookie[0]``, every key redacted: never the credential."""
        parts = ["$"]
        for step in self.path:
            parts.append(f"[{step}]" if isinstance(step, int) else f".{redact_text(str(step))}")
        return "".join(parts)


def _unlinked(link: Path) -> tuple[Any, ...]:
    steps = []
    while link is not None:
        link, step = link
        steps.append(step)
    return tuple(reversed(steps))


def _scalar(
    value: Any, under: str | None, first: bool, direct: bool = False
) -> tuple[str, list[Span] | None] | None:
    """(why, spans) of a credential in a scalar (or a Secret), held under the credential key
    ``under`` (if any; ``direct``: as its very value); None when it holds none. ``spans``
    None: the whole value is one."""
    if isinstance(value, str):
        if under is not None and given_value(value, under if direct else None):
            return f"the key {redact_text(under)!r} names a credential", None
        spans = text_spans(value, first)
        return (spans[0][2], spans) if spans else None
    if isinstance(value, Secret):
        return "it is a Secret", None
    if under is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"the key {redact_text(under)!r} names a credential", None
    return None


def findings(value: Any, first: bool = False) -> Iterator[Finding]:
    """Every credential in ``value`` (any JSON-ish value: strings, dict keys and values,
    lists and tuples, nested to any depth); only one with ``first``. One walk, without
    recursion: a value as deep as the rest of the library accepts is scanned whole."""
    if not isinstance(value, (dict, list, tuple)):
        found = _scalar(value, None, first)
        if found is not None:
            yield Finding((), *found)
        return
    stack: list[tuple[Any, Path, str | None]] = [(value, None, None)]
    while stack:
        container, link, under = stack.pop()
        if isinstance(container, dict):
            items: Any = container.items()
            pair = _pair_name(container) if under is None else None
        else:
            items, pair = enumerate(container), None
        for key, item in items:
            item_under = under
            if type(key) is str or isinstance(key, str):
                key_spans = _key_spans(key)
                if key_spans:
                    yield Finding(
                        _unlinked((link, key)),
                        f"the key itself: {key_spans[0][2]}",
                        list(key_spans),
                        in_key=True,
                    )
                    if first:
                        return
                if under is None:
                    item_under = key if credential_name(key) else (pair if key == "value" else None)
            if isinstance(item, (dict, list, tuple)):
                stack.append((item, (link, key), item_under))
            elif item is not None and item is not True and item is not False:
                found = _scalar(item, item_under, first, item_under is key)
                if found is not None:
                    yield Finding(_unlinked((link, key)), *found)
                    if first:
                        return


@lru_cache(maxsize=4096)
def _key_spans(key: str) -> tuple[Span, ...]:
    """``text_spans`` of a dict key: keys repeat (every row of a result has the same)."""
    return tuple(text_spans(key))


def _pair_name(container: dict[Any, Any]) -> str | None:
    """The credential a name/value pair names — ``{"name": "Cookie", "value": "…"}``, as HAR
    files and form fields hold headers — or None."""
    name = container.get("name") if "value" in container else None
    return name if isinstance(name, str) and credential_name(name) else None


def find_secret(value: Any, path: str = "$") -> tuple[str, str] | None:
    """(path, why) of a part of ``value`` that looks like a credential, or None."""
    kind = type(value)
    if kind is str:  # an id, a model id, a step's text: asked on every step
        spans = text_spans(value, first=True)
        return (path, spans[0][2]) if spans else None
    if value is None or kind is int or kind is float or kind is bool:
        return None  # a number or a flag under no key is no credential (see ``_scalar``)
    for found in findings(value, first=True):
        return path + found.where()[1:], found.why
    return None


# -- the two policies ---------------------------------------------------------------------------


def refuse_secrets(value: Any, what: str, step_id: str | None = None) -> None:
    """Raise ``SecretRefused`` if ``value`` (a structure or a plain string, such as an id) holds
    anything that looks like a credential: for what the caller chose to record."""
    found = find_secret(value)
    if found:
        raise SecretRefused(what, found[0], found[1], step_id)


def redact_text(text: str) -> str:
    """``text`` with every credential in it replaced by its marked digest: for text safepoint
    records on the caller's behalf (error messages, reasons). Made storable first: a lone
    surrogate (a file name that is not UTF-8, say, decoded with ``surrogateescape``) is written
    as its escape, as no store can keep it — the write would be refused and the run left as
    it was."""
    text = storable_text(text)
    spans = text_spans(text)
    return _redacted(text, spans) if spans else text


def storable_text(text: str) -> str:
    """``text`` as every store can keep it: its lone surrogates backslash-escaped."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def storable_json(value: Any) -> Any:
    """``value`` as a JSON value every store can keep: for what an owner says that must be
    recorded whatever it holds (a rejection's evidence). Strings and keys are made storable,
    and what is not JSON (a set, an exception, an object of the caller's) becomes its text."""
    if isinstance(value, str):
        return storable_text(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {storable_text(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return storable_text(repr(value))


# Provider state a model's reply carries for the next request, sent back byte for byte: it is
# encrypted or signed by the provider, not a credential, however its characters happen to fall
# (a Fernet token is url-safe base64, where "-sk-" and 20 more characters turn up now and then).
# Field name -> the block types it is opaque in (None: any).
_OPAQUE_FIELDS: dict[str, tuple[str, ...] | None] = {
    "encrypted_content": None,  # OpenAI reasoning items, Anthropic compaction blocks
    "signature": ("thinking",),  # Anthropic thinking blocks
    "data": ("redacted_thinking",),  # Anthropic redacted thinking blocks
}


def _opaque(value: Any, finding: Finding) -> bool:
    """Whether ``finding`` is the whole of a provider's opaque field (``_OPAQUE_FIELDS``)."""
    if finding.in_key or not finding.path or finding.path[-1] not in _OPAQUE_FIELDS:
        return False
    parent = value
    try:
        for step in finding.path[:-1]:
            parent = parent[step]
    except (KeyError, IndexError, TypeError):
        return False
    key = finding.path[-1]
    if not isinstance(parent, dict) or not isinstance(parent.get(key), str):
        return False
    types = _OPAQUE_FIELDS[key]
    return types is None or parent.get("type") in types


def redact_json(value: Any, *, keep_opaque: bool = False) -> Any:
    """A JSON value with every credential in it replaced by its marked digest — in strings,
    keys, and every value under a credential's key: for receipts and evidence we must keep.
    A value without credentials is returned as it is; otherwise only the containers on the
    way to a credential are copied (tuples become lists, as JSON has them). With
    ``keep_opaque`` (a model's reply), a provider's encrypted or signed state
    (``_OPAQUE_FIELDS``) is kept as it is: the next request must send it back unchanged."""
    found = list(findings(value))
    if keep_opaque:
        found = [f for f in found if not _opaque(value, f)]
    if not found:
        return value
    if not isinstance(value, (dict, list, tuple)):
        return _replacement(value, found[0])
    holder: list[Any] = [value]
    copies: dict[int, Any] = {}
    done: set[tuple[int, Any, bool]] = set()  # a part shared by two paths is redacted once
    # Values first, keys after (deepest first): a path names the keys as they were.
    for finding in sorted(found, key=lambda f: (f.in_key, -len(f.path))):
        parent = _copied_path(holder, finding.path[:-1], copies)
        step = finding.path[-1]
        if (id(parent), step, finding.in_key) in done:
            continue
        done.add((id(parent), step, finding.in_key))
        if finding.in_key:
            new_key = _redacted(step, finding.spans or [])
            parent_copy = {(new_key if key == step else key): item for key, item in parent.items()}
            parent.clear()
            parent.update(parent_copy)
        else:
            parent[step] = _replacement(parent[step], finding)
    return holder[0]


def _replacement(value: Any, finding: Finding) -> Any:
    if finding.spans is not None and isinstance(value, str):
        return _redacted(value, finding.spans)
    return marker(value.reveal() if isinstance(value, Secret) else str(value))


def _copied_path(holder: list[Any], path: tuple[Any, ...], copies: dict[int, Any]) -> Any:
    """The container at ``path``, copied (with every container above it), once each."""
    parent: Any = holder
    step: Any = 0
    for next_step in (*path, None):
        node = parent[step]
        copy = copies.get(id(node))
        if copy is None:
            copy = dict(node) if isinstance(node, dict) else list(node)
            copies[id(node)] = copy
            copies[id(copy)] = copy
        parent[step] = copy
        if next_step is None:
            return copy
        parent, step = copy, next_step
    raise AssertionError("unreachable")


def error_evidence(exc: BaseException, limit: int = 2000) -> dict[str, str]:
    """What of an exception may be recorded: its type, and its message redacted and cut."""
    return {"type": type(exc).__name__, "message": redacted_message(str(exc), limit)}


def redacted_message(text: str, limit: int = 4000) -> str:
    """``text`` redacted, then cut to ``limit`` characters (cut after redaction, so that no
    credential is cut short of what makes it recognisable)."""
    return redact_text(text[: limit + 8192])[:limit]


# -- Secret ----------------------------------------------------------------------------------------


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
