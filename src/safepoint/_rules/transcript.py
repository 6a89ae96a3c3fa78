"""A transcript: an append-only sequence of JSON values whose digest grows with it.

An agent loop hands the conversation so far to every model call. As a plain list, the step's
input hash covers the whole conversation again at every step, so a run's hashing grows with
the square of its length. A ``Transcript`` keeps a hash chain instead: appending an item costs
that item's size, and a step given the transcript hashes a fixed-size reference to it — its
length and chain digest, which bind every item in order — whatever its length.

The chain (DESIGN: "input hash"): ``link(0) = sha256(b"")``, ``link(n) = sha256(link(n-1) ||
sha256(canonical(item n)))``, each digest as 32 raw bytes. A replay rebuilds the same chain
from the same recorded items, so the same steps get the same input hashes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

from ..errors import UsageError
from ..types import JSON
from .canonical import checked_canonical, dumps

REFERENCE_KEY = "$transcript"
_EMPTY_LINK = hashlib.sha256(b"").digest()
_READS_ONLY = "_safepoint_reads_messages_only"
F = TypeVar("F", bound=Callable[..., Any])


class Transcript(Sequence[JSON]):
    """An append-only list of JSON values — a conversation, a scratchpad — that steps can be
    given whole at a constant hashing cost.

    Items are kept as JSON text and read back as fresh values, exactly as appended (a float
    stays a float): changing an item you read never changes the transcript (nor its digest,
    which hashes each item's canonical JSON). There is no way to change or remove an
    item; a conversation that must be cut starts a new transcript. A step function receives the
    transcript itself (a read-only ``Sequence``); ``run.model(messages=transcript)`` passes the
    model function a plain list. It is not JSON: a step result or an effect payload takes
    ``list(transcript)``. Append from the workflow's own code (or one branch of a fan-out),
    never from branches at once: a replay must append in the same order.

    >>> messages = Transcript([{"role": "user", "content": question}])
    >>> reply = run.model("answer", llm, model="m", messages=messages)
    >>> messages.append(reply["message"])
    """

    __slots__ = ("_items", "_kept", "_link")

    def __init__(self, items: Iterable[JSON] = ()) -> None:
        if isinstance(items, (str, bytes, Mapping)):  # iterable, but surely one item, not many
            raise UsageError(
                f"Transcript takes a list of items; wrap one {type(items).__name__}"
                " in a list: Transcript([message])"
            )
        self._items: list[str] = []
        # the items decoded once, for model functions that only read them (``kept_items``)
        self._kept: list[JSON] = []
        self._link = _EMPTY_LINK
        self.extend(items)

    def append(self, item: JSON) -> None:
        """Add one JSON value at the end (checked and encoded now: a value that is not JSON
        raises ``NotJSON`` and leaves the transcript as it was)."""
        encoded = checked_canonical(item, "a transcript item")
        self._link = hashlib.sha256(self._link + hashlib.sha256(encoded).digest()).digest()
        self._items.append(dumps(item))

    def extend(self, items: Iterable[JSON]) -> None:
        if isinstance(items, (str, bytes, Mapping)):
            raise UsageError(
                f"extend takes a list of items; append one {type(items).__name__} with append(item)"
            )
        for item in items:
            self.append(item)

    @property
    def digest(self) -> str:
        """The chain digest of every item in order: ``sha256:<hex>``."""
        return "sha256:" + self._link.hex()

    def reference(self) -> dict[str, Any]:
        """What a step's input hash covers in place of the items: their number and chain."""
        return {REFERENCE_KEY: self.digest, "length": len(self._items)}

    def __len__(self) -> int:
        return len(self._items)

    def kept_items(self) -> list[JSON]:
        """A new list of the items decoded once and kept: each item is decoded the first time
        this is asked for, never again, so an agent loop's turn costs the same at turn 200 as
        at turn 2. The values are shared between calls: only for a model function marked
        ``reads_messages_only``, which hands them to an SDK and changes none of them. Every
        other read (iterating, indexing, ``list(transcript)``) decodes fresh values."""
        for text in self._items[len(self._kept) :]:
            self._kept.append(json.loads(text))
        return list(self._kept)

    @overload
    def __getitem__(self, index: int) -> JSON: ...
    @overload
    def __getitem__(self, index: slice) -> list[JSON]: ...
    def __getitem__(self, index: int | slice) -> JSON | list[JSON]:
        if isinstance(index, slice):
            return [json.loads(item) for item in self._items[index]]
        item: JSON = json.loads(self._items[index])
        return item

    def __iter__(self) -> Iterator[JSON]:
        return (json.loads(item) for item in self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Transcript):
            return self._link == other._link and len(self) == len(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # it grows: not a dict key

    def __repr__(self) -> str:
        return f"Transcript({len(self)} items, {self.digest[:19]}…)"


def reads_messages_only(fn: F) -> F:
    """Mark a model function that only reads the ``messages`` it is given — it passes them to a
    model SDK, which builds its request from a copy (anthropic's ``copy_tree``, openai's
    ``transform``) and changes none of them — so that ``run.model`` hands it a ``Transcript``'s
    kept items (``Transcript.kept_items``) instead of decoding the whole conversation again on
    every call. A function that may change what it is given must not be marked."""
    if not callable(fn):
        raise UsageError(f"reads_messages_only marks a model function, not a {type(fn).__name__}")
    try:
        setattr(fn, _READS_ONLY, True)
    except (AttributeError, TypeError):  # a bound method, a builtin: no attributes of its own
        raise UsageError(
            f"reads_messages_only cannot mark {fn!r}: mark a function (def) that calls it"
        ) from None
    return fn


def is_reading_only(fn: Callable[..., Any]) -> bool:
    return getattr(fn, _READS_ONLY, False) is True
