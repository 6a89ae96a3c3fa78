"""Test against what upstream ships next: the newest (or oldest) releases pyproject's ranges allow.

`make test` installs from the committed lock (uv.lock), so a clean clone gets what the last green
run had. Users install the newest releases their ranges allow, and the agent SDKs ship weekly:
this resolves those releases apart from the lock (which it never changes), prints which packages
moved, installs them into an environment of their own (.venv-newest / .venv-oldest) and runs
the tests that touch the SDKs — the integration tests, the agent kill trials — and the
examples.

    python tools/upstream.py              # the newest releases (make test-latest)
    python tools/upstream.py --oldest     # the oldest the ranges allow of our own dependencies
    python tools/upstream.py --versions   # only resolve, and print the SDKs' versions as a table

It needs uv (the Makefile passes its own as $UV) and the network to the package index; the
tests themselves reach nothing but loopback.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What each integration installs: the extra, and the SDK package whose releases matter.
SDKS = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openai-agents": "openai-agents",
    "pydantic-ai": "pydantic-ai-slim",
    "pydantic-ai-mcp": "fastmcp-slim",
    "mcp": "mcp",
    "claude-agent": "claude-agent-sdk",
    "postgres": "psycopg",
    "otel": "opentelemetry-api",
}
# The tests that talk to the SDKs, and the agent kill trials.
TESTS = [
    "tests/integrations",
    "tests/kill/test_agent_kill.py",
    "tests/kill/test_claude_agent_kill.py",
    "tests/kill/test_mcp_kill.py",
    "tests/kill/test_openai_agents_kill.py",
    "tests/kill/test_pydantic_ai_kill.py",
]
EXAMPLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*_support.py"))


def versions(lock: Path) -> dict[str, str]:
    """Package name -> version, as a uv.lock pins them."""
    with lock.open("rb") as f:
        return {p["name"]: p["version"] for p in tomllib.load(f)["package"] if "version" in p}


def resolve(uv: str, work: Path, oldest: bool) -> Path:
    """A lock of the newest (or oldest) releases the ranges allow, made in ``work`` from a copy
    of pyproject.toml and uv.lock: the committed lock is never touched."""
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, work / name)
    command = [uv, "lock", "--upgrade", "--python", sys.executable]
    if oldest:
        command += ["--resolution", "lowest-direct"]
    subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL)
    return work / "uv.lock"


def moved(locked: dict[str, str], resolved: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, in the lock, resolved) of every package whose version differs."""
    names = sorted(set(locked) | set(resolved))
    return [(n, locked.get(n, "-"), resolved.get(n, "-")) for n in names if locked.get(n) != resolved.get(n)]


def table(locked: dict[str, str], resolved: dict[str, str], label: str) -> str:
    """The SDKs' versions, in the lock and resolved, as a Markdown table."""
    lines = [f"| extra | package | lock | {label} |", "|---|---|---|---|"]
    for extra, package in SDKS.items():
        lines.append(
            f"| `{extra}` | `{package}` | {locked.get(package, '-')} | {resolved.get(package, '-')} |"
        )
    return "\n".join(lines)


def install(uv: str, work: Path, venv: Path) -> None:
    """``venv`` made afresh with every resolved package and safepoint itself, editable."""
    requirements = work / "requirements.txt"
    export = [uv, "export", "--frozen", "--no-emit-project", "--no-hashes", "--all-extras", "--group", "dev"]
    subprocess.run(
        [*export, "--output-file", str(requirements)], cwd=work, check=True, stdout=subprocess.DEVNULL
    )
    subprocess.run([uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)], check=True)
    python = ["--python", str(venv / "bin" / "python")]
    subprocess.run([uv, "pip", "install", "--quiet", *python, "-r", str(requirements)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", *python, "--no-deps", "-e", str(ROOT)], check=True)


def run_suite(venv: Path) -> list[str]:
    """Run the SDK tests and the examples in ``venv``: what failed, by name."""
    failed = []
    pytest = [
        str(venv / "bin" / "pytest"),
        "-q",
        "-n",
        "auto",
        "--dist",
        "loadfile",
        "-p",
        "no:cacheprovider",
    ]
    if subprocess.run([*pytest, *TESTS], cwd=ROOT, check=False).returncode != 0:
        failed.append("the integration tests and agent kill trials")
    for example in EXAMPLES:
        print(f"--- {example}", flush=True)
        done = subprocess.run([str(venv / "bin" / "python"), example], cwd=ROOT, check=False)
        if done.returncode != 0:
            failed.append(example)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--oldest", action="store_true", help="the oldest releases of our direct dependencies"
    )
    parser.add_argument("--versions", action="store_true", help="only resolve, and print the SDKs' versions")
    args = parser.parse_args()
    uv = shutil.which(os.environ.get("UV") or "uv")
    if uv:
        uv = str(Path(uv).resolve())  # it runs in a scratch copy of the project, not here
    else:
        print("tools/upstream.py needs uv: run it through make (make test-latest)", file=sys.stderr)
        return 2
    label = "oldest" if args.oldest else "newest"
    locked = versions(ROOT / "uv.lock")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        resolved = versions(resolve(uv, work, args.oldest))
        changes = moved(locked, resolved)
        print(f"\nthe {label} releases the ranges allow, against uv.lock:")
        for name, was, now in changes:
            print(f"  {name:40} {was:>14} -> {now}")
        if not changes:
            print(
                "  nothing moved: the lock holds the newest releases"
                if not args.oldest
                else "  nothing moved"
            )
        print("\n" + table(locked, resolved, label) + "\n", flush=True)
        if args.versions:
            return 0
        venv = ROOT / f".venv-{label}"
        install(uv, work, venv)
    failed = run_suite(venv)
    if failed:
        print(f"\nfailed on the {label} releases: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"\nthe {label} releases pass the integration tests, the agent kill trials and the examples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
