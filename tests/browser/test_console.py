"""The console in a real browser: a person lists, filters and pages the runs, opens one, decides
(approve, resolve, retry, raise a limit) and is told what happened; an error keeps what they
typed; the page refreshes itself without losing their place; nothing acts without the token."""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

import pytest
from console_browser import TOKEN
from playwright.sync_api import expect

import safepoint as sp
from safepoint.ops.dashboard import Dashboard
from safepoint.types import RunStatus

pytestmark = pytest.mark.browser

States = tuple[Dashboard, sp.Store, dict[str, str]]


def _rows(page: Any) -> list[str]:
    return page.locator("table.runs tbody tr[data-run]").evaluate_all("rows => rows.map(r => r.dataset.run)")


def test_the_list_shows_every_run_with_counts_and_a_dead_worker_looks_dead(page: Any, states: States) -> None:
    board, _, ids = states
    page.goto(board.url + "/")
    assert set(_rows(page)) >= set(ids.values())
    assert page.locator(".pager .total").inner_text() == "14"
    counts = page.locator("nav.counts")
    assert "blocked1" in counts.inner_text().replace(" ", "").replace("\n", "")
    dead = page.locator(f"tr[data-run='{ids['dead']}']")
    assert "running — worker gone" in dead.inner_text()
    assert "expired" in dead.inner_text()
    live = page.locator(f"tr[data-run='{ids['live']}']")
    assert "worker gone" not in live.inner_text()


def test_the_filters_narrow_the_list_and_stay_in_the_address(page: Any, states: States) -> None:
    board, _, ids = states
    page.goto(board.url + "/")
    page.select_option("select[name=status]", "waiting")
    page.click("form.filters button")
    page.wait_for_url(re.compile(r"status=waiting"))
    assert set(_rows(page)) == {ids["approval"], ids["message"], ids["timer"]}
    page.fill("input[name=q]", "REFUND")
    page.click("form.filters button")
    page.wait_for_url(re.compile(r"q=REFUND"))
    assert _rows(page) == [ids["approval"]]
    assert page.locator("select[name=status]").input_value() == "waiting"  # kept
    page.click("nav.counts a:has-text('all')")
    # the address held q=REFUND already: wait for the one without the status
    page.wait_for_url(lambda url: "q=REFUND" in url and "status=waiting" not in url)
    expect(page.locator("select[name=status]")).to_have_value("")
    assert _rows(page) == [ids["approval"]]  # every status, still searching


def test_the_pages_follow_each_other_without_a_run_twice(page: Any, states: States) -> None:
    board, store, _ = states
    page.goto(board.url + "/?limit=5")
    seen = list(_rows(page))
    assert len(seen) == 5
    # a run created while the person pages never shifts the pages after
    sp.submit(store, _late, run_id="late-arrival")
    while page.locator("a[rel=next]").count():
        after = page.locator("a[rel=next]").get_attribute("href") or ""
        page.click("a[rel=next]")
        # the page before is loaded too: wait for the next one's address, not for a load
        page.wait_for_url(lambda url, after=after: url.endswith(after))
        seen.extend(_rows(page))
    assert len(seen) == len(set(seen)) == 14
    assert "late-arrival" not in seen
    expect(page.locator(".pager .total")).to_have_text("15")  # the total says it


@sp.workflow("late")
def _late(run: sp.Run) -> int:
    return 1


def test_a_run_opens_with_its_timeline_whole_values_and_a_copy(page: Any, states: States) -> None:
    board, _, ids = states
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(board.url + "/")
    page.click(f"a:text-is('{ids['completed']}')")
    page.wait_for_url(re.compile(re.escape(ids["completed"]) + "$"))
    timeline = page.locator("table.timeline")
    assert [k.strip() for k in timeline.locator("td:nth-child(2)").all_inner_texts()] == [
        "model",
        "pure",
        "effect",
    ]
    assert "accepted" in timeline.inner_text()
    assert "1 dispatch" in timeline.inner_text()
    assert "from prepared" in timeline.inner_text()
    value = page.locator("details.value").filter(has_text="the customer asks").first
    assert not value.locator("pre").is_visible()
    value.locator("summary").click()
    expect(value.locator("pre")).to_contain_text("input_tokens")  # the whole value, on demand
    value.locator("button.copy").click()
    expect(value.locator("button.copy")).to_have_text("copied")  # set once the clipboard answers
    assert "ticket-1042-fork" in page.locator("section.lineage").inner_text()
    page.goto(board.url + "/runs/crawl-site~1")
    assert "crawl-site → crawl-site~1 → crawl-site~2" in page.locator("section.lineage").inner_text()


