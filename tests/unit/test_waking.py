"""When an idle worker's wait for work ends (``_rules.waking``): news held until ``quiet``, a
due time never held, and the due time read again after news — at most every DUE_REREAD_S."""

from __future__ import annotations

from safepoint._rules.waking import DUE_MARGIN_S, DUE_REREAD_S, WorkWait


def test_without_news_a_wait_ends_at_its_timeout_or_when_a_run_falls_due() -> None:
    assert WorkWait.begin(100.0, 30.0, 5.0, None).end() == 130.0
    assert WorkWait.begin(100.0, 30.0, 5.0, 2.0).end() == 102.0 + DUE_MARGIN_S  # just after it
    assert WorkWait.begin(100.0, 30.0, 5.0, 60.0).end() == 130.0  # never past the timeout
    assert WorkWait.begin(100.0, 30.0, 5.0, -1.0).end() == 100.0 + DUE_MARGIN_S  # overdue: at once


def test_news_ends_the_wait_at_once_without_quiet_and_at_quiet_with_it() -> None:
    plain = WorkWait.begin(100.0, 30.0, 0.0, None)
    plain.news(100.2)
    assert (plain.heard, plain.end(), plain.reread) == (True, 100.0, None)
    held = WorkWait.begin(100.0, 30.0, 5.0, None)
    held.news(100.2)
    assert held.end() == 105.0
    held.news(106.0)  # after quiet: nothing more to read
    assert held.end() == 105.0


def test_a_due_time_inside_quiet_is_not_held() -> None:
    wait = WorkWait.begin(100.0, 30.0, 5.0, 1.0)
    wait.news(100.2)
    assert wait.end() == 101.0 + DUE_MARGIN_S


def test_news_inside_quiet_has_the_due_time_read_again_no_more_often_than_the_bound() -> None:
    wait = WorkWait.begin(100.0, 30.0, 5.0, None)
    wait.news(100.01)  # a run may have begun waiting: read the due time again, soon
    assert wait.reread == 100.0 + DUE_REREAD_S
    assert wait.next_look() == wait.reread
    assert not wait.rereading(100.02)
    assert wait.rereading(wait.reread)
    wait.news(100.03)  # already asked for: no second read
    assert wait.reread == 100.0 + DUE_REREAD_S
    wait.due_read(100.05, 0.5)  # a run sleeping until 100.55
    assert (wait.reread, wait.end()) == (None, 100.55 + DUE_MARGIN_S)
    wait.news(101.0)  # long after the last read: read at once
    assert wait.reread == 101.0
    wait.due_read(101.0, None)  # nothing waits for a time now: the earlier due time stands
    assert wait.end() == 100.55 + DUE_MARGIN_S
