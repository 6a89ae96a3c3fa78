"""The commands that carry a stopped run on: raise its limits, retry it, fork it, send it a
message (``limits``, ``retry``, ``fork``, ``send`` — to be added).

``cli`` registers every command in ``COMMANDS`` on its group, so a new command is written here
and added to the tuple; neither ``cli`` nor the other command modules change. Build a command
with ``@click.command()`` and the shared plumbing of ``cli_support`` (``store_option``,
``run_argument``, ``open_cli_store``, ``fail``, ``import_modules``, ``stdout_console``); never
import ``cli`` (it imports this module).
"""

from __future__ import annotations

import click

COMMANDS: tuple[click.Command, ...] = ()
