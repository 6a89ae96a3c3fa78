"""The console's screenshots for the documentation: the runs list, a blocked run and the inbox,
taken in the system's headless Chromium over a ledger holding a run in every state.

    python tests/browser/screenshots.py [docs/images]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

from console_browser import chromium, chromium_missing, console  # noqa: E402

from safepoint._engine import ownership  # noqa: E402

# A worker's id names its machine; the pictures name a made-up one instead.
ownership._HOST, ownership._BOOT, ownership._PIDNS = "worker-host", "5e1f0c2a9b7d", "4026531836"


def main(out: Path) -> None:
    missing = chromium_missing()
    if missing:
        raise SystemExit(missing)
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as scratch,
        console(Path(scratch) / "ledger.db") as (board, _, ids),
        chromium() as browser,
    ):
        page = browser.new_page(viewport={"width": 1280, "height": 820}, device_scale_factor=1)
        for name, path in (
            ("console-runs", "/"),
            ("console-blocked-run", f"/runs/{ids['blocked']}"),
            ("console-inbox", "/inbox"),
        ):
            page.goto(board.url + path)
            page.screenshot(path=str(out / f"{name}.png"), full_page=name != "console-runs")
            print(out / f"{name}.png")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images"))
