"""The console's browser tests: headless Chromium (the system's, driven by Playwright) against a
real dashboard over a real SQLite ledger holding a run in every state. Without Chromium they
are skipped, saying why — except in CI (CI=true), where that is a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_browser import chromium, chromium_missing, console

import safepoint as sp
from safepoint.ops.dashboard import Dashboard


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, for one test module: Playwright's sync API runs an event loop on the main
    thread while it is started, and every ``asyncio.run`` after it in the same process — an
    async test the suite's worker takes next — would fail while it lives."""
    missing = chromium_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the browser tests must run in CI: {missing}")
        print(f"\nskipping the browser tests: {missing}")
        pytest.skip(missing)
    with chromium() as launched:
        yield launched


@pytest.fixture
def states(tmp_path: Path) -> Iterator[tuple[Dashboard, sp.Store, dict[str, str]]]:
    with console(tmp_path / "ledger.db") as made:
        yield made


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    opened = context.new_page()
    yield opened
    context.close()
