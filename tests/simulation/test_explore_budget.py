"""A fixed budget of fresh schedules on every run of the suite: new interleavings each time,
and a failure names the seed that replays it (``SIM_SEED=… make simulate``)."""

from __future__ import annotations

import pytest

from safepoint.testing.simulation import Config, explore

pytestmark = pytest.mark.slow  # a minute of one core: make test, not make test-fast

# About a minute of one core in all, in parts the test processes share out.
SCHEDULES_PER_PART = 600


@pytest.mark.parametrize("part", range(4))
@pytest.mark.timeout(300)
def test_fresh_schedules_break_no_invariant(part: int) -> None:
    report = explore(Config(), schedules=SCHEDULES_PER_PART)
    report.check()
    assert report.schedules == SCHEDULES_PER_PART