def test_a_waiting_payload_is_approved_from_the_inbox_with_a_confirmation(page: Any, states: States) -> None:
    board, store, ids = states
    page.goto(board.url + "/inbox")
    card = page.locator(f"article[data-run='{ids['approval']}']")
    assert '"amount": 40' in card.locator("pre").first.inner_text()
    digest = store.get_run(ids["approval"]).waiting_for["payload_digest"]  # type: ignore[index]
    assert digest in card.inner_text()
    form = card.locator("form[data-form=approve]")
    form.locator("input[name=by]").fill("ana")
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button").click()
    page.wait_for_url(re.compile(r"/inbox\?done="))
    expect(page.locator(".flash")).to_contain_text(f"Approved the payload of {ids['approval']}")
    [approval] = store.approvals(ids["approval"])
    assert (approval.approved_by, approval.payload_digest) == ("ana", digest)


def test_a_blocked_run_is_resolved_from_its_decision(page: Any, states: States) -> None:
    board, store, ids = states
    run_id = ids["blocked"]
    page.goto(board.url + f"/runs/{run_id}")
    decision = page.locator("section.decision-card")
    text = decision.inner_text()
    assert "RUN " not in text
    assert "<state_revision>" not in text  # the placeholders are filled in
    revision = store.get_run(run_id).state_revision
    assert f"--revision {revision}" in text
    assert '"carrier": "fastship"' in text  # the payload that was sent
    form = decision.locator("form[data-form=resolve]").filter(has=page.locator("input[name=receipt]"))
    assert form.locator("input[name=revision]").input_value() == str(revision)
    form.locator("input[name=receipt]").fill('{"tracking": "FS-77"}')
    form.locator("input[name=evidence]").fill("the carrier's portal lists it")
    form.locator("input[name=by]").fill("ana")
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button").click()
    page.wait_for_url(re.compile(r"\?done="))
    expect(page.locator(".flash")).to_contain_text(f"Resolved {run_id} (applied)")
    assert store.load_ledger(run_id).operations["ship:77"].receipt == {"tracking": "FS-77"}


def _submit(form: Any, **fields: str) -> None:
    """Fill a form's fields as a person types them (the token among them) and send it."""
    for name, value in fields.items():
        form.locator(f"[name={name}]").fill(value)
    form.locator("button").click()


def test_a_failed_run_is_retried_and_a_stopped_one_gets_a_raised_limit(page: Any, states: States) -> None:
    board, store, ids = states
    page.goto(board.url + "/inbox")
    retry = page.locator(f"article[data-run='{ids['failed']}'] form[data-form=retry]")
    _submit(retry, by="ana", reason="the address is in now", token=TOKEN)
    page.wait_for_url(re.compile(r"/inbox\?done="))
    expect(page.locator(".flash")).to_contain_text("Retrying invoice-2031")
    assert store.get_run(ids["failed"]).status is RunStatus.PENDING
    limits = page.locator(f"article[data-run='{ids['stopped']}'] form[data-form=limits]")
    _submit(limits, tokens="5000", by="ana", token=TOKEN)
    # the address before held ?done= already: wait for the confirmation of this action
    expect(page.locator(".flash")).to_contain_text("Raised the limits of triage-9")
    assert store.get_run(ids["stopped"]).token_budget == 5000
    expect(page.locator(f"article[data-run='{ids['stopped']}']")).to_have_count(0)  # decided: gone


def test_a_refused_action_keeps_what_was_typed(page: Any, states: States) -> None:
    board, store, ids = states
    before = store.get_run(ids["stopped"])
    page.goto(board.url + f"/runs/{ids['stopped']}")
    form = page.locator("form[data-form=limits]")
    form.locator("input[name=tokens]").fill("a lot")
    form.locator("input[name=cost]").fill("2.5")
    form.locator("input[name=by]").fill("ana")
    form.locator("input[name=reason]").fill("a long case <b>")
    form.locator("input[name=token]").fill(TOKEN)
    form.locator("button").click()
    expect(page.locator(".error")).to_contain_text("the form is malformed")  # the answer's page
    again = page.locator("form[data-form=limits]")
    assert again.locator("input[name=tokens]").input_value() == "a lot"
    assert again.locator("input[name=cost]").input_value() == "2.5"
    assert again.locator("input[name=reason]").input_value() == "a long case <b>"
    assert again.locator("input[name=token]").input_value() == ""  # never drawn back
    assert store.get_run(ids["stopped"]) == before


