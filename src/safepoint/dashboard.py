"""The dashboard: the runs and their ledgers in a browser, and a person's decisions about them.

``safepoint dashboard`` (or ``Dashboard(store).serve_forever()``) serves, on loopback only:

- ``/`` — the runs, newest first, with what a blocked run needs and what a waiting run waits for;
- ``/runs/RUN`` — one run: its recovery record with the next actions, the payload a waiting run
  asks a person to approve, its steps and its events;
- ``/api/runs`` and ``/api/runs/RUN`` — the same as JSON;
- forms that cancel a run, resolve a blocked one (applied / not applied / abandon, checked
  against the record's revision), approve a waiting effect and revoke an approval while its
  effect's outcome is open.

Reading needs nothing; every action needs the dashboard's token (printed when it starts), typed
into the form or sent as ``Authorization: Bearer …``. A page never contains the token, so a
page another site opens in the same browser cannot act. The server binds to loopback and refuses
any other address: a ledger may hold what a person would not publish.

The standard library's HTTP server is enough for one person looking at one ledger; the
decisions go through the same functions as the API and the CLI (``cancel``, ``resolve``,
``approve``, ``revoke_approval``), so they are checked and recorded in the same way.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import json
import secrets
import threading
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ._approvals import approve, revocable, revoke_approval
from ._recovery import resolve
from ._workflow import cancel
from .errors import RunNotFound, SafepointError, UsageError
from .storage.base import Store
from .types import (
    ApprovalRecord,
    EventRecord,
    Ledger,
    RunRecord,
    RunStatus,
    StepRecord,
    UnreadableRun,
)

DEFAULT_PORT = 8470
_MAX_FORM_BYTES = 64 * 1024
_LIST_LIMIT = 200


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Dashboard:
    """A dashboard over ``store``, on ``host:port`` (port 0: any free port).

    >>> with Dashboard(store) as board:       # serves on a thread until the block ends
    ...     print(board.url, board.token)
    """

    def __init__(self, store: Store, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None) -> None:
        if not is_loopback(host):
            raise UsageError(f"the dashboard binds to loopback only (127.0.0.1, ::1, localhost),"
                             f" not {host!r}: reach it from elsewhere through an SSH tunnel")
        if token is not None and len(token) < 16:
            raise UsageError("a dashboard token needs 16 characters or more")
        self.store = store
        self.token = token or secrets.token_urlsafe(24)
        board = self

        class Handler(_Handler):
            dashboard = board

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None
        bound_host, bound_port = (str(part) for part in self._server.server_address[:2])
        if ":" in bound_host:  # an IPv6 address goes in brackets
            bound_host = f"[{bound_host}]"
        self.url = f"http://{bound_host}:{bound_port}"

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Dashboard:
        self._thread = threading.Thread(target=self.serve_forever, name="safepoint-dashboard",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def authorized(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard
    server_version = "safepoint-dashboard"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
        pass

    # -- routing -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path, query = self._target()
        store = self.dashboard.store
        try:
            if path == "/":
                status = query.get("status")
                runs = store.list_runs(RunStatus(status) if status else None, _LIST_LIMIT)
                self._html(HTTPStatus.OK, _runs_page(runs, status))
            elif path == "/api/runs":
                self._json(HTTPStatus.OK, [_plain(run) for run in store.list_runs(None,
                                                                                   _LIST_LIMIT)])
            elif path.startswith("/api/runs/"):
                ledger = store.load_ledger(path.removeprefix("/api/runs/"))
                self._json(HTTPStatus.OK, {
                    "run": _plain(ledger.run),
                    "steps": [_plain(step) for step in _ordered(ledger)],
                    "operations": [_plain(op) for op in ledger.operations.values()],
                    "events": [_plain(event) for event in store.events(ledger.run.run_id)]})
            elif path.startswith("/runs/"):
                ledger = store.load_ledger(path.removeprefix("/runs/"))
                self._html(HTTPStatus.OK, _run_page(store, ledger,
                                                    store.events(ledger.run.run_id)))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"nothing at {path}")
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
        except (SafepointError, ValueError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, getattr(exc, "message", str(exc)))

    def do_POST(self) -> None:
        path, _ = self._target()
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "runs" or parts[2] not in _ACTIONS:
            self._error(HTTPStatus.NOT_FOUND, f"no action at {path}")
            return
        form = self._form()
        if form is None:
            return
        bearer = self.headers.get("Authorization", "").removeprefix("Bearer ").strip() or None
        if not self.dashboard.authorized(form.get("token") or bearer):
            self._error(HTTPStatus.FORBIDDEN, "a dashboard action needs the dashboard's token"
                        " (printed when `safepoint dashboard` starts)")
            return
        run_id = parts[1]
        try:
            _ACTIONS[parts[2]](self.dashboard.store, run_id, form)
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
            return
        except SafepointError as exc:
            self._error(HTTPStatus.CONFLICT, exc.message)
            return
        except (ValueError, KeyError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, f"the form is incomplete or malformed: {exc}")
            return
        if "application/json" in self.headers.get("Accept", ""):
            self._json(HTTPStatus.OK, _plain(self.dashboard.store.get_run(run_id)))
        else:
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", f"/runs/{quote(run_id, safe='')}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    # -- plumbing ------------------------------------------------------------------------------

    def _target(self) -> tuple[str, dict[str, str]]:
        split = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(split.query).items()}
        return unquote(split.path), query

    def _form(self) -> dict[str, str] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_FORM_BYTES:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "the form is too large")
            return None
        body = self.rfile.read(length).decode("utf-8", errors="replace")
        if "application/json" in self.headers.get("Content-Type", ""):
            loaded = json.loads(body or "{}")
            return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in loaded.items()}
        return {key: values[-1] for key, values in parse_qs(body).items()}

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Nothing on these pages runs scripts or is framed by another site.
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; style-src 'unsafe-inline'; form-action 'self';"
                         " frame-ancestors 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _html(self, status: HTTPStatus, page: str) -> None:
        self._send(status, page.encode(), "text/html; charset=utf-8")

    def _json(self, status: HTTPStatus, value: Any) -> None:
        self._send(status, json.dumps(value, default=str, indent=2).encode(),
                   "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        if "application/json" in self.headers.get("Accept", ""):
            self._json(status, {"error": message})
        else:
            self._html(status, _page(f"{status.value} {status.phrase}",
                                     f"<p class=err>{_e(message)}</p><p><a href='/'>runs</a></p>"))


# -- actions: the same functions as the API and the CLI ------------------------------------------


def _cancel(store: Store, run_id: str, form: dict[str, str]) -> None:
    cancel(store, run_id, by=form["by"], reason=form.get("reason") or None)


def _resolve(store: Store, run_id: str, form: dict[str, str]) -> None:
    receipt = form.get("receipt")
    resolve(store, run_id, form["action"], revision=int(form["revision"]), by=form["by"],
            operation_id=form.get("operation_id") or None,
            receipt=json.loads(receipt) if receipt else None,
            evidence=form.get("evidence") or None)


def _approve(store: Store, run_id: str, form: dict[str, str]) -> None:
    minutes = form.get("expires_minutes")
    approve(store, run_id, form["step_id"], by=form["by"],
            expires=timedelta(minutes=float(minutes)) if minutes else None,
            evidence=form.get("evidence") or None,
            payload_digest=form.get("payload_digest") or None)


def _revoke(store: Store, run_id: str, form: dict[str, str]) -> None:
    revoke_approval(store, run_id, form["step_id"], by=form["by"], reason=form["reason"])


_ACTIONS = {"cancel": _cancel, "resolve": _resolve, "approve": _approve, "revoke": _revoke}


# -- pages -----------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any, width: int = 80) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 1] + "…"


_STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{background:#f4f4f4}code,pre{font:12px ui-monospace,monospace}
pre{background:#f8f8f8;padding:.6em;overflow:auto}.blocked{color:#b00}.waiting{color:#a0a}
.completed{color:#070}.failed{color:#b60}.cancelled,.continued{color:#777}.err,.revoked{color:#b00}
form{display:inline-block;margin:.4em 1em .4em 0;padding:.5em;border:1px solid #ddd}
input,select{margin:.1em}section{margin:1.2em 0}"""


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)} — safepoint"
            f"</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{body}</body>"
            "</html>")


