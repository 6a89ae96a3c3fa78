"""The effects declared in this process, by name: how an operator verb finds an effect's owner.

A ledger names an operation's effect by its name only; the ``Effect`` — with the ``reconcile``
that asks its owner — lives in the user's code. Every ``Effect`` is entered here when it is
constructed, so that ``resolve`` in a process that imported that code (``safepoint resolve
--import myapp``, or ``sp.resolve`` inside the application) can ask the owner before a person's
"not applied" sends the effect again.

Entries are weak: an effect nobody uses any more drops out. Two effects under one name are one
declaration when their ``reconcile`` is the same code (a module imported twice, a factory
called again, ``dataclasses.replace``): the newest stands for them. Under one name with another
``reconcile`` (or one with and one without) they are ambiguous: nobody can say which owner holds
the operation, and ``lookup`` says so instead of choosing.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._effects import Effect

_lock = threading.Lock()
# name -> {origin of its reconcile (None: it has none) -> the newest such effect}
_declared: dict[str, dict[str | None, weakref.ref[Effect]]] = {}


def declare(effect: Effect) -> None:
    """Enter ``effect`` (called by ``Effect`` itself, once constructed)."""
    with _lock:
        _declared.setdefault(effect.name, {})[origin(effect.reconcile)] = weakref.ref(effect)


@dataclass(frozen=True, slots=True)
class Declared:
    """What this process knows of the effect named ``name``."""

    name: str
    effect: Effect | None          # the one declaration, when there is exactly one
    origins: tuple[str, ...] = ()  # where each reconcile was defined, when ambiguous

    @property
    def known(self) -> bool:
        return self.effect is not None or bool(self.origins)

    @property
    def ambiguous(self) -> bool:
        return bool(self.origins)


def lookup(name: str) -> Declared:
    """The live declaration(s) of the effect called ``name`` in this process."""
    with _lock:
        entries = _declared.get(name, {})
        live = {key: found for key, ref in list(entries.items())
                if (found := ref()) is not None}
        if not live:
            _declared.pop(name, None)
        else:
            _declared[name] = {key: entries[key] for key in live}
    if len(live) == 1:
        return Declared(name, next(iter(live.values())))
    return Declared(name, None, tuple(sorted(key or "(no reconcile)" for key in live)))


def origin(fn: Any) -> str | None:
    """Where a reconcile function was written (file and line), so that the same code reached
    twice counts once; None for no function."""
    if fn is None:
        return None
    target = getattr(fn, "func", fn)  # functools.partial: the function it calls
    target = getattr(target, "__func__", target)  # a bound method: its function
    code = getattr(target, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}"
    kind = type(target)  # a callable object: its class
    return f"{kind.__module__}.{kind.__qualname__}"
