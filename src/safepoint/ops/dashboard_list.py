"""The console's runs list: counts per status, filters, pages, and what each run needs.

The filters are the page's address (``/?status=blocked&q=order``), so a refresh, a link and
the back button keep them; the list and the counts are live regions the script refreshes. The
pages follow a cursor (the keyset of the last run shown), so a run created while a person reads
never shifts a page; the total says how many runs match, however many pages that takes.
"""

from __future__ import annotations

from urllib.parse import urlencode

from ..types import RunPage, RunQuery, RunRecord, RunStatus, UnreadableRun
from .dashboard_api import encode_cursor
from .dashboard_layout import ago, e, page, run_path, when
from .dashboard_pages import needs, status_badge

__all__ = ["runs_page"]


def _address(params: dict[str, str], **changes: str | None) -> str:
    """The list's address with these filters changed (None: dropped)."""
    merged = {**params, **changes}
    kept = {k: v for k, v in merged.items() if v and k != "done"}
    return "/" + (f"?{urlencode(kept)}" if kept else "")


def _counts(run_page: RunPage, params: dict[str, str]) -> str:
    chosen = params.get("status")
    everything = sum(run_page.counts.values())
    links = [
        f"<a href='{e(_address(params, status=None, cursor=None))}'{' class=here' if not chosen else ''}>"
        f"all<b>{everything}</b></a>"
    ]
    for status in RunStatus:
        count = run_page.counts.get(status, 0)
        here = " class=here" if chosen == status.value else ""
        links.append(
            f"<a href='{e(_address(params, status=status.value, cursor=None))}'{here}>"
            f"<span class='s-{status.value}'>{status.value}</span><b>{count}</b></a>"
        )
    return f"<nav class=counts aria-label='runs per status' data-live=counts>{''.join(links)}</nav>"


def _filters(params: dict[str, str]) -> str:
    def field(name: str, label: str, kind: str = "text", size: int = 16) -> str:
        return (
            f"<label>{e(label)}<input type={kind} name={name} size={size}"
            f" value='{e(params.get(name, ''))}'></label>"
        )

    options = "".join(
        f"<option value='{s.value}'{' selected' if params.get('status') == s.value else ''}>"
        f"{s.value}</option>"
        for s in RunStatus
    )
    return (
        "<form class=filters method=get action='/' role=search>"
        f"<label>status<select name=status><option value=''>any</option>{options}</select></label>"
        + field("q", "run id contains", size=18)
        + field("workflow", "workflow")
        + field("version", "version", size=8)
        + field("created_after", "created from (UTC)", "datetime-local", 0)
        + field("created_before", "created before (UTC)", "datetime-local", 0)
        + field("updated_after", "changed from (UTC)", "datetime-local", 0)
        + field("updated_before", "changed before (UTC)", "datetime-local", 0)
        + f"<input type=hidden name=limit value='{e(params.get('limit', ''))}'>"
        + "<button class=primary>filter</button> <a href='/'>clear</a></form>"
    )


def _row(run: RunRecord | UnreadableRun, now: int) -> str:
    if isinstance(run, UnreadableRun):
        known = "" if run.status is None else f"{run.status.value}: "
        return (
            f"<tr><td>{e(run.run_id)}</td><td>{e(run.workflow or '?')}@{e(run.workflow_version or '?')}</td>"
            f"<td><span class='badge s-blocked'>unreadable</span></td>"
            f"<td class=s-blocked>{e(known + run.reason)}</td><td>{when(run.created_at)}</td>"
            f"<td>{when(run.updated_at, now) if run.updated_at else ''}</td></tr>"
        )
    return (
        f"<tr data-run='{e(run.run_id)}'><td><a href='{e(run_path(run.run_id))}'>{e(run.run_id)}</a></td>"
        f"<td>{e(run.workflow)}<small>@{e(run.workflow_version)}</small></td>"
        f"<td>{status_badge(run, now)}</td>"
        f"<td>{needs(run, now)}</td><td>{when(run.created_at)}</td><td>{ago(run.updated_at, now)}</td></tr>"
    )


def runs_page(
    run_page: RunPage, query: RunQuery, params: dict[str, str], now: int, flash: str | None = None
) -> str:
    """The runs ``query`` asks for, one page of them, with the counts and the filters."""
    rows = "".join(_row(run, now) for run in run_page.runs)
    shown = len(run_page.runs)
    first = "" if "cursor" not in params else f"<a href='{e(_address(params, cursor=None))}'>← newest</a>"
    after = (
        f"<a rel=next href='{e(_address(params, cursor=encode_cursor(run_page.next_after)))}'>next page →</a>"
        if run_page.next_after
        else ""
    )
    pager = (
        f"<div class=pager><span>{shown} shown of <b class=total>{run_page.total}</b> matching"
        f"{' (a later page)' if 'cursor' in params else ''}</span>{first}{after}</div>"
    )
    empty = "" if rows else "<p class=muted>No run matches these filters.</p>"
    table = (
        "<table class=runs><thead><tr><th>run</th><th>workflow</th><th>status</th><th>needs</th>"
        f"<th>created (UTC)</th><th>changed</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    title = "Runs" + (f": {query.status.value}" if query.status else "")
    return page(
        title,
        _counts(run_page, params) + _filters(params) + f"<div data-live=runs>{pager}{table}{empty}</div>",
        here="/",
        flash=flash,
    )
