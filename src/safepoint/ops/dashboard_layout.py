"""The console's frame: escaping, the page every view is drawn in, its style sheet and its script.

Everything a page shows is data from the ledger, escaped by default (``Html``, on MarkupSafe):
only the console's own markup is ``Html``. The style sheet and the script ship here, as
strings, and are served by the dashboard itself (``/static/console.css``,
``/static/console.js``): nothing is fetched from elsewhere, and the pages'
Content-Security-Policy allows no inline script and no other origin.

The script does three small things, each only an improvement over the plain page:

- **live refresh**: every few seconds it fetches the page it is on again (the same address, so
  the same filters and page) and swaps in the regions marked ``data-live``, keeping which
  ``<details data-key>`` are open, the scroll position, and any region holding the focus or a
  half-typed form; forms live outside those regions, so what an operator types is never lost;
- **copy**: a ``button[data-copy]`` copies the text of the element it names;
- **a changed run**: when the run a page shows changed (``data-state``), it says so, with a
  link that loads its new forms.

It polls the HTML pages, not the JSON API: those need the token, and a page never holds it.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from .._rules.moments import relative, span
from ..errors import MissingExtra
from .render import shown

try:
    from markupsafe import Markup
except ImportError as exc:  # pragma: no cover - the extra is part of the development install
    raise MissingExtra(
        "console", exc.name or "markupsafe", needed_by="the console (safepoint dashboard)"
    ) from exc

__all__ = [
    "SCRIPT",
    "STYLE",
    "Html",
    "error_page",
    "page",
    "run_path",
    "when",
]


class Html(Markup):
    """Markup of the console: whatever is formatted (``Html("<b>{}</b>").format(x)``), joined or
    added into it is escaped unless it is ``Html`` itself, so a value is never markup by
    accident. Escaped text also shows every control or invisible character but a line break (a
    ``<pre>`` keeps those) as a visible escape (``\\x1b``), as the terminal shows it."""

    __slots__ = ()

    @classmethod
    def escape(cls, s: Any, /) -> Html:
        if hasattr(s, "__html__"):
            return cls(s.__html__())
        return cls(html.escape("\n".join(map(shown, str(s).split("\n"))), quote=True))


def when(ms: int | None, now: int | None = None) -> Html:
    """A moment in UTC, as HTML (``2030-01-31 17:00:05``, and how long ago when ``now`` is
    given); empty for None."""
    if ms is None:
        return Html()
    moment = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    if now is None:
        return Html("{}").format(moment)
    return Html("<time title='{0} UTC'>{0}</time> <small>{1}</small>").format(moment, relative(ms, now))


def ago(ms: int, now: int) -> Html:
    """How long ago a moment was (``3m ago``), the moment itself on hover."""
    moment = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return Html("<time title='{} UTC'>{}</time>").format(moment, relative(ms, now))


def duration(ms: int | None) -> str:
    """A duration in plain words: ``340 ms``, ``12s``, ``3m``."""
    if ms is None:
        return ""
    return f"{ms} ms" if ms < 1000 else span(ms)


def json_text(value: Any) -> str:
    """A JSON value laid out to read (any text, however long, whole)."""
    return json.dumps(value, default=str, indent=2, ensure_ascii=False)


def short(value: Any, width: int = 80) -> str:
    """A JSON value on one line, cut at ``width`` characters (``…``)."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def value_cell(key: str, value: Any, width: int = 60) -> Html:
    """A value shown short, with the whole of it on demand (``<details>``) and a copy button:
    ``key`` names it on the page, so a refresh keeps it open."""
    text = short(value, width)
    whole = json_text(value)
    if text == whole and len(text) < width:
        return Html("<code>{}</code>").format(text)
    ident = "v-" + quote(key, safe="").replace("%", "_")
    return Html(
        "<details class=value data-key='{ident}'><summary><code>{text}</code></summary>"
        "<pre id='{ident}'>{whole}</pre>"
        "<button type=button class=copy data-copy='{ident}'>copy</button></details>"
    ).format(ident=ident, text=text, whole=whole)


def table_section(
    live: str, title: str, headers: tuple[str, ...], rows: Html, note: Html | None = None
) -> Html:
    """A section of one table, refreshed live as ``live``: its heading, a note, the table."""
    head = Html().join(Html("<th>{}</th>").format(header) for header in headers)
    return Html(
        "<section data-live={live}><h2>{title}</h2>{note}"
        "<table class={live}><tr>{head}</tr>{rows}</table></section>"
    ).format(live=live, title=title, note=note or Html(), head=head, rows=rows)


