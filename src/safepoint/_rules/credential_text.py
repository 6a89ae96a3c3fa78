"""Credentials in text: what one looks like, and where one is in a string.

This is the scanner's knowledge of credentials (``_rules.secrets`` applies it to whole values and
decides what to do with what it finds). In any string — a dict key, a value, an error message —
it finds:

* well-known token formats (OpenAI and Anthropic keys, Stripe, GitHub, GitLab, Slack, AWS,
  Google, Hugging Face, npm, PyPI, SendGrid keys, JWTs, bearer and basic credentials, PEM
  private keys, the password of a URL such as ``postgresql://u:pw@host/db``): ``_TOKEN_FORMATS``;
* a value given to a credential name in text: ``password=…`` / ``api_key=…`` / ``token=…`` in
  query strings, form bodies and ``key=value`` text, ``password: …`` lines, ``Authorization:``,
  ``Cookie:`` and ``Set-Cookie:`` headers, ``{'password': '…'}`` reprs and JSON inside messages.

Which names are a credential's (``credential_name``: ``password``, ``api_key``,
``client_secret``, ``Authorization``, ``Cookie``, ``X-Api-Key``, …; case, ``_``, ``-`` and ``.``
do not matter) is decided here too, for keys as for text. Placeholders (``""``,
``"********"``, ``"<your key>"``, ``"${API_KEY}"``, a marked digest) are not credentials;
neither are ``input_tokens``, ``max_tokens``, a model's ``"token"`` (logprobs),
``next_page_token``, or prose that mentions a password.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache

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


# The patterns above are compiled when first used, not at import: compiling them all is a few
# milliseconds every process importing safepoint would pay, and most never look for a secret.
@cache
def _pattern(source: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(source, flags)


@cache
def _formats_compiled() -> tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...]:
    return tuple((kind, anchors, re.compile(pattern)) for kind, anchors, pattern in _TOKEN_FORMATS)


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


def given_value(value: str, name: str | None = None) -> bool:
    """Whether ``value``, given to a credential's name, is the credential — not what stands in
    for one: a placeholder, or, given to a cookie's ``name``, words ("chocolate chip")."""
    return not (_placeholder(value) or (name is not None and _normal(name) in _COOKIE_KEYS and _prose(value)))


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
        return (start, stop) if given_value(part, normal) else None
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
