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
from .dashboard_layout import Html, ago, page, run_path, when
from .dashboard_pages import needs, status_badge

__all__ = ["runs_page"]

_HERE = Html(" class=here")


def _address(params: dict[str, str], **changes: str | None) -> str:
    """The list's address with these filters changed (None: dropped)."""
    merged = {**params, **changes}
    kept = {k: v for k, v in merged.items() if v and k != "done"}
    return "/" + (f"?{urlencode(kept)}" if kept else "")


def _counts(run_page: RunPage, params: dict[str, str]) -> Html:
    chosen = params.get("status")
    everything = sum(run_page.counts.values())
    links = [
        Html("<a href='{}'{}>all<b>{}</b></a>").format(
            _address(params, status=None, cursor=None), "" if chosen else _HERE, everything
        )
    ]
    for status in RunStatus:
        count = run_page.counts.get(status, 0)
        links.append(
            Html("<a href='{href}'{here}><span class='s-{status}'>{status}</span><b>{count}</b></a>").format(
                href=_address(params, status=status.value, cursor=None),
                here=_HERE if chosen == status.value else "",
                status=status.value,
                count=count,
            )
        )
    return Html("<nav class=counts aria-label='runs per status' data-live=counts>{}</nav>").format(
        Html().join(links)
    )


def _filters(params: dict[str, str]) -> Html:
    def field(name: str, label: str, kind: str = "text", size: int = 16) -> Html:
        return Html("<label>{}<input type={} name={} size={} value='{}'></label>").format(
            label, kind, name, size, params.get(name, "")
        )

    options = Html().join(
        Html("<option value='{0}'{1}>{0}</option>").format(
            s.value, Html(" selected") if params.get("status") == s.value else ""
        )
        for s in RunStatus
    )
    return (
        Html("<form class=filters method=get action='/' role=search>")
        + Html("<label>status<select name=status><option value=''>any</option>{}</select></label>").format(
            options
        )
        + field("q", "run id contains", size=18)
        + field("workflow", "workflow")
        + field("version", "version", size=8)
        + field("created_after", "created from (UTC)", "datetime-local", 0)
        + field("created_before", "created before (UTC)", "datetime-local", 0)
        + field("updated_after", "changed from (UTC)", "datetime-local", 0)
        + field("updated_before", "changed before (UTC)", "datetime-local", 0)
        + Html("<input type=hidden name=limit value='{}'>").format(params.get("limit", ""))
        + Html("<button class=primary>filter</button> <a href='/'>clear</a></form>")
    )


def _row(run: RunRecord | UnreadableRun, now: int) -> Html:
    if isinstance(run, UnreadableRun):
        known = "" if run.status is None else f"{run.status.value}: "
        return Html(
            "<tr><td>{}</td><td>{}@{}</td><td><span class='badge s-blocked'>unreadable</span></td>"
            "<td class=s-blocked>{}</td><td>{}</td><td>{}</td></tr>"
        ).format(
            run.run_id,
            run.workflow or "?",
            run.workflow_version or "?",
            known + run.reason,
            when(run.created_at),
            when(run.updated_at, now) if run.updated_at else "",
        )
    return Html(
        "<tr data-run='{id}'><td><a href='{href}'>{id}</a></td><td>{workflow}<small>@{version}</small></td>"
        "<td>{badge}</td><td>{needs}</td><td>{created}</td><td>{changed}</td></tr>"
    ).format(
        id=run.run_id,
        href=run_path(run.run_id),
        workflow=run.workflow,
        version=run.workflow_version,
        badge=status_badge(run, now),
        needs=needs(run, now),
        created=when(run.created_at),
        changed=ago(run.updated_at, now),
    )


def runs_page(
    run_page: RunPage, query: RunQuery, params: dict[str, str], now: int, flash: str | None = None
) -> Html:
    """The runs ``query`` asks for, one page of them, with the counts and the filters."""
    rows = Html().join(_row(run, now) for run in run_page.runs)
    shown = len(run_page.runs)
    first = (
        Html("<a href='{}'>← newest</a>").format(_address(params, cursor=None)) if "cursor" in params else ""
    )
    after = (
        Html("<a rel=next href='{}'>next page →</a>").format(
            _address(params, cursor=encode_cursor(run_page.next_after))
        )
        if run_page.next_after
        else ""
    )
    pager = Html(
        "<div class=pager><span>{} shown of <b class=total>{}</b> matching{}</span>{}{}</div>"
    ).format(shown, run_page.total, " (a later page)" if "cursor" in params else "", first, after)
    empty = "" if rows else Html("<p class=muted>No run matches these filters.</p>")
    table = Html(
        "<table class=runs><thead><tr><th>run</th><th>workflow</th><th>status</th><th>needs</th>"
        "<th>created (UTC)</th><th>changed</th></tr></thead><tbody>{}</tbody></table>"
    ).format(rows)
    title = "Runs" + (f": {query.status.value}" if query.status else "")
    return page(
        title,
        _counts(run_page, params)
        + _filters(params)
        + Html("<div data-live=runs>{}{}{}</div>").format(pager, table, empty),
        here="/",
        flash=flash,
    )