def run_path(run_id: str, action: str | None = None) -> str:
    """The address of a run's page (or of one of its actions): the run id is one path segment,
    whatever it holds (``/``, ``?``, ``#``, ``%``, spaces)."""
    return f"/runs/{quote(run_id, safe='')}" + (f"/{action}" if action else "")


_NAV = (("/", "runs"), ("/inbox", "inbox"), ("/workers", "workers"))


def page(
    title: str,
    body: Html,
    *,
    here: str = "",
    flash: str | None = None,
    error: str | None = None,
    state: str | None = None,
    live: bool = True,
) -> Html:
    """A whole page: the navigation, a confirmation (``flash``) or an error, then ``body``.
    ``state``: what the script compares to tell that the thing shown changed; ``live``: whether
    the script refreshes the page's live regions."""
    nav = Html().join(
        Html("<a href='{}'{}>{}</a>").format(href, Html(" class=here") if href == here else "", label)
        for href, label in _NAV
    )
    notes = (Html("<p class=flash role=status>{}</p>").format(flash) if flash else Html()) + (
        Html("<p class=error role=alert>{}</p>").format(error) if error else Html()
    )
    attrs = (Html(" data-state='{}'").format(state) if state is not None else Html()) + (
        Html(" data-refresh=3000") if live else Html()
    )
    return Html(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        "<title>{title} — safepoint</title><link rel=stylesheet href='/static/console.css'>"
        "<script src='/static/console.js' defer></script></head><body{attrs}>"
        "<header><b class=brand>safepoint</b><nav>{nav}</nav>"
        "<span id=live-status class=muted></span></header>"
        "<main><h1>{title}</h1>{notes}<p id=changed class=changed hidden></p>{body}</main>"
        "</body></html>"
    ).format(title=title, attrs=attrs, nav=nav, notes=notes, body=body)


def error_page(title: str, message: str) -> Html:
    """The page of a refused or failed request: what went wrong, and the way back."""
    return page(title, Html("<p><a href='/'>back to the runs</a></p>"), error=message, live=False)