def _status(run: RunRecord) -> str:
    return f"<span class={_e(run.status.value)}>{_e(run.status.value)}</span>"


def _needs(run: RunRecord) -> str:
    if run.status is RunStatus.BLOCKED:
        return _e((run.recovery_record or {}).get("phase", ""))
    if run.status is RunStatus.WAITING:
        return f"approval of {_e((run.waiting_for or {}).get('step_id'))}"
    if run.successor_run_id:
        return f"→ {_e(run.successor_run_id)}"
    return ""


def _unreadable_row(run: UnreadableRun) -> str:
    """A run whose row cannot be read: what could, and why the rest cannot."""
    known = "" if run.status is None else f"{run.status.value}: "
    return (f"<tr><td>{_e(run.run_id)}</td>"
            f"<td>{_e(run.workflow or '?')}@{_e(run.workflow_version or '?')}</td>"
            f"<td><span class=blocked>unreadable</span></td>"
            f"<td class=blocked>{_e(known + run.reason)}</td>"
            + "".join(f"<td>{'?' if value is None else value}</td>"
                      for value in (run.resume_count, run.fence))
            + f"<td>{_when(run.updated_at)}</td></tr>")


def _runs_page(runs: list[RunRecord | UnreadableRun], status: str | None) -> str:
    filters = " · ".join(
        f"<a href='/?status={s.value}'>{s.value}</a>" for s in RunStatus)
    rows = "".join(
        _unreadable_row(run) if isinstance(run, UnreadableRun) else
        f"<tr><td><a href='/runs/{quote(run.run_id, safe='')}'>{_e(run.run_id)}</a></td>"
        f"<td>{_e(run.workflow)}@{_e(run.workflow_version)}</td><td>{_status(run)}</td>"
        f"<td>{_needs(run)}</td><td>{run.resume_count}</td><td>{run.fence}</td>"
        f"<td>{_when(run.updated_at)}</td></tr>" for run in runs)
    return _page("runs" + (f": {status}" if status else ""), (
        f"<p><a href='/'>all</a> · {filters}</p><table><tr><th>run</th><th>workflow</th>"
        f"<th>status</th><th>needs</th><th>resumes</th><th>fence</th><th>updated (UTC)</th></tr>"
        f"{rows}</table>"))


