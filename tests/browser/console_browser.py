"""What the console's browser tests and its screenshots share: the system's Chromium, driven by
Playwright (never a downloaded browser), and a dashboard over a ledger in every state."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import safepoint as sp
from safepoint.ops.dashboard import Dashboard

CHROMIUM = os.environ.get("SAFEPOINT_CHROMIUM", "/usr/bin/chromium")
# Offline and quiet: no sandbox (CI runs as root), no GPU, no network of Chromium's own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "a-token-for-the-browser-tests"


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM}: install the system's package (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (it is in the dev dependency group)"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """The system's Chromium, headless, under Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def console(path: Path) -> Iterator[tuple[Dashboard, sp.Store, dict[str, str]]]:
    """A dashboard over a new SQLite ledger at ``path`` holding a run in every state."""
    from console_states import build_states

    store = sp.open_store(f"sqlite:///{path}")
    try:
        ids = build_states(store)
        with Dashboard(store, port=0, token=TOKEN) as board:
            yield board, store, ids
    finally:
        store.close()
