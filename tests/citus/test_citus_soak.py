"""The kill soak on a Citus cluster: worker processes SIGKILLed at random while they carry runs
on a distributed ledger; every run ends, no effect is applied twice, none is lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from safepoint.testing import OwnerService

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kill"))
from test_soak import assert_soak_held, soak

pytestmark = [pytest.mark.kill, pytest.mark.timeout(600)]


def test_random_kill_soak_on_citus(fresh_citus_url: str, owner_env: OwnerService) -> None:
    assert_soak_held(soak(fresh_citus_url, owner_env))