def _ordered(ledger: Ledger) -> list[StepRecord]:
    return sorted(ledger.steps.values(), key=lambda step: step.seq)


def _run_page(store: Store, ledger: Ledger, events: list[EventRecord]) -> str:
    run = ledger.run
    rid = quote(run.run_id, safe="")
    header = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in (
        ("status", _status(run)), ("workflow", _e(f"{run.workflow}@{run.workflow_version}")),
        ("inputs", f"<code>{_e(_short(run.inputs, 200))}</code>"),
        ("revision", str(run.state_revision)), ("fence", str(run.fence)),
        ("resumes", _e(f"{run.resume_count} of {run.resume_budget}")),
        ("result" if run.result is not None else "error",
         f"<code>{_e(_short(run.result if run.result is not None else run.error, 300))}</code>"),
        ("updated (UTC)", _when(run.updated_at))))
    parts = [f"<p><a href='/'>runs</a></p><table>{header}</table>"]
    if run.status is RunStatus.BLOCKED and run.recovery_record:
        parts.append(_blocked_section(rid, run.recovery_record))
    if run.status is RunStatus.WAITING and run.waiting_for:
        parts.append(_waiting_section(store, rid, run.waiting_for))
    approvals = store.approvals(run.run_id)
    if approvals:
        parts.append(_approvals_section(rid, ledger, approvals))
    if not run.status.terminal:
        parts.append(f"<section><h2>cancel</h2><form method=post action='/runs/{rid}/cancel'>"
                     f"{_who()}<input name=reason placeholder='why'>{_token()}"
                     "<button>cancel the run</button></form></section>")
    steps = "".join(
        f"<tr><td>{step.seq}</td><td>{_e(step.kind.value)}</td><td>{_e(step.step_id)}</td>"
        f"<td>{_e(step.status.value)}</td><td><code>{_e(_short(step.result))}</code></td>"
        f"<td>{_e(step.operation_id or '')}</td></tr>" for step in _ordered(ledger))
    ops = "".join(
        f"<tr><td>{_e(op.operation_id)}</td><td>{_e(op.effect)}</td><td>{_e(op.state.value)}"
        f"</td><td>{op.dispatch_count}</td><td><code>{_e(op.effect_key)}</code></td></tr>"
        for op in ledger.operations.values())
    history = "".join(
        f"<tr><td>{_when(event.at)}</td><td>{_e(event.kind)}</td><td>{_e(event.step_id or '')}"
        f"</td><td>{_e(event.operation_id or '')}</td><td>{_e(event.fence or '')}</td>"
        f"<td><code>{_e(_short(event.detail))}</code></td></tr>" for event in events)
    parts.append(f"<section><h2>steps</h2><table><tr><th>#</th><th>kind</th><th>step</th>"
                 f"<th>status</th><th>result</th><th>operation</th></tr>{steps}</table></section>")
    parts.append(f"<section><h2>operations</h2><table><tr><th>operation</th><th>effect</th>"
                 f"<th>state</th><th>dispatches</th><th>effect key</th></tr>{ops}</table>"
                 "</section>")
    parts.append(f"<section><h2>events</h2><table><tr><th>at (UTC)</th><th>event</th>"
                 f"<th>step</th><th>operation</th><th>fence</th><th>detail</th></tr>{history}"
                 "</table></section>")
    return _page(run.run_id, "".join(parts))


def _who() -> str:
    return "<input name=by placeholder='your name' required>"


def _token() -> str:
    return "<input name=token type=password placeholder='dashboard token' required>"


