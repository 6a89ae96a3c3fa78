"""``safepoint export``: a run's run file on stdout or in a file, whole, valid JSON that reads
back as the run; an unknown run or a sealed ledger without its keyring is one error line. (That
it creates no ledger where there is none is ``test_cli``'s, with every command about runs.)"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from run_file_flows import record_every_part
from safepoint._engine.exported import export_flow
from safepoint._engine.flow import drive
from safepoint._rules.run_file import recorded_run
from safepoint.ops.cli import cli
from safepoint.storage import Encrypted, Keyring

_ENV: dict[str, str | None] = {
    "SAFEPOINT_URL": None,
    "SAFEPOINT_KEYRING": None,
    "SAFEPOINT_KEYRING_FILE": None,
}


def run_cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**_ENV, **(env or {})}, catch_exceptions=False)


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = sp.open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    record_every_part(store, "r")
    store.close()
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def test_export_prints_the_run_file_that_reads_back_as_the_run(url: str) -> None:
    result = run_cli("export", "r", "--store", url)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["format"], document["version"]) == ("safepoint.run", 1)
    store = sp.open_store(url)
    assert document == json.loads(json.dumps(sp.export_run(store, "r")))
    assert recorded_run(document) == drive(store, export_flow("r"))
    store.close()
    # What a terminal would act on is escaped the JSON way: the same value, read back.
    assert "\u202e" not in result.stdout
    assert "\\u202e" in result.stdout
    assert document["steps"][0]["result"]["note"] == "café ☕ \u202e"
    assert result.stdout.startswith('{\n  "format": "safepoint.run",\n  "version": 1,\n')


def test_export_out_writes_the_file_whole_and_says_where(url: str, tmp_path: Path) -> None:
    out = tmp_path / "exports" / "r.json"
    out.parent.mkdir()
    out.write_text("an older export")
    result = run_cli("export", "r", "--out", str(out), "--store", url)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote run 'r' to {out}\n"
    assert out.read_text("utf-8") == run_cli("export", "r", "--store", url).stdout
    assert list(out.parent.iterdir()) == [out]  # replaced, no temporary file left


def test_export_of_an_unknown_run_is_one_error_line_and_writes_no_file(url: str, tmp_path: Path) -> None:
    out = tmp_path / "nope.json"
    for args in (["export", "nope"], ["export", "nope", "--out", str(out)]):
        result = run_cli(*args, "--store", url)
        assert result.exit_code == 1
        assert result.stdout == ""
        assert result.stderr.startswith("error: no run 'nope' in this store;"), result.stderr
    assert not out.exists()


def test_a_sealed_ledger_exports_plain_values_with_the_keyring_and_refuses_without(tmp_path: Path) -> None:
    keyring = f"k1:{base64.b64encode(Keyring.new_key()).decode()}"
    url = f"sqlite:///{tmp_path / 'sealed.db'}"
    store = sp.open_store(url, codec=Encrypted(Keyring.parse(keyring)))
    record_every_part(store, "r")
    store.close()
    exported = run_cli("export", "r", "--store", url, env={"SAFEPOINT_KEYRING": keyring})
    assert exported.exit_code == 0, exported.output
    document = json.loads(exported.stdout)
    assert document["steps"][0]["result"]["case"] == "c-1"
    assert document["operations"][0]["payload"] == {"amount": 12.5, "case": "c-1"}
    refused = run_cli("export", "r", "--store", url)
    assert refused.exit_code == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith("error: the ledger is encrypted with key 'k1'"), refused.stderr
