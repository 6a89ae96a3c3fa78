"""A run as a portable file: ``safepoint export`` writes the run file of one run (the format:
``_rules.run_file``; the documentation's "The run file").

``cli`` registers every command in ``COMMANDS`` on its group. Built on ``cli_support`` like
every command module; the document is written by ``render.as_json``, which escapes what a
terminal would act on the JSON way (``\\u001b``), so the file read back holds the same values.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from .._engine.exported import export_run
from .cli_support import open_cli_store, run_argument, store_option
from .render import as_json, shown


@click.command("export")
@run_argument
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run file here instead of printing it (replaced whole, never left half written).",
)
@store_option
@click.pass_context
def export(ctx: click.Context, run_id: str, out: Path | None) -> None:
    """Print a run as its run file: one JSON document of everything the ledger holds about it
    — the run, its steps, its operations with their payloads, failed attempts, approvals,
    messages and events — versioned (format "safepoint.run", version 1), to read on another
    machine or to replay.

    A sealed ledger's values come out plain (the keyring is read as by every command): keep the
    file as you keep the ledger."""
    store = open_cli_store(ctx)
    text = as_json(export_run(store, run_id)) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    _write_whole(out, text)
    click.echo(shown(f"wrote run {run_id!r} to {out}"))


def _write_whole(path: Path, text: str) -> None:
    """``text`` in ``path``, replaced in one rename: a reader never finds half a run file, and
    an export that fails leaves the file that was there."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


COMMANDS: tuple[click.Command, ...] = (export,)
