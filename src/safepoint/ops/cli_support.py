"""What every ``safepoint`` command shares: the group that prints errors, the store it opens, the
options and arguments most commands take, and the console it prints to.

The commands live in ``cli`` (looking at runs, workers, the ledger itself),
``operator_commands`` (a person's decisions), ``carry_commands`` (carrying a stopped run on) and
the modules of their own concerns (``retention_commands``, ``keys_commands``,
``run_file_commands``, ``replay_commands``: replaying runs offline); each imports only this
module from the command line's plumbing, never ``cli``, which registers them all on its group.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click
from click.core import ParameterSource
from rich.console import Console

from .._rules.ids import check_run_id
from ..errors import GateApproved, LostOwnership, SafepointError, WaitAnswered
from ..storage import open_store
from ..storage.base import Store
from .render import error_text, shown

EXIT_ERROR = 1
EXIT_BLOCKED = 3
EXIT_WAITING = 4
# ``answer`` / ``approve``: the wait was answered, or the gate approved, already (``WaitAnswered``,
# ``GateApproved``): nothing was kept — a retried delivery may count it as done.
EXIT_ANSWERED = 5
# ``--slice`` was spent and the run goes on: released, to be carried on by the next call at once
# (sysexits' EX_TEMPFAIL, "try again later", which job runners and shells know).
EXIT_UNFINISHED = 75
# ``replay`` / ``check-deploy``: a run diverges from the code imported now, would not carry on
# under it (re-plan, block, fail), or could not be replayed.
EXIT_DIVERGED = 6

_STORE_URL = "safepoint.store_url"  # ctx.meta: the --store given after the command
_OPENED = "safepoint.store"  # ctx.meta: the store the command opened

F = TypeVar("F", bound=Callable[..., Any])


class SafepointGroup(click.Group):
    """Prints safepoint's own errors as one safe line on stderr instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (WaitAnswered, GateApproved) as exc:  # released already: a code of its own
            fail(ctx, error_text(exc, now_ms(ctx)), EXIT_ANSWERED)
        except SafepointError as exc:
            fail(ctx, error_text(exc, now_ms(ctx)))
        except LostOwnership as exc:  # a BaseException: another worker took the run over
            fail(ctx, str(exc))


