"""The console's markup: every value is escaped by default (``Html``, on MarkupSafe), and the
console is an extra: the ``safepoint`` command works without it, ``dashboard`` says what to
install."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from safepoint.ops.cli import cli
from safepoint.ops.dashboard_layout import Html


def test_values_are_escaped_unless_they_are_markup() -> None:
    hostile = "<script>alert('x')</script> & \"q\""
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;"
    assert Html("<b>{}</b>").format(hostile) == f"<b>{escaped}</b>"
    assert Html("<b>{v}</b>").format(v=hostile) == f"<b>{escaped}</b>"
    assert Html("<i>") + hostile == f"<i>{escaped}"
    assert hostile + Html("<i>") == f"{escaped}<i>"
    assert Html().join([Html("<br>"), hostile]) == f"<br>{escaped}"
    assert Html("<p>{}</p>").format(Html("<br>")) == "<p><br></p>"  # markup stays markup
    assert isinstance(Html("{}").format(1), Html)


def test_control_characters_are_shown_not_sent() -> None:
    assert Html("<pre>{}</pre>").format("a\x1b[31mb\nc\u202e") == "<pre>a\\x1b[31mb\nc\\u202e</pre>"


def test_without_the_extra_the_dashboard_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "markupsafe", None)  # as if MarkupSafe were not installed
    for name in [m for m in sys.modules if m.startswith("safepoint.ops.dashboard")]:
        monkeypatch.delitem(sys.modules, name)  # the console's modules, imported afresh
    result = CliRunner().invoke(cli, ["dashboard", "--store", "memory:"])
    assert result.exit_code == 1
    assert "pip install 'safepoint[console]'" in result.output
    assert "markupsafe" in result.output


def test_the_command_does_not_import_the_console() -> None:
    code = "import sys, safepoint.ops.cli; print('markupsafe' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