def test_the_page_refreshes_itself_and_keeps_the_operators_place(page: Any, states: States) -> None:
    board, store, ids = states
    page.goto(board.url + "/?status=pending")
    page.fill("input[name=q]", "half-typ")  # typed, not sent
    sp.submit(store, _late, run_id="arrives-later")
    page.wait_for_selector("tr[data-run='arrives-later']", timeout=8_000)
    assert page.locator("input[name=q]").input_value() == "half-typ"
    assert page.url.endswith("/?status=pending")
    # a run's page: an open value stays open, a half-typed form stays, and a change is said
    page.goto(board.url + f"/runs/{ids['message']}")
    value = page.locator("table.timeline details.value").first
    value.locator("summary").click()
    page.locator("form[data-form=answer] textarea").fill('{"approved": tr')
    sp.send(store, ids["message"], "manager.answer", {"approved": True}, by="bob")
    sp.resume(store, ids["message"])  # the workflow is registered: it completes
    expect(page.locator("#changed")).to_contain_text("This run changed", timeout=8_000)
    expect(page.locator("table.timeline details.value").first).to_have_js_property("open", True)
    assert page.locator("form[data-form=answer] textarea").input_value() == '{"approved": tr'


def test_nothing_acts_without_the_token(page: Any, states: States) -> None:
    board, store, ids = states
    before = store.get_run(ids["approval"])
    page.goto(board.url + f"/runs/{ids['approval']}")
    assert TOKEN not in page.content()
    form = page.locator("form[data-form=approve]")
    form.locator("input[name=by]").fill("mallory")
    form.locator("input[name=token]").fill("not-the-token-at-all")
    form.locator("button").click()
    expect(page.locator(".error")).to_contain_text("needs the dashboard's token")  # the answer's page
    assert page.locator("form[data-form=approve] input[name=by]").input_value() == "mallory"
    assert store.get_run(ids["approval"]) == before
    assert store.approvals(ids["approval"]) == []
    # the page's own script cannot read the API without the token either
    status = page.evaluate("fetch('/api/runs').then(answer => answer.status)")
    assert status == 401
    started = time.monotonic()
    assert page.evaluate("fetch('/api/openapi.json').then(answer => answer.status)") == 200
    assert time.monotonic() - started < 5


def test_the_workers_page_flags_the_run_whose_worker_is_gone(page: Any, states: States) -> None:
    board, _, ids = states
    page.goto(board.url + "/")
    page.click("header nav a:text-is('workers')")
    page.wait_for_url(re.compile(r"/workers$"))
    dead = page.locator("tr.dead")
    assert dead.count() == 1
    assert ids["dead"] in dead.inner_text()
    assert "running — worker gone" in dead.inner_text()
    assert "lease(s) expired" in page.locator("h2").first.inner_text()
    live = page.locator("tr").filter(has_text=ids["live"])
    assert "worker gone" not in live.inner_text()
    assert "none since the claim" in live.inner_text()  # no renewal yet: said, not hidden


HOSTILE_ID = '"><img src=x onerror=window.__pwned=1>'
HOSTILE_TEXT = '<script>window.__pwned=2</script>"><img src=x onerror=window.__pwned=3>'


@sp.workflow("hostile-input")
def _hostile(run: sp.Run, text: str) -> Any:
    run.pure("echo", lambda: {"said": text})
    return run.decide("refuse", _refuse, text)


def _refuse(text: str) -> Any:
    raise ValueError(f"refused {text}")


def test_markup_in_run_ids_values_and_errors_is_shown_as_text(page: Any, states: States) -> None:
    """A run whose id, inputs, step result and error hold markup: every page that shows them
    shows the characters, and the browser makes no element of them and runs none of them
    (the checks do not lean on the Content-Security-Policy, which would stop a script anyway:
    they look for the elements themselves)."""
    board, store, _ = states
    with pytest.raises(sp.StepFailed):
        sp.start(store, _hostile, HOSTILE_TEXT, run_id=HOSTILE_ID)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    run_page = "/runs/" + urllib.parse.quote(HOSTILE_ID, safe="")
    for address in ("/", "/?q=" + urllib.parse.quote("<img", safe=""), "/inbox", run_page):
        page.goto(board.url + address)
        expect(page.locator("body")).to_contain_text(HOSTILE_ID)
        assert page.locator("img").count() == 0, address
        scripts = page.locator("script").evaluate_all("found => found.map(s => s.src)")
        assert scripts == [board.url + "/static/console.js"], address
        assert page.evaluate("window.__pwned") is None, address
    page.locator("details.value summary").first.click()
    expect(page.locator("body")).to_contain_text("<script>window.__pwned=2</script>")
    expect(page.locator("body")).to_contain_text("refused <script>")
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
