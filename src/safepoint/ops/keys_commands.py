"""The commands of encryption at rest (``safepoint keys``): make a key, and seal every value of
the ledger again with the keyring's active key after a rotation (``keys new``,
``keys reencrypt``).

The keyring is never an option: a command line is visible to every user of the machine
(``ps``). The store is opened with ``$SAFEPOINT_KEYRING`` (or the file
``$SAFEPOINT_KEYRING_FILE`` names), as every command opens it.
"""

from __future__ import annotations

import base64

import click

from ..storage.encrypted import KEYRING_ENV, Keyring
from ..storage.resealing import reencrypt as reencrypt_ledger
from .cli_support import fail, open_cli_store, store_option


@click.group()
def keys() -> None:
    """Encryption at rest: make a key, seal the ledger again after a rotation."""


@keys.command("new")
@click.argument("key_id")
def new_key(key_id: str) -> None:
    """Print a new random key as a keyring entry (KEY_ID:base64), to put first in the keyring.

    Keep it where your secrets live: whoever holds it reads the ledger, and a ledger whose key
    is lost cannot be read."""
    entry = f"{key_id}:{base64.b64encode(Keyring.new_key()).decode()}"
    Keyring.parse(entry)  # the id is refused here, before anyone keeps the entry
    click.echo(entry)


@keys.command("reencrypt")
@click.option(
    "--batch", type=click.IntRange(min=1), default=500, show_default=True, help="Rows per transaction."
)
@store_option
@click.pass_context
def reencrypt(ctx: click.Context, batch: int) -> None:
    """Seal every value not under the active key (or stored before the ledger was encrypted)
    with it, BATCH rows per transaction. Safe to stop and run again; once it finished, older
    keys may leave the keyring."""
    if Keyring.from_env() is None:
        fail(ctx, f"no keyring: set {KEYRING_ENV} (the active key first) to re-encrypt the ledger")
    store = open_cli_store(ctx)
    changed = reencrypt_ledger(store, batch=batch)
    total = sum(changed.values())
    parts = ", ".join(f"{kind} {count}" for kind, count in changed.items() if count)
    click.echo(f"re-encrypted {total} rows" + (f" ({parts})" if parts else "") + " with the active key")


COMMANDS = (keys,)
