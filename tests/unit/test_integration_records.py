"""What an integration records on its caller's behalf is redacted, never refused.

A transcript, an SDK object, a CLI's output or a listing of tools is what an SDK or a server
chose to hold, not what the caller chose: a field that looks like a credential (a CLI release
that writes ``"credential": "key"`` into its transcript, a tool whose schema has an
``api_key`` parameter) must not make the run fail. So every read step an integration records
says ``secrets="redact"``; model steps redact by default and must not say otherwise."""

from __future__ import annotations

import ast
from pathlib import Path

import safepoint.integrations

PACKAGE = Path(safepoint.integrations.__file__).parent


def _recording_calls() -> list[tuple[str, int, str, ast.Call]]:
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("read", "model")
            ):
                found.append((path.name, node.lineno, node.func.attr, node))
    return found


def _secrets(call: ast.Call) -> object:
    for keyword in call.keywords:
        if keyword.arg == "secrets":
            return ast.literal_eval(keyword.value)
    return None


def test_every_read_an_integration_records_redacts() -> None:
    calls = _recording_calls()
    reads = [(name, line) for name, line, attr, call in calls if attr == "read"]
    assert len(reads) >= 10  # the scan sees them: the Claude Agent SDK alone records six
    refused = [
        (name, line) for name, line, attr, call in calls if attr == "read" and _secrets(call) != "redact"
    ]
    assert refused == [], 'say secrets="redact" in these reads'


def test_no_model_step_of_an_integration_refuses() -> None:
    refusing = [
        (name, line)
        for name, line, attr, call in _recording_calls()
        if attr == "model" and _secrets(call) == "refuse"
    ]
    assert refusing == []
