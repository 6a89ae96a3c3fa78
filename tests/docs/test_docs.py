"""The documentation is executed: every example in it runs, and the site builds without a warning.

Each Markdown page (``docs/**/*.md`` and ``README.md``) gets a directory of its own, and its
blocks run there in the order they appear, each in a fresh Python process — so SQLite files a
block creates (``safepoint.db``) are the next block's, as they would be for a reader typing along:

- a ```` ```python ```` block runs as a script; one whose first line is ``# not run: <reason>``
  is not, and must say why (they are few, and counted below);
- a ```` ```python title="name.py" ```` block is a file the page asks the reader to create: it is
  written into the directory (and compiled), for later blocks to import;
- a ```` ```console ```` block is a terminal session: each ``$ command`` runs in bash, must exit
  0 — or, ending in ``; echo $?``, with the code the block shows — and every line the block
  shows must be in what it printed, ``…`` standing for whatever the reader's run prints there;
- ```` ```sh ```` and other blocks are illustrations, not run.

A page whose blocks mention ``DATABASE_URL`` gets a PostgreSQL database of its own (the
session's, see ``pg_url`` in conftest). A failure names the page and the line of the block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

# Every example of the docs runs in processes of its own, and the site is built: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
NOT_RUN = "# not run:"
MOST_BLOCKS_NOT_RUN = 8  # a page's example that cannot run is an exception: keep it one
BLOCK_TIMEOUT = 90.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[\w-]*)(?P<info>[^`]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of a page: its language, title, first line and text."""

    page: Path
    line: int  # the fence's line, 1-based
    lang: str
    title: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def reason_not_run(self) -> str | None:
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return first[len(NOT_RUN) :].strip() if first.startswith(NOT_RUN) else None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, dedented to its fence (blocks inside lists and notes)."""
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, ticks = opened["indent"], opened["ticks"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != ticks:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        title = _TITLE.search(opened["info"])
        found.append(
            Block(
                page,
                i + 1,
                opened["lang"].lower(),
                title["title"] if title else None,
                textwrap.dedent("\n".join(body)) + "\n",
            )
        )
        i = j + 1
    return found


def _environment(workdir: Path, database_url: str | None) -> dict[str, str]:
    """The reader's shell: this interpreter's ``python`` and ``safepoint`` first on PATH, the
    page's directory importable, nothing of the test run's own safepoint settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SAFEPOINT_") and k not in ("DATABASE_URL", "PYTHONPATH")
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = str(workdir)
    env["COLUMNS"] = "100"  # the width the pages' terminal output was taken at
    env["NO_COLOR"] = "1"
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def _run_python(block: Block, workdir: Path, env: dict[str, str]) -> None:
    script = workdir / f"_block_{block.line}.py"
    script.write_text(block.text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, script.name],
        cwd=workdir,
        env=env,
        text=True,
        capture_output=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{block.where}: the python block exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-5000:]}",
            pytrace=False,
        )


def _write_file(block: Block, workdir: Path) -> None:
    assert block.title is not None
    target = workdir / block.title
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.text, encoding="utf-8")
    try:
        compile(block.text, str(target), "exec")
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: {block.title} does not compile: {exc}", pytrace=False)


def _session(text: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the lines it shows printed) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].strip(), []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _normal(text: str) -> str:
    return " ".join(text.split())


def _run_console(block: Block, workdir: Path, env: dict[str, str]) -> None:
    for command, shown in _session(block.text):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=workdir,
            env=env,
            text=True,
            capture_output=True,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
        printed = done.stdout + done.stderr
        expected = [line for line in shown if line.strip()]
        context = f"{block.where}: `{command}` exited {done.returncode}\n--- printed\n{printed[-4000:]}"
        if command.endswith("echo $?"):
            code = expected.pop() if expected else ""
            last = done.stdout.strip().splitlines()[-1:] or [""]
            assert last[0] == code.strip(), f"{context}\nthe block says the code is {code!r}"
        elif done.returncode != 0:
            pytest.fail(context, pytrace=False)
        said = _normal(printed)
        for line in expected:
            for fragment in filter(None, (_normal(f) for f in line.split("…"))):
                assert fragment in said, f"{context}\nthe block shows {fragment!r}, not printed"


def _needs_postgres(page_blocks: list[Block]) -> bool:
    return any("DATABASE_URL" in b.text for b in page_blocks if b.reason_not_run is None)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_example_of_the_page_runs(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page_blocks = blocks(page)
    database = request.getfixturevalue("pg_url") if _needs_postgres(page_blocks) else None
    env = _environment(tmp_path, database)
    for block in page_blocks:
        if block.lang not in ("python", "py", "console"):
            continue
        if block.reason_not_run is not None:
            assert block.reason_not_run, f"{block.where}: a block not run must say why"
            continue
        if block.lang == "console":
            _run_console(block, tmp_path, env)
        elif block.title:
            _write_file(block, tmp_path)
        else:
            _run_python(block, tmp_path, env)


def test_few_examples_are_not_run_and_each_says_why() -> None:
    not_run = [b for page in PAGES for b in blocks(page) if b.reason_not_run is not None]
    assert all(b.reason_not_run for b in not_run), [b.where for b in not_run if not b.reason_not_run]
    assert len(not_run) <= MOST_BLOCKS_NOT_RUN, [f"{b.where}: {b.reason_not_run}" for b in not_run]


def test_the_block_reader_finds_titles_indented_blocks_and_reasons(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'text\n\n```python title="flows.py"\nX = 1\n```\n\n1. a step\n\n'
        "    ```python\n    # not run: needs a mail server\n    send()\n    ```\n\n"
        "```console\n$ safepoint runs\nrun …\n```\n",
        encoding="utf-8",
    )
    found = blocks(page)
    assert [(b.line, b.lang, b.title) for b in found] == [
        (3, "python", "flows.py"),
        (9, "python", None),
        (14, "console", None),
    ]
    assert found[1].reason_not_run == "needs a mail server"
    assert found[1].text == "# not run: needs a mail server\nsend()\n"
    assert _session(found[2].text) == [("safepoint runs", ["run …"])]


@pytest.mark.timeout(300)
def test_the_site_builds_strictly_offline_with_every_command(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=240,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)

    # Nothing is fetched when a page is read: no web fonts, no script or style from elsewhere.
    remote = re.compile(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""")
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert not remote.search(text), f"{html.relative_to(site)} loads {remote.search(text)}"
        assert "fonts.googleapis" not in text, html.relative_to(site)

    # The command-line reference documents every command, from the commands themselves.
    from safepoint.ops.cli import cli

    reference = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for name in sorted(cli.commands):
        assert f'id="safepoint-{name}"' in reference, f"the CLI reference lacks `safepoint {name}`"
