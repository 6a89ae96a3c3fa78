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

What the scanner finds, in any string (dict keys included, at any depth):

* well-known token formats (OpenAI and Anthropic keys, Stripe, GitHub, GitLab, Slack, AWS,
  Google, Hugging Face, npm, PyPI, SendGrid keys, JWTs, bearer and basic credentials, PEM
  private keys, the password of a URL such as ``postgresql://u:pw@host/db``);
* a value given to a credential name in text: ``password=…`` / ``api_key=…`` / ``token=…`` in
  query strings, form bodies and ``key=value`` text, ``password: …`` lines, ``Authorization:``,
  ``Cookie:`` and ``Set-Cookie:`` headers, ``{'password': '…'}`` reprs and JSON inside messages;

and in a structure: every value held, at any depth, under a key that names a credential
(``password``, ``api_key``, ``client_secret``, ``Authorization``, ``Cookie``, ``X-Api-Key``, …;
case, ``_``, ``-`` and ``.`` do not matter) — strings of any length, numbers, nested lists and
dicts. Placeholders (``""``, ``"********"``, ``None``, ``"<your key>"``, ``"${API_KEY}"``, a
marked digest) are not credentials; neither are ``input_tokens``, ``max_tokens``, a model's
``"token"`` (logprobs), ``next_page_token``, or prose that mentions a password.

A credential that a step needs travels as ``Secret``: step inputs are hashed, never stored, and
a ``Secret`` hashes as a fixed marker — rotating a key does not invalidate a run.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, NoReturn

from ..errors import SecretRefused
from .transcript import Transcript

# -- what a credential looks like --------------------------------------------------------------

# Key names, lower-cased with "_", "-", "." and spaces removed (and a plural "s"), that hold
# credentials: exact names, and endings (so "stripe_api_key", "db_password" and "X-Api-Key"
# count, but "input_tokens" does not). A bare "token" is left out on purpose: model outputs
# (logprobs) and paging cursors use it; so is "pwd", a working directory as often as not.
_SECRET_KEYS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "apikey",
        "apisecret",
        "apitoken",
        "accesstoken",
        "refreshtoken",
        "authtoken",
        "idtoken",
        "sessiontoken",
        "bearertoken",
        "privatekey",
        "secretkey",
        "accesskey",
        "clientsecret",
        "authorization",
        "credential",
        "credentials",
        "cookie",
        "setcookie",
    }
)
_SECRET_KEY_ENDINGS = (
    "password",
    "passwd",
    "passphrase",
    "apikey",
    "apisecret",
    "apitoken",
    "secretkey",
    "secretaccesskey",
    "privatekey",
    "clientsecret",
    "accesstoken",
    "refreshtoken",
    "authtoken",
    "sessiontoken",
    "privatetoken",
    "bottoken",
    "hftoken",
    "csrftoken",
    "xsrftoken",
    "webhooksecret",
    "signingsecret",
    "authorization",
)
# In text only (``token=…``, ``pwd=…``), where such an assignment is a credential.
_ASSIGNED_NAMES = frozenset({"token", "pwd"})
# Keys whose value is a cookie: a credential when it looks like one (``sid=…``, an opaque
# value), not when it is a word ("chocolate chip").
_COOKIE_KEYS = frozenset({"cookie", "cookies", "setcookie"})

