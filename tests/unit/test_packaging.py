"""What a user installs: type information (``py.typed``, and errors whose fields type-check in
user code), and the license the package declares."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_the_package_ships_its_type_information() -> None:
    assert resources.files("safepoint").joinpath("py.typed").is_file()


@pytest.mark.slow  # a mypy run of its own, seconds long: make lint checks the same file
def test_error_fields_type_check_in_user_code(tmp_path: Path) -> None:
    """mypy --strict on a file written as a user would: reading ``e.run_id``, ``e.step_id``,
    ``store.identity`` … must not need a cast or an ignore."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path),
            str(ROOT / "tests" / "typing" / "errors_usage.py"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_license_file_matches_the_declared_license() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
