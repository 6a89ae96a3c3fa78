"""Ids: what a run id, a step id, an operation id or a name may be — checked before anything is
recorded, the same way for every store.

An id names a record for as long as the ledger is kept, is typed into commands and sent to
effect owners inside keys, so it must be a real name: a non-empty string that is not blank, of
at most ``MAX_ID_LENGTH`` characters, storable as UTF-8 (no lone surrogate), without NUL (which
C-string APIs and the key derivation treat as an end) — and never a credential (ids are printed
and indexed everywhere). A malformed id would otherwise fall through to a default (an empty run
id became a fresh random run per call, so its effects ran once per call) or fail deep in a
store after the run had started.
"""

from __future__ import annotations

from ..errors import InvalidStepId, UsageError
from .secrets import refuse_secrets, storable_text

MAX_ID_LENGTH = 1000

_ALLOWED = (
    f"a non-empty string of at most {MAX_ID_LENGTH} characters, storable as UTF-8"
    " (no lone surrogate), without NUL"
)


def id_problem(value: object) -> str | None:
    """Why ``value`` cannot be an id, or None when it can (I/O-free; secrets are checked by
    the callers that record it)."""
    if not isinstance(value, str):
        return f"it is a {type(value).__name__}, not a string"
    if not value or value.isspace():
        return "it is blank"
    if len(value) > MAX_ID_LENGTH:
        return f"it is {len(value)} characters long"
    if "\x00" in value:
        return "it contains NUL"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"it contains a lone surrogate ({value[exc.start]!r})"
    return None


def check_id(value: object, what: str) -> str:
    """``value`` as the id ``what`` names (``"run id"``, ``"operation id"``, ``"workflow
    name"``); ``UsageError`` saying what is allowed otherwise, ``SecretRefused`` for one that
    looks like a credential."""
    if isinstance(value, str):
        refuse_secrets(value, f"the {what}")  # before any message repeats the value
    problem = id_problem(value)
    if problem is not None:
        article = "an" if what[0] in "aeiou" else "a"
        raise UsageError(
            f"invalid {what} {value!r}: {problem}; {article} {what} is {_ALLOWED}, e.g. 'case-8472-follow-up'"
        )
    assert isinstance(value, str)
    return value


def check_run_id(value: object) -> str:
    """A run id: an id that is also a path segment of the dashboard's pages, where ``.`` and
    ``..`` cannot be addressed (browsers resolve them away, even percent-encoded)."""
    if value in (".", ".."):
        raise UsageError(
            f"invalid run id {value!r}: it cannot be addressed in a URL; a run id"
            f" is {_ALLOWED}, other than '.' and '..'"
        )
    return check_id(value, "run id")


def check_who(by: object, acts: str) -> str:
    """``by``, the person who ``acts`` ("approves", "resolves the run"): a name recorded with
    what they did and shown wherever it is — so held to the rules of an id (no NUL, no lone
    surrogate, not blank), which every store can keep and every terminal can show."""
    if not by or not isinstance(by, str):
        raise UsageError(f"say who {acts}: by='name'")
    return check_id(by, "name given as by=")


def check_words(value: object, what: str) -> None:
    """A person's own words recorded as given (evidence, a reason): ``UsageError`` for text no
    store can keep — NUL, or a lone surrogate — the same on every store."""
    if not isinstance(value, str):
        return  # None, or a mistake its verb names
    problem = (
        "it contains NUL"
        if "\x00" in value
        else None
        if storable_text(value) == value
        else "it contains a lone surrogate"
    )
    if problem is not None:
        raise UsageError(f"{what} {value!r} cannot be recorded: {problem}; write it as plain text")


def check_step_id(value: object) -> str:
    """A step id as the workflow wrote it (before any fan-out prefix or occurrence counter):
    an id without ``#``, which safepoint appends to repeated ids."""
    if isinstance(value, str):
        refuse_secrets(value, "the step id")
    problem = id_problem(value)
    if problem is None and isinstance(value, str) and "#" in value:
        problem = "it contains '#'"
    if problem is not None:
        raise InvalidStepId(value, problem)
    assert isinstance(value, str)
    return value