# (what it is, literal parts one of which any match contains, pattern): a string is searched
# for the literals first (fast, in C), and with a format's pattern only where one is there. A
# pattern's group "s" is the credential, where it is not the whole match.
_TOKEN_FORMATS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("an Anthropic API key", ("sk-ant-",), r"sk-ant-[A-Za-z0-9_-]{20,}"),
    ("an OpenAI API key", ("sk-",), r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("a Stripe secret key", ("_live_", "_test_"), r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("a Stripe webhook secret", ("whsec_",), r"whsec_[A-Za-z0-9]{20,}"),
    (
        "a GitHub token",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    ),
    ("a GitLab token", ("glpat-",), r"glpat-[A-Za-z0-9_-]{20,}"),
    ("a Slack token", ("xox", "xapp-"), r"(?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}"),
    ("an AWS access key id", ("AKIA", "ASIA"), r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),
    ("a Google API key", ("AIza",), r"AIza[0-9A-Za-z_-]{35}"),
    (
        "a Google OAuth credential",
        ("ya29.", "GOCSPX-"),
        r"(?:ya29\.[0-9A-Za-z_-]{20,}|GOCSPX-[0-9A-Za-z_-]{20,})",
    ),
    ("a Hugging Face token", ("hf_",), r"hf_[A-Za-z0-9]{30,}"),
    ("an npm token", ("npm_",), r"npm_[A-Za-z0-9]{36}"),
    ("a PyPI token", ("pypi-",), r"pypi-[A-Za-z0-9_-]{50,}"),
    ("a SendGrid key", ("SG.",), r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ("a JSON Web Token", ("eyJ",), r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    ("a bearer credential", ("earer", "EARER"), r"(?i:bearer)\s+(?P<s>[A-Za-z0-9._~+/-]{20,}=*)"),
    ("a basic credential", ("asic", "ASIC"), r"(?i:basic)\s+(?P<s>[A-Za-z0-9+/]{12,}=*)"),
    ("a password in a URL", ("://",), r"://[^/\s:@'\"]*:(?P<s>[^/\s@'\"]+)@"),
    (
        "a private key",
        ("-----BEGIN",),
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?!-----)[\s\S])*(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)?",
    ),
)
_ANCHORS = tuple(anchor for _, anchors, _ in _TOKEN_FORMATS for anchor in anchors)
# Whether a string holds any anchor: for a short one (an id, a name — asked on every step), one
# search for them all is quicker than a ``in`` per anchor; for a long one, the ``in``s are.
_ANY_ANCHOR = "|".join(map(re.escape, _ANCHORS))
_SHORT = 32
# What a string holds if it holds any credential: an anchor, or the ":" or "=" of an assignment.
# A short string without either (most ids) is answered with this one search.
_ANY_CLUE = f"{_ANY_ANCHOR}|[:=]"
# Formats that begin a word (a match inside one, "task-…", is none): all but a URL's and a
# PEM block's; and those whose credential follows a scheme word, which prose also has
# ("basic understanding").
_WORD_START = frozenset(
    kind for kind, anchors, _ in _TOKEN_FORMATS if anchors not in (("://",), ("-----BEGIN",))
)
_SCHEME_KINDS = frozenset({"a bearer credential", "a basic credential"})

# Where a credential name may be given a value in text: at a ":" or "=" (found fast, in C);
# the name is read back from there.
_SEPARATORS = r"[:=]"
_LONGEST_NAME = 64
# Every credential's name above holds one of these: a text without any is not read further.
_NAME_WORDS = ("pass", "pwd", "secret", "key", "token", "auth", "credential", "cookie")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_SCHEMES = frozenset(
    {
        "bearer",
        "basic",
        "token",
        "bot",
        "digest",
        "negotiate",
        "ntlm",
        "apikey",
        "key",
        "sharedkey",
        "oauth",
        "hawk",
        "aws4-hmac-sha256",
        "sso-key",
        "ssws",
    }
)
_HEADERS = frozenset({"authorization", "proxyauthorization", "cookie", "setcookie"})
_QUOTE = r"b?(\\*[\"'])"
_BARE_VALUE = r"\$\{[^{}\s]*\}|[^\s&;,'\"<>()\[\]{}]+"
_HEADER_VALUE = r"[^\r\n'\"]+"
_CODE_PATH = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # settings.API_KEY, os.environ

# Not credentials: what stands in for one.
_PLACEHOLDER = (
    r"""
      [\s*•·._-]* | x{3,16} | X{3,16}                       # empty, or a mask: ****, ••••, xxxx
    | [\[<(]?(?i:redacted|hidden|masked|removed|omitted|filtered|censored)[\]>)]?
    | sp_redacted:sha256:[0-9a-f]{0,16}                    # a marked digest (even cut short)
    | (?i:none|null|nil|undefined|true|false)
    | \$\{[^{}]*\} | \$[A-Z_][A-Z0-9_]* | \{\{[^{}]*\}\}    # ${API_KEY}, $API_KEY, {{ key }}
    | %\(\w*\)s | %s | \{\w*\}                             # %(password)s, %s, {password}
    | <[^<>]*>                                             # <your api key>
    | (?i:your)[\w\s-]* | (?i:insert|enter|replace)[-_\s][\w\s-]*  # your-api-key, enter key
    | [\w-]*[-_](?i:here)                                 # key_here, api-key-goes-here
    | (?:\w{0,8}[-_])*(?:\.\.\.|…)                        # sk-proj-...: an example cut short
""",
    re.VERBOSE,
)
# "reset", "Practice", "chocolate chip": words, not a credential
_PROSE_WORDS = r"[A-Za-z][a-z]*(?:[ -][A-Za-z][a-z]*)*"

MARK = "sp_redacted:sha256:"


# The patterns above are compiled when first used, not at import: compiling them all is a few
# milliseconds every process importing safepoint would pay, and most never look for a secret.
@cache
def _pattern(source: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(source, flags)


@cache
def _formats_compiled() -> tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...]:
    return tuple((kind, anchors, re.compile(pattern)) for kind, anchors, pattern in _TOKEN_FORMATS)


def marker(secret: str) -> str:
    """The marked digest that stands for ``secret`` in the ledger: the same for the same
    secret everywhere, so a redacted value is stable across runs and resumes."""
    data = secret.encode("utf-8", "surrogatepass")
    return MARK + hashlib.sha256(data).hexdigest()[:16]


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(".", "").replace(" ", "")


@lru_cache(maxsize=4096)
def credential_name(name: str) -> bool:
    """Whether a key (or a name in text) names a credential: ``password``, ``X-Api-Key``, …"""
    normal = _normal(name)
    for form in (normal, normal[:-1]) if normal.endswith("s") else (normal,):
        if form in _SECRET_KEYS or form.endswith(_SECRET_KEY_ENDINGS):
            return True
    return False


def _placeholder(text: str) -> bool:
    return _pattern(*_PLACEHOLDER).fullmatch(text) is not None


def _prose(text: str) -> bool:
    return _pattern(_PROSE_WORDS).fullmatch(text) is not None


# -- credentials in a string -------------------------------------------------------------------

Span = tuple[int, int, str]  # (start, end, why) of a credential inside a string


def text_spans(text: str, first: bool = False) -> list[Span]:
    """Where ``text`` holds credentials, in order and merged where they overlap (only the first
    one found with ``first``)."""
    if len(text) < 5:
        return []  # too short for any: the shortest is "pwd=x"
    if len(text) < _SHORT and _pattern(_ANY_CLUE).search(text) is None:
        return []
    spans = _formats(text, first)
    if not (first and spans):
        spans += _assignments(text, first)
    if len(spans) > 1:
        spans = _merged(spans)
    return spans


def _formats(text: str, first: bool) -> list[Span]:
    found: list[Span] = []
    if len(text) < _SHORT:
        if _pattern(_ANY_ANCHOR).search(text) is None:
            return found
    elif not any(map(text.__contains__, _ANCHORS)):
        return found
    for kind, anchors, pattern in _formats_compiled():
        if not any(map(text.__contains__, anchors)):
            continue
        for match in pattern.finditer(text):
            start = match.start()
            if kind in _WORD_START and start and text[start - 1].isascii() and text[start - 1].isalnum():
                continue  # inside a word: "task-…" is no key
            if "s" in pattern.groupindex:
                part = match.group("s")
                if _placeholder(part) or (kind in _SCHEME_KINDS and _prose(part)):
                    continue
                found.append((match.start("s"), match.end("s"), f"it looks like {kind}"))
            else:
                found.append((start, match.end(), f"it looks like {kind}"))
            if first:
                return found
    return found


def _assignments(text: str, first: bool) -> list[Span]:
    found: list[Span] = []
    if ("=" not in text and ":" not in text) or not any(map(text.lower().__contains__, _NAME_WORDS)):
        return found
    for match in _pattern(_SEPARATORS).finditer(text):
        span = _assigned_value(text, match.start())
        if span is not None:
            found.append(span)
            if first:
                break
    return found


def _assigned_value(text: str, at: int) -> Span | None:
    """The credential a name is given by the ``:`` or ``=`` at ``at`` (``password=…``,
    ``'api_key': '…'``, ``Cookie: …``), or None: the name before it is no credential's, or
    the value is a placeholder."""
    sep, end = text[at], at
    while end and text[end - 1] in " \t":
        end -= 1
    quoted = end and text[end - 1] in "'\""
    if quoted:
        end -= 1
        while end and text[end - 1] == "\\":
            end -= 1
    begin, bound = end, max(0, end - _LONGEST_NAME - 1)
    while begin > bound and text[begin - 1] in _NAME_CHARS:
        begin -= 1
    if begin == end or end - begin > _LONGEST_NAME:
        return None  # no name, or a run of text no credential's name is as long as
    name = text[begin:end]
    if not credential_name(name) and begin >= 2 and text[begin - 1] == " " and text[begin - 2] in _NAME_CHARS:
        before = begin - 1  # two words: "API key: …", "access token = …"
        while before > bound and text[before - 1] in _NAME_CHARS:
            before -= 1
        if credential_name(text[before:end]):
            name = text[before:end]
    normal = _normal(name)
    if not (credential_name(name) or (sep == "=" and normal in _ASSIGNED_NAMES)):
        return None
    if sep == "=" and text.startswith("=", at + 1):
        return None  # a comparison: password == …
    in_query = begin > 0 and text[begin - 1] in "?&"
    value = _value_after(text, at + 1, normal, sep, bool(quoted), in_query)
    if value is None:
        return None
    shown = name if not _formats(name, True) else "a credential name"
    return value[0], value[1], f"it gives {shown!r} a value"


def _value_after(
    text: str, at: int, normal: str, sep: str, quoted_name: bool, in_query: bool
) -> tuple[int, int] | None:
    """(start, end) of the credential after a credential name's ``:`` or ``=`` at ``at``."""
    while at < len(text) and text[at] in " \t":
        at += 1
    if at >= len(text):
        return None
    quote = _pattern(_QUOTE).match(text, at)
    if quote is not None:  # a quoted value: "…", '…', \"…\", b'…'
        start = quote.end()
        stop = text.find(quote.group(1), start)
        if stop == -1:
            stop = min(len(text), start + 4096)
        part = text[start:stop]
        if _placeholder(part) or (normal in _COOKIE_KEYS and _prose(part)):
            return None
        return start, stop
    if text[at] in "[{(" and quoted_name:  # a repr or JSON: {'password': ['…']}
        stop = _closing(text, at)
        inner = text[at + 1 : stop - 1].strip(" \t\r\n,")
        return None if not inner or _placeholder(inner) else (at, stop)
    if sep == ":" and not quoted_name and normal in _HEADERS:
        return _header_value(text, at, normal)
    bare = _pattern(_BARE_VALUE).match(text, at)
    if bare is None:
        return None
    part = bare.group(0).rstrip(".,:;!?")
    stop = at + len(part)
    if not part or _placeholder(part) or _placeholder(bare.group(0)) or (normal == "pwd" and part[0] in "/~"):
        return None  # PWD=/home/ops is a working directory
    if sep == "=" and not quoted_name and not in_query and _code(text, stop, part, normal):
        return None
    if sep == ":" and not quoted_name and _prose(part) and _more_words(text, stop):
        return None  # "Password: reset it by mail" is prose
    return at, stop


def _header_value(text: str, at: int, normal: str) -> tuple[int, int] | None:
    """The credential of an ``Authorization:``, ``Cookie:`` or ``Set-Cookie:`` header line:
    its value to the end of the line (after the scheme, for Authorization)."""
    header = _pattern(_HEADER_VALUE).match(text, at)
    if header is None:
        return None
    part = header.group(0).rstrip()
    stop = at + len(part)
    if normal.endswith("cookie"):
        return (at, stop) if "=" in part else None
    words = part.split(None, 1)
    if words[0].lower() in _SCHEMES:
        if len(words) == 1 or _placeholder(words[1]):
            return None
        return stop - len(words[1]), stop
    if _placeholder(words[0]) or _prose(words[0]):
        return None  # "Authorization: required", "Set the Authorization: header"
    return at, at + len(words[0])


def _code(text: str, stop: int, part: str, normal: str) -> bool:
    """``api_key=os.getenv("KEY")``, ``password=settings.DB_PASSWORD``, ``token=token``,
    ``api_key=API_KEY``: code that names where a credential comes from, not the credential."""
    if stop < len(text) and text[stop] in "([":
        return True
    if _pattern(_CODE_PATH).fullmatch(part):
        return True
    return _normal(part) == normal or (credential_name(part) and ("_" in part or part.isupper()))


def _more_words(text: str, stop: int) -> bool:
    return stop + 1 < len(text) and text[stop] == " " and text[stop + 1].isalpha()


def _closing(text: str, at: int) -> int:
    """The end of the bracketed value opening at ``at`` (quotes respected), or of the text."""
    depth, quote, index = 0, "", at
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return len(text)


def _merged(spans: list[Span]) -> list[Span]:
    spans.sort()
    merged = [spans[0]]
    for start, stop, why in spans[1:]:
        last_start, last_stop, last_why = merged[-1]
        if start < last_stop:
            merged[-1] = (last_start, max(stop, last_stop), last_why)
        else:
            merged.append((start, stop, why))
    return merged


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
        if (
            under is not None
            and not _placeholder(value)
            and not (direct and _normal(under) in _COOKIE_KEYS and _prose(value))
        ):
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
