"""A fixed budget of fresh schedules on every run of the suite: new interleavings each time,
and a failure names the seed that replays it (``SIM_SEED=… make simulate``)."""

from __future__ import annotations

import pytest

from safepoint.testing.simulation import Config, explore

pytestmark = pytest.mark.slow  # minutes of one core: make test, not make test-fast

# 1,200 schedules in four parts, which the test processes share out (tests/conftest.py: SPREAD):
# a minute or two of one core each. ``make simulate`` explores for as long as it is asked.
SCHEDULES_PER_PART = 300


@pytest.mark.parametrize("part", range(4))
@pytest.mark.timeout(300)
def test_fresh_schedules_break_no_invariant(part: int) -> None:
    report = explore(Config(), schedules=SCHEDULES_PER_PART)
    report.check()
    assert report.schedules == SCHEDULES_PER_PART