def fail(ctx: click.Context, message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: <message>`` (escaped) on stderr and exit with ``code`` (1)."""
    click.echo(f"error: {shown(message)}", err=True)
    ctx.exit(code)


def now_ms(ctx: click.Context) -> int:
    """The store's clock (leases are on it), or this machine's when no store answers."""
    store = ctx.meta.get(_OPENED)
    if store is not None:
        try:
            return int(store.now())
        except Exception:  # the error being reported may be that the store is unusable
            pass
    return time.time_ns() // 1_000_000


class StoreURL(click.types.StringParamType):
    """A store URL; ``$SAFEPOINT_URL`` is one URL, never split (a path may hold spaces)."""

    name = "url"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [rv]


def one_store_url(given: tuple[str, ...], ctx: click.Context) -> str | None:
    """The one ledger ``--store`` names, however often it is given; a usage error when it
    names two."""
    named = list(dict.fromkeys(given))
    if len(named) > 1:
        raise click.UsageError(
            f"--store names {len(named)} ledgers ({', '.join(map(repr, named))}): name one", ctx=ctx
        )
    return named[0] if named else None


def _take_store_url(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
    """``--store`` after the command: the same option as before it, naming the same ledger."""
    if not values:
        return
    root = ctx.find_root()
    before: tuple[str, ...] = ()
    if root.get_parameter_source("store_url") is ParameterSource.COMMANDLINE:
        before = tuple(root.params.get("store_url") or ())
    ctx.meta[_STORE_URL] = one_store_url(before + tuple(values), ctx)


def store_option(command: F) -> F:
    """``--store URL`` on a command, so that it may follow the command's name too."""
    return click.option(
        "--store",
        type=StoreURL(),
        multiple=True,
        expose_value=False,
        callback=_take_store_url,
        help="The ledger (as before the command).",
    )(command)


def run_argument(command: F) -> F:
    """The RUN argument of a command, checked as every verb checks a run id — before a store
    is opened (an argument that is not UTF-8 arrives holding a lone surrogate, which no ledger
    can hold)."""
    return click.argument("run_id", metavar="RUN", callback=lambda ctx, param, value: check_run_id(value))(
        command
    )


def open_cli_store(ctx: click.Context, *, create: bool = False, distributed: str | None = None) -> Store:
    """The store named by --store, opened (and so migrated) once, closed when the command ends.

    Only the commands that set a ledger up (``migrate``, ``worker``, ``dashboard``) create one
    (``create``): every other one looks at runs that exist, and a missing ledger is an error
    that leaves no file behind. ``distributed``: open it as a ledger that database distributes
    (``migrate --distribute``)."""
    url = ctx.meta.get(_STORE_URL) or ctx.find_root().obj
    if distributed is not None:
        url = _distributed(url, distributed)
    store = open_store(url, create=create)
    ctx.meta[_OPENED] = store
    ctx.find_root().call_on_close(store.close)  # open while the error handler reads its clock
    return store


def _distributed(url: str, distribution: str) -> str:
    """``url`` asking for ``distributed=<distribution>`` (a PostgreSQL URL only)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise click.UsageError(f"--distribute needs a PostgreSQL store, not {parts.scheme or url!r}")
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "distributed"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("distributed", distribution)])))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|[smhd])")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_duration(text: str) -> timedelta | None:
    """A duration as people type one (``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``, ``500ms``);
    None when ``text`` is not one."""
    parts = _DURATION.findall(text)
    if parts and "".join(f"{n}{u}" for n, u in parts) == text:
        return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
    return None


def _slice_length(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    """``--slice``: how long the command carries runs on — a duration (``25s``, ``1m30s``,
    ``500ms``) or a number of seconds, longer than zero."""
    if value is None:
        return None
    text = value.strip()
    length = parse_duration(text)
    if length is None:
        try:
            length = timedelta(seconds=float(text))
        except (ValueError, OverflowError):
            raise click.BadParameter(
                f"{text!r} is neither a duration (25s, 1m30s, 500ms) nor seconds", ctx, param
            ) from None
    if not length > timedelta(0):
        raise click.BadParameter(f"{text!r}: a slice must be longer than zero", ctx, param)
    return length


def slice_option(command: F) -> F:
    """``--slice DURATION`` on a command that carries runs on (``resume``, ``worker``)."""
    return click.option(
        "--slice",
        "slice_length",
        metavar="DURATION",
        callback=_slice_length,
        help="Carry on for at most this long (25s, 1m30s, or seconds), then stop at the next step"
        " boundary, release the run at once and exit 75: the next call carries it on.",
    )(command)


def stdout_console(*, markup: bool = False) -> Console:
    """The console a command prints to."""
    # Built per command, not at import: the stream may be swapped (tests, redirection). Markup
    # and emoji codes are off: what is printed is the ledger's data, never read as markup.
    return Console(highlight=False, markup=markup, emoji=False)


def import_modules(modules: tuple[str, ...]) -> None:
    """Import the modules ``--import`` names (so their @workflow registrations and effects
    exist), from the working directory too; a usage error when one of them is not there."""
    if not modules:
        return
    # A console script does not put the working directory on sys.path (`python -m` does), yet
    # workflows usually live in the project the person is standing in.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only the named module being absent is a usage error; a missing import *inside*
            # the user's module is their bug, and its traceback is the useful answer.
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
            raise click.BadParameter(
                f"no module named {name!r} (run from the project directory or set PYTHONPATH)",
                param_hint="--import",
            ) from exc


def parse_when(text: str, option: str) -> timedelta | datetime:
    """A moment an option names: a duration from now (``90s``, ``15m``, ``2h``, ``1d``,
    ``1h30m``, with or without a leading ``+``) or an ISO 8601 instant with its time zone
    (``2030-01-31T17:00:00+01:00``); a usage error naming ``option`` otherwise."""
    length = parse_duration(text.removeprefix("+"))
    if length is not None:
        return length
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} is neither a duration (90s, 15m, +2h, 1d, 1h30m)"
            " nor an ISO 8601 instant with a time zone",
            param_hint=option,
        )
    return moment