STYLE = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d8dee4;--bg:#fff;--soft:#f6f8fa;--accent:#0969da;
--red:#cf222e;--amber:#9a6700;--green:#1a7f37;--purple:#8250df;--grey:#6e7781}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);
background:var(--bg)}
header{display:flex;gap:1.5em;align-items:center;padding:.6em 1.5em;border-bottom:1px solid var(--line);
background:var(--soft)}
header nav a{margin-right:1em;color:var(--fg);text-decoration:none;padding:.2em 0}
header nav a.here{border-bottom:2px solid var(--accent);font-weight:600}
.brand{font-size:15px}
main{padding:1em 1.5em 3em;max-width:1400px}
h1{font-size:20px;margin:.3em 0 .6em;word-break:break-all}h2{font-size:16px;margin:1.4em 0 .5em}
h3{font-size:14px;margin:1em 0 .3em}
a{color:var(--accent)}
.muted,small{color:var(--muted)}
table{border-collapse:collapse;width:100%;margin:.4em 0 1em}
th,td{padding:.35em .6em;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-weight:600;background:var(--soft);white-space:nowrap}
table.facts{width:auto}table.facts th{background:none;color:var(--muted);font-weight:500}
code,pre{font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{background:var(--soft);border:1px solid var(--line);border-radius:6px;padding:.6em .8em;overflow:auto;
max-height:28em;white-space:pre-wrap;word-break:break-word}
details.value summary{cursor:pointer}details.value pre{margin:.3em 0}
.badge{display:inline-block;padding:0 .55em;border-radius:1em;font-size:12px;font-weight:600;
border:1px solid currentColor;white-space:nowrap}
.s-completed{color:var(--green)}.s-failed,.s-blocked,.dead{color:var(--red)}
.s-waiting{color:var(--purple)}.s-stopped{color:var(--amber)}.s-running,.s-pending{color:var(--accent)}
.s-cancelled,.s-continued{color:var(--grey)}
.dead,.badge.dead{font-weight:600;color:var(--red)}
table.runs td:nth-child(-n+3),table.runs td:nth-child(n+5){white-space:nowrap}
.counts{display:flex;flex-wrap:wrap;gap:.4em;margin:.3em 0 .8em}
.counts a{text-decoration:none;border:1px solid var(--line);border-radius:6px;padding:.2em .7em;
color:var(--fg)}
.counts a.here{border-color:var(--accent);background:#ddf4ff}
.counts b{margin-left:.3em}
form.filters{display:flex;flex-wrap:wrap;gap:.5em 1em;align-items:end;padding:.7em;
border:1px solid var(--line);border-radius:6px;background:var(--soft)}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted)}
input,select,textarea,button{font:inherit;padding:.25em .45em;border:1px solid var(--line);border-radius:5px;
background:#fff;color:var(--fg)}
button{cursor:pointer;background:var(--soft)}button.primary{background:var(--accent);color:#fff;
border-color:var(--accent)}button.danger{color:var(--red)}
form.act{display:flex;flex-wrap:wrap;gap:.4em;align-items:center;margin:.4em 0;padding:.6em;
border:1px solid var(--line);border-radius:6px}
.card{border:1px solid var(--line);border-radius:8px;padding:.2em 1em .8em;margin:1em 0}
.card h2{margin-top:.8em}
.decision{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1em;margin:.5em 0}
.decision dt{color:var(--muted)}.decision dd{margin:0;word-break:break-all}
.flash{padding:.6em .9em;border-radius:6px;background:#dafbe1;border:1px solid #aceebb}
.error{padding:.6em .9em;border-radius:6px;background:#ffebe9;border:1px solid #ffcecb;color:var(--red)}
.changed{padding:.5em .9em;border-radius:6px;background:#fff8c5;border:1px solid #eed888}
.pager{display:flex;gap:1em;align-items:center;margin:.5em 0}
.timeline td.bar{width:30%}
.bar span{display:block;height:10px;border-radius:3px;background:var(--accent);min-width:2px}
.bar span.k-effect,.bar span.k-transaction{background:var(--purple)}.bar span.k-model{background:var(--amber)}
.bar span.k-wait{background:var(--grey)}.bar span.failed{background:var(--red)}
ol.actions li{margin:.2em 0}
"""

SCRIPT = r"""
"use strict";
(function () {
  const body = document.body;
  const status = document.getElementById("live-status");
  const period = Number(body.dataset.refresh || 0);

  function typedIn(region) {
    for (const field of region.querySelectorAll("input,textarea,select")) {
      if (field.type === "hidden") continue;
      if (field.tagName === "SELECT") {
        for (const option of field.options) if (option.selected !== option.defaultSelected) return true;
      } else if (field.type === "checkbox" || field.type === "radio") {
        if (field.checked !== field.defaultChecked) return true;
      } else if (field.value !== field.defaultValue) return true;
    }
    return false;
  }

  async function refresh() {
    if (document.visibilityState !== "visible") return;
    let answer;
    try {
      answer = await fetch(location.href, {headers: {"Accept": "text/html"}, cache: "no-store"});
    } catch (problem) {
      status.textContent = "not refreshed: the dashboard does not answer";
      return;
    }
    if (!answer.ok) { status.textContent = "not refreshed: " + answer.status; return; }
    const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
    const open = new Set([...document.querySelectorAll("details[open][data-key]")].map(d => d.dataset.key));
    const scroll = [window.scrollX, window.scrollY];
    for (const region of document.querySelectorAll("[data-live]")) {
      const next = fresh.querySelector(`[data-live="${CSS.escape(region.dataset.live)}"]`);
      if (!next || region.contains(document.activeElement) || typedIn(region)) continue;
      if (region.innerHTML !== next.innerHTML) region.innerHTML = next.innerHTML;
    }
    for (const details of document.querySelectorAll("details[data-key]")) {
      if (open.has(details.dataset.key)) details.open = true;
    }
    drawBars();
    window.scrollTo(scroll[0], scroll[1]);
    const now = fresh.body.dataset.state;
    const changed = document.getElementById("changed");
    if (body.dataset.state !== undefined && now !== undefined && now !== body.dataset.state && changed) {
      changed.hidden = false;
      changed.textContent = "This run changed since the page was loaded (" + now + "). ";
      const link = document.createElement("a");
      link.href = location.pathname;
      link.textContent = "Reload it to act on what it is now.";
      changed.appendChild(link);
    }
    status.textContent = "updated " + new Date().toLocaleTimeString();
  }

  function drawBars() {
    for (const bar of document.querySelectorAll(".bar span[data-width]")) {
      bar.style.marginLeft = bar.dataset.left + "%";
      bar.style.width = bar.dataset.width + "%";
    }
  }
  drawBars();

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    const text = source.textContent;
    try {
      await navigator.clipboard.writeText(text);
    } catch (refused) {
      const range = document.createRange();
      range.selectNodeContents(source);
      const selection = getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      document.execCommand("copy");
    }
    button.textContent = "copied";
    setTimeout(() => { button.textContent = "copy"; }, 1500);
  });

  if (period > 0) {
    status.textContent = "live";
    setInterval(refresh, period);
  }
})();
"""