def _blocked_section(rid: str, record: dict[str, Any]) -> str:
    revision = _e(record.get("state_revision"))
    operation = _e(record.get("operation_id") or "")
    actions = "".join(f"<li>{_e(action)}</li>" for action in record.get("next_actions", []))
    common = (f"<input type=hidden name=revision value='{revision}'>"
              f"<input type=hidden name=operation_id value='{operation}'>{_who()}")
    forms = (
        f"<form method=post action='/runs/{rid}/resolve'>{common}"
        "<input type=hidden name=action value=applied>"
        "<input name=receipt placeholder='receipt JSON the owner holds' required>"
        f"<input name=evidence placeholder='how you know'>{_token()}"
        "<button>it happened</button></form>"
        f"<form method=post action='/runs/{rid}/resolve'>{common}"
        f"<input type=hidden name=action value=not_applied>{_token()}"
        "<button>it did not happen</button></form>"
        f"<form method=post action='/runs/{rid}/resolve'>{common}"
        f"<input type=hidden name=action value=abandon>{_token()}"
        "<button>abandon the run</button></form>") if record.get("operation_id") else (
        f"<form method=post action='/runs/{rid}/resolve'>{common}"
        f"<input type=hidden name=action value=abandon>{_token()}"
        "<button>abandon the run</button></form>")
    return (f"<section><h2 class=blocked>blocked: {_e(record.get('phase'))}</h2>"
            f"<p><b>{_e(record.get('reason'))}</b></p>"
            f"<p>operation {operation} ({_e(record.get('effect_status') or '')}), effect key "
            f"<code>{_e(record.get('effect_key') or '')}</code>, revision {revision}</p>"
            f"<ol>{actions}</ol>{forms}<pre>{_e(json.dumps(record, indent=2))}</pre></section>")


def _waiting_section(store: Store, rid: str, waiting: dict[str, Any]) -> str:
    digest = str(waiting.get("payload_digest"))
    try:
        payload = json.dumps(json.loads(store.get_artifact(digest)), indent=2,
                             ensure_ascii=False)
    except SafepointError as exc:
        payload = f"(the payload cannot be read: {exc.message})"
    return (f"<section><h2 class=waiting>waiting for approval</h2>"
            f"<p><b>{_e(waiting.get('reason', ''))}</b></p>"
            f"<p>step {_e(waiting.get('step_id'))}, operation {_e(waiting.get('operation_id'))}"
            f" ({_e(waiting.get('effect'))}); payload <code>{_e(digest)}</code>, target state "
            f"<code>{_e(waiting.get('target_digest') or 'none')}</code></p>"
            f"<pre>{_e(payload)}</pre>"
            f"<form method=post action='/runs/{rid}/approve'>"
            f"<input type=hidden name=step_id value='{_e(waiting.get('step_id'))}'>"
            f"<input type=hidden name=payload_digest value='{_e(digest)}'>{_who()}"
            "<input name=expires_minutes placeholder='expires in minutes' size=16>"
            f"<input name=evidence placeholder='why'>{_token()}"
            "<button>approve this payload</button></form></section>")


def _approvals_section(rid: str, ledger: Ledger,
                       approvals: list[ApprovalRecord]) -> str:
    """Every approval of the run, revoked ones marked; a revoke form for each effect not yet
    dispatched whose approval is in force."""
    rows = "".join(
        f"<tr><td>{_e(a.step_id)}</td><td>{_e(a.approved_by)}</td><td>{_when(a.approved_at)}"
        f"</td><td>{_when(a.expires_at) or 'never'}</td><td><code>{_e(a.payload_digest[:19])}…"
        f"</code></td><td>{_revoked(a)}</td></tr>" for a in approvals)
    forms = "".join(
        f"<form method=post action='/runs/{rid}/revoke'>"
        f"<input type=hidden name=step_id value='{_e(step)}'>{_who()}"
        f"<input name=reason placeholder='why' required>{_token()}"
        f"<button>revoke the approval of {_e(step)}</button></form>"
        for step in revocable(ledger.run, ledger.operations, approvals))
    return (f"<section><h2>approvals</h2><table><tr><th>step</th><th>approved by</th>"
            f"<th>at (UTC)</th><th>expires (UTC)</th><th>payload</th><th>revoked</th></tr>"
            f"{rows}</table>{forms}</section>")


def _revoked(approval: ApprovalRecord) -> str:
    if not approval.revoked:
        return ""
    return (f"<span class=revoked>revoked by {_e(approval.revoked_by)} at"
            f" {_when(approval.revoked_at)}: {_e(approval.revoke_reason)}</span>")


def _plain(record: Any) -> Any:
    """A record as JSON-ready data (enums by value)."""
    if is_dataclass(record) and not isinstance(record, type):
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(record).items()}
    return record
