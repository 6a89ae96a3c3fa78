"""The dashboard: the runs and their ledgers in a browser, and a person's decisions about them.

``safepoint dashboard`` (or ``Dashboard(store).serve_forever()``) serves, on loopback only:

- ``/`` — the runs, newest first, with what a blocked run needs, what a waiting run waits for
  and who holds a running one (or that its worker is gone);
- ``/runs/RUN`` — one run: its recovery record with the next actions, the payload a waiting run
  asks a person to approve, its steps and its events;
- ``/api/runs`` and ``/api/runs/RUN`` — the same as JSON, for holders of the token;
- forms that cancel a run, resolve a blocked one (applied / not applied / abandon, checked
  against the record's revision), approve a waiting effect and revoke an approval while its
  effect's outcome is open.

Who is asking is checked before anything else:

- the ``Host`` header must name the dashboard itself (``127.0.0.1``, ``localhost`` or ``[::1]``
  with its port), on every method and path: a DNS-rebinding page, which reaches the port under
  a name of its own, gets ``421`` and nothing of the ledger;
- every POST must come from the dashboard's own pages (``Origin`` exactly its own origin, no
  cross-site ``Sec-Fetch-Site``) or, without an ``Origin``, carry ``Authorization: Bearer …``:
  a program, not a browser;
- every action, and the JSON API, needs the dashboard's token (printed when it starts): typed
  into the form, or sent as ``Authorization: Bearer …``. The HTML pages need no token — they are
  read by the operator's browser on this machine, and the Host check keeps other sites' pages
  from reading them — and never contain it, so a page another site opens cannot act.

The server binds to loopback and refuses any other address: a ledger may hold what a person
would not publish. A malformed request (a bad ``Content-Length``, a body that is not the JSON
object or form it should be, a form naming a field twice or one its action does not take) is
answered with an error — JSON for JSON requests — and changes nothing.

The standard library's HTTP server is enough for one person looking at one ledger; the
decisions go through the same functions as the API and the CLI (``cancel``, ``resolve``,
``approve``, ``revoke_approval``), so they are checked and recorded in the same way.
"""

from __future__ import annotations

import errno
import hmac
import html
import ipaddress
import json
import secrets
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from .._engine.operator import approve, resolve, revoke_approval
from .._engine.verbs import cancel
from .._rules.approvals import revocable
from .._rules.presence import ownership, status_label
from ..errors import RunNotFound, SafepointError, UsageError
from ..storage.base import Store
from ..types import (
    ApprovalRecord,
    EventRecord,
    Ledger,
    ResolutionAction,
    RunRecord,
    RunStatus,
    StepRecord,
    UnreadableRun,
)
from .admission import (
    LOOPBACK_NAMES,
    MAX_BODY_BYTES,
    Refusal,
    bearer_token,
    body_length,
    host_allowed,
    origins_of,
    parse_form,
    post_refusal,
)

DEFAULT_PORT = 8470
_DRAIN_BYTES = 4 * MAX_BODY_BYTES  # what is read and dropped of a body refused unread
_LIST_LIMIT = 200


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind_refusal(host: str, port: int, exc: OSError) -> UsageError:
    if exc.errno == errno.EADDRINUSE:
        message = (
            f"port {port} on {host} is in use (another dashboard, or another program):"
            " choose another with --port (0: any free port), or stop what holds it"
        )
    else:
        message = (
            f"the dashboard cannot listen on {host} port {port}:"
            f" {exc.strerror or exc}; choose another --host or --port"
        )
    return UsageError(message, host=host, port=port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Two dashboards sharing one port would answer its requests at random: the second refuses.
    allow_reuse_port = False


class _Server6(_Server):
    address_family = socket.AF_INET6


class Dashboard:
    """A dashboard over ``store``, on ``host:port`` (port 0: any free port).

    ``read_timeout``: how long a client may go silent (seconds) while sending its request
    before it is answered with an error and the connection closed.

    >>> with Dashboard(store) as board:       # serves on a thread until the block ends
    ...     print(board.url, board.token)
    """

    def __init__(
        self,
        store: Store,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str | None = None,
        read_timeout: float = 10.0,
    ) -> None:
        if not is_loopback(host):
            raise UsageError(
                f"the dashboard binds to loopback only (127.0.0.1, ::1, localhost),"
                f" not {host!r}: reach it from elsewhere through an SSH tunnel"
                f" that keeps the port (ssh -L {port or DEFAULT_PORT}:127.0.0.1:"
                f"{port or DEFAULT_PORT} HOST)"
            )
        if token is not None and len(token) < 16:
            raise UsageError("a dashboard token needs 16 characters or more")
        self.store = store
        self.token = token or secrets.token_urlsafe(24)
        board = self

        class Handler(_Handler):
            dashboard = board
            timeout = read_timeout

        server = _Server6 if ":" in host else _Server
        try:
            self._server = server((host, port), Handler)
        except OSError as exc:
            raise _bind_refusal(host, port, exc) from exc
        self._thread: threading.Thread | None = None
        bound_host, bound_port = (str(part) for part in self._server.server_address[:2])
        if ":" in bound_host:  # an IPv6 address goes in brackets
            bound_host = f"[{bound_host}]"
        self.port = int(bound_port)
        self.url = f"http://{bound_host}:{bound_port}"
        self.names = (*LOOPBACK_NAMES, bound_host)  # the host names it answers to
        self.origins = origins_of(self.port, self.names)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until ``close()`` (from another thread), which waits up to ``poll_interval``."""
        self._server.serve_forever(poll_interval)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Dashboard:
        # A short poll: leaving the block should not wait half a second for the server.
        self._thread = threading.Thread(
            target=self.serve_forever, args=(0.05,), name="safepoint-dashboard", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def authorized(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())


_NEEDS_TOKEN = "the dashboard's token (printed when `safepoint dashboard` starts)"


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard
    server_version = "safepoint-dashboard"
    _body_settled = False  # the request's body was read, or will never come: nothing to drain

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log on stderr
        pass

    # -- admission: every method, every path ---------------------------------------------------

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    do_HEAD = do_GET  # _send leaves the body out

    def do_PUT(self) -> None:
        self._answer(self._unsupported)

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def _answer(self, handle: Callable[[list[str], dict[str, str]], None]) -> None:
        try:
            hosts = self.headers.get_all("Host") or []
            if len(hosts) != 1 or not host_allowed(hosts[0], self.dashboard.port, self.dashboard.names):
                named = (
                    f"as {hosts[0][:100]!r}"
                    if len(hosts) == 1
                    else "under no Host"
                    if not hosts
                    else "under more than one Host"
                )
                raise Refusal(
                    HTTPStatus.MISDIRECTED_REQUEST,
                    (
                        f"this dashboard answers only as {self.dashboard.url} (or localhost, [::1]"
                        f" on port {self.dashboard.port}); the request asked {named}"
                    ),
                )
            handle(*self._target())
        except Refusal as refusal:
            self._error(refusal.status, refusal.message, refusal.headers)
        except (ConnectionError, TimeoutError):  # the client went away: nobody to answer
            self.close_connection = True
        except Exception as exc:  # a fault of the dashboard's: answer it, keep serving
            traceback.print_exc(file=sys.stderr)
            self._error(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the dashboard failed: {type(exc).__name__}: {exc}"
            )

    def _unsupported(self, segments: list[str], query: dict[str, str]) -> None:
        raise Refusal(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"the dashboard answers GET and POST, not {self.command}",
            {"Allow": "GET, POST"},
        )

    def _require_bearer(self) -> None:
        if not self.dashboard.authorized(bearer_token(self.headers.get("Authorization"))):
            raise Refusal(
                HTTPStatus.UNAUTHORIZED,
                f"the JSON API needs {_NEEDS_TOKEN}, sent as `Authorization: Bearer …`",
                {"WWW-Authenticate": 'Bearer realm="safepoint-dashboard"'},
            )

    # -- routing -------------------------------------------------------------------------------

    def _get(self, segments: list[str], query: dict[str, str]) -> None:
        store = self.dashboard.store
        if segments[:1] == ["api"]:
            self._require_bearer()
        try:
            match segments:
                case [""]:
                    status = query.get("status")
                    if status and status not in {s.value for s in RunStatus}:
                        raise Refusal(
                            HTTPStatus.BAD_REQUEST,
                            f"no status {status[:40]!r}: one of {', '.join(s.value for s in RunStatus)}",
                        )
                    runs = store.list_runs(RunStatus(status) if status else None, _LIST_LIMIT)
                    self._html(HTTPStatus.OK, _runs_page(runs, status, store.now()))
                case ["api", "runs"]:
                    now = store.now()
                    self._json(
                        HTTPStatus.OK, [_run_json(run, now) for run in store.list_runs(None, _LIST_LIMIT)]
                    )
                case ["api", "runs", run_id]:
                    ledger = store.load_ledger(run_id)
                    self._json(
                        HTTPStatus.OK,
                        {
                            "run": _run_json(ledger.run, store.now()),
                            "steps": [_plain(step) for step in _ordered(ledger)],
                            "operations": [_plain(op) for op in ledger.operations.values()],
                            "events": [_plain(event) for event in store.events(ledger.run.run_id)],
                        },
                    )
                case ["runs", run_id]:
                    ledger = store.load_ledger(run_id)
                    self._html(
                        HTTPStatus.OK, _run_page(store, ledger, store.events(ledger.run.run_id), store.now())
                    )
                case _:
                    self._error(HTTPStatus.NOT_FOUND, f"nothing at {'/' + '/'.join(segments)}")
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
        except (SafepointError, ValueError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, getattr(exc, "message", str(exc)))

    def _post(self, segments: list[str], query: dict[str, str]) -> None:
        origins = self.headers.get_all("Origin") or []
        refusal = (
            "the request has more than one Origin"
            if len(origins) > 1
            else post_refusal(
                origins[0] if origins else None,
                self.headers.get("Sec-Fetch-Site"),
                bearer_token(self.headers.get("Authorization")) is not None,
                self.dashboard.origins,
            )
        )
        if refusal is not None:
            raise Refusal(HTTPStatus.FORBIDDEN, refusal)
        match segments:
            case ["runs", run_id, action] if action in _ACTIONS:
                pass
            case _:
                raise Refusal(HTTPStatus.NOT_FOUND, f"no action at {'/' + '/'.join(segments)}")
        act, fields = _ACTIONS[action]
        form = parse_form(self._body(), self.headers.get("Content-Type", ""), action, fields | {"token"})
        bearer = bearer_token(self.headers.get("Authorization"))
        if not self.dashboard.authorized(form.get("token") or bearer):
            raise Refusal(HTTPStatus.FORBIDDEN, f"a dashboard action needs {_NEEDS_TOKEN}")
        try:
            act(self.dashboard.store, run_id, form)
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
            return
        except SafepointError as exc:
            self._error(HTTPStatus.CONFLICT, exc.message)
            return
        except KeyError as exc:
            self._error(HTTPStatus.BAD_REQUEST, f"the {action} form needs the field {exc}")
            return
        except (ValueError, ArithmeticError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, f"the form is malformed: {exc}")
            return
        if "application/json" in self.headers.get("Accept", ""):
            store = self.dashboard.store
            self._json(HTTPStatus.OK, _run_json(store.get_run(run_id), store.now()))
        else:
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", _run_path(run_id))
            self.send_header("Content-Length", "0")
            self.end_headers()

    # -- plumbing ------------------------------------------------------------------------------

    def _target(self) -> tuple[list[str], dict[str, str]]:
        """The path's segments, each percent-decoded on its own (a run id may hold ``/``), and
        the query's last value of each name."""
        path, _, query = self.path.partition("?")
        if not path.startswith("/"):
            raise Refusal(HTTPStatus.BAD_REQUEST, "the dashboard is not a proxy: ask for a path")
        try:
            segments = [unquote(part, errors="strict") for part in path.split("/")[1:]]
            values = parse_qs(query, errors="strict")
        except UnicodeDecodeError:
            raise Refusal(HTTPStatus.BAD_REQUEST, "the address is not percent-encoded UTF-8") from None
        return segments, {key: found[-1] for key, found in values.items()}

    def _body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:
            raise Refusal(
                HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length, not a Transfer-Encoding"
            )
        length = body_length(self.headers.get_all("Content-Length") or [])
        short = Refusal(HTTPStatus.BAD_REQUEST, f"the body ended before its Content-Length of {length} bytes")
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self._body_settled = True  # nothing more is coming
            raise Refusal(
                HTTPStatus.BAD_REQUEST, f"{short.message}: nothing more came within {self.timeout} s"
            ) from None
        self._body_settled = True
        if len(body) < length:
            raise short
        return body

    def finish(self) -> None:
        """Before closing, read (and drop) what remains of a body that was refused unread:
        closing on unread bytes resets the connection, and the client could lose the answer."""
        headers = getattr(self, "headers", None)
        if (
            not self._body_settled
            and headers is not None
            and ("Transfer-Encoding" in headers or headers.get("Content-Length", "0").strip() != "0")
        ):
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                left = _DRAIN_BYTES
                while left > 0 and (chunk := self.connection.recv(min(left, 65536))):
                    left -= len(chunk)
            except OSError:
                pass
        super().finish()

    def _wants_json(self) -> bool:
        return (
            "application/json" in self.headers.get("Accept", "")
            or "application/json" in self.headers.get("Content-Type", "")
            or self.path == "/api"
            or self.path.startswith(("/api/", "/api?"))
        )

    def _send(
        self, status: HTTPStatus, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # Nothing on these pages runs scripts or is framed by another site.
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _html(self, status: HTTPStatus, page: str) -> None:
        self._send(status, page.encode(), "text/html; charset=utf-8")

    def _json(self, status: HTTPStatus, value: Any) -> None:
        self._send(status, json.dumps(value, default=str, indent=2).encode(), "application/json")

    def _error(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        if self._wants_json():
            self._send(status, json.dumps({"error": message}, indent=2).encode(), "application/json", headers)
        else:
            self._send(
                status,
                _page(
                    f"{status.value} {status.phrase}",
                    f"<p class=err>{_e(message)}</p><p><a href='/'>runs</a></p>",
                ).encode(),
                "text/html; charset=utf-8",
                headers,
            )


# -- actions: the same functions as the API and the CLI ------------------------------------------


def _cancel(store: Store, run_id: str, form: dict[str, str]) -> None:
    cancel(store, run_id, by=form["by"], reason=form.get("reason") or None)


_RESOLUTIONS = ", ".join(action.value for action in ResolutionAction)


def _resolve(store: Store, run_id: str, form: dict[str, str]) -> None:
    if form["action"] not in {action.value for action in ResolutionAction}:
        raise Refusal(
            HTTPStatus.BAD_REQUEST, f"no resolution {form['action'][:40]!r}: name one of {_RESOLUTIONS}"
        )
    receipt = form.get("receipt")
    try:
        held = json.loads(receipt) if receipt else None
    except ValueError as exc:
        raise Refusal(HTTPStatus.BAD_REQUEST, f"the receipt is not JSON: {exc}") from None
    resolve(
        store,
        run_id,
        form["action"],
        revision=int(form["revision"]),
        by=form["by"],
        operation_id=form.get("operation_id") or None,
        receipt=held,
        evidence=form.get("evidence") or None,
    )


def _approve(store: Store, run_id: str, form: dict[str, str]) -> None:
    minutes = form.get("expires_minutes")
    approve(
        store,
        run_id,
        form["step_id"],
        by=form["by"],
        expires=timedelta(minutes=float(minutes)) if minutes else None,
        evidence=form.get("evidence") or None,
        payload_digest=form.get("payload_digest") or None,
    )


def _revoke(store: Store, run_id: str, form: dict[str, str]) -> None:
    revoke_approval(store, run_id, form["step_id"], by=form["by"], reason=form["reason"])


_Action = Callable[[Store, str, dict[str, str]], None]

# Each action with the fields its form takes (besides the token): any other field is refused.
_ACTIONS: dict[str, tuple[_Action, frozenset[str]]] = {
    "cancel": (_cancel, frozenset({"by", "reason"})),
    "resolve": (_resolve, frozenset({"action", "revision", "by", "operation_id", "receipt", "evidence"})),
    "approve": (_approve, frozenset({"step_id", "by", "expires_minutes", "evidence", "payload_digest"})),
    "revoke": (_revoke, frozenset({"step_id", "by", "reason"})),
}


# -- pages -----------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(value: Any, width: int = 80) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


_STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{background:#f4f4f4}code,pre{font:12px ui-monospace,monospace}
pre{background:#f8f8f8;padding:.6em;overflow:auto}.blocked{color:#b00}.waiting{color:#a0a}
.completed{color:#070}.failed{color:#b60}.cancelled,.continued{color:#777}.err,.revoked{color:#b00}
form{display:inline-block;margin:.4em 1em .4em 0;padding:.5em;border:1px solid #ddd}
input,select{margin:.1em}section{margin:1.2em 0}.lease_expired{color:#b60;font-weight:bold}"""


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)} — safepoint"
        f"</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{body}</body>"
        "</html>"
    )


def _run_path(run_id: str, action: str | None = None) -> str:
    """The address of a run's page (or of one of its actions): the run id is one path segment,
    whatever it holds (``/``, ``?``, ``#``, ``%``, spaces)."""
    return f"/runs/{quote(run_id, safe='')}" + (f"/{action}" if action else "")


def _status(run: RunRecord, now: int) -> str:
    """The run's status as it reads now: who holds a running run, or that nobody does."""
    presence = ownership(run, now)
    return (
        f"<span class='{_e(run.status.value)} {_e(presence.state)}'>{_e(status_label(run, presence))}</span>"
    )


def _needs(run: RunRecord) -> str:
    if run.status is RunStatus.BLOCKED:
        return _e((run.recovery_record or {}).get("phase", ""))
    if run.status is RunStatus.WAITING:
        return f"approval of {_e((run.waiting_for or {}).get('step_id'))}"
    if run.successor_run_id:
        return f"→ <a href='{_e(_run_path(run.successor_run_id))}'>{_e(run.successor_run_id)}</a>"
    return ""


def _unreadable_row(run: UnreadableRun) -> str:
    """A run whose row cannot be read: what could, and why the rest cannot."""
    known = "" if run.status is None else f"{run.status.value}: "
    return (
        f"<tr><td>{_e(run.run_id)}</td>"
        f"<td>{_e(run.workflow or '?')}@{_e(run.workflow_version or '?')}</td>"
        f"<td><span class=blocked>unreadable</span></td>"
        f"<td class=blocked>{_e(known + run.reason)}</td>"
        + "".join(f"<td>{'?' if value is None else value}</td>" for value in (run.resume_count, run.fence))
        + f"<td>{_when(run.updated_at)}</td></tr>"
    )


def _runs_page(runs: list[RunRecord | UnreadableRun], status: str | None, now: int) -> str:
    filters = " · ".join(f"<a href='/?status={s.value}'>{s.value}</a>" for s in RunStatus)
    rows = "".join(
        _unreadable_row(run)
        if isinstance(run, UnreadableRun)
        else f"<tr><td><a href='{_e(_run_path(run.run_id))}'>{_e(run.run_id)}</a></td>"
        f"<td>{_e(run.workflow)}@{_e(run.workflow_version)}</td><td>{_status(run, now)}</td>"
        f"<td>{_needs(run)}</td><td>{run.resume_count}</td><td>{run.fence}</td>"
        f"<td>{_when(run.updated_at)}</td></tr>"
        for run in runs
    )
    return _page(
        "runs" + (f": {status}" if status else ""),
        (
            f"<p><a href='/'>all</a> · {filters}</p><table><tr><th>run</th><th>workflow</th>"
            f"<th>status</th><th>needs</th><th>resumes</th><th>fence</th><th>updated (UTC)</th></tr>"
            f"{rows}</table>"
        ),
    )


def _ordered(ledger: Ledger) -> list[StepRecord]:
    return sorted(ledger.steps.values(), key=lambda step: step.seq)


def _run_page(store: Store, ledger: Ledger, events: list[EventRecord], now: int) -> str:
    run = ledger.run
    rid = _e(_run_path(run.run_id))
    header = "".join(
        f"<tr><th>{_e(k)}</th><td>{v}</td></tr>"
        for k, v in (
            ("status", _status(run, now)),
            ("workflow", _e(f"{run.workflow}@{run.workflow_version}")),
            ("inputs", f"<code>{_e(_short(run.inputs, 200))}</code>"),
            ("revision", str(run.state_revision)),
            ("fence", str(run.fence)),
            ("resumes", _e(f"{run.resume_count} of {run.resume_budget}")),
            (
                "result" if run.result is not None else "error",
                f"<code>{_e(_short(run.result if run.result is not None else run.error, 300))}</code>",
            ),
            ("updated (UTC)", _when(run.updated_at)),
        )
    )
    parts = [f"<p><a href='/'>runs</a></p><table>{header}</table>"]
    if run.status is RunStatus.BLOCKED and run.recovery_record:
        parts.append(_blocked_section(rid, run.recovery_record))
    if run.status is RunStatus.WAITING and run.waiting_for:
        parts.append(_waiting_section(store, rid, run.waiting_for))
    approvals = store.approvals(run.run_id)
    if approvals:
        parts.append(_approvals_section(rid, ledger, approvals))
    if not run.status.terminal:
        parts.append(
            f"<section><h2>cancel</h2><form method=post action='{rid}/cancel'>"
            f"{_who()}<input name=reason placeholder='why'>{_token()}"
            "<button>cancel the run</button></form></section>"
        )
    steps = "".join(
        f"<tr><td>{step.seq}</td><td>{_e(step.kind.value)}</td><td>{_e(step.step_id)}</td>"
        f"<td>{_e(step.status.value)}</td><td><code>{_e(_short(step.result))}</code></td>"
        f"<td>{_e(step.operation_id or '')}</td></tr>"
        for step in _ordered(ledger)
    )
    ops = "".join(
        f"<tr><td>{_e(op.operation_id)}</td><td>{_e(op.effect)}</td><td>{_e(op.state.value)}"
        f"</td><td>{op.dispatch_count}</td><td><code>{_e(op.effect_key)}</code></td></tr>"
        for op in ledger.operations.values()
    )
    history = "".join(
        f"<tr><td>{_when(event.at)}</td><td>{_e(event.kind)}</td><td>{_e(event.step_id or '')}"
        f"</td><td>{_e(event.operation_id or '')}</td><td>{_e(event.fence or '')}</td>"
        f"<td><code>{_e(_short(event.detail))}</code></td></tr>"
        for event in events
    )
    parts.append(
        f"<section><h2>steps</h2><table><tr><th>#</th><th>kind</th><th>step</th>"
        f"<th>status</th><th>result</th><th>operation</th></tr>{steps}</table></section>"
    )
    parts.append(
        f"<section><h2>operations</h2><table><tr><th>operation</th><th>effect</th>"
        f"<th>state</th><th>dispatches</th><th>effect key</th></tr>{ops}</table>"
        "</section>"
    )
    parts.append(
        f"<section><h2>events</h2><table><tr><th>at (UTC)</th><th>event</th>"
        f"<th>step</th><th>operation</th><th>fence</th><th>detail</th></tr>{history}"
        "</table></section>"
    )
    return _page(run.run_id, "".join(parts))


def _who() -> str:
    return "<input name=by placeholder='your name' required>"


def _token() -> str:
    return "<input name=token type=password placeholder='dashboard token' required>"


def _blocked_section(rid: str, record: dict[str, Any]) -> str:
    revision = _e(record.get("state_revision"))
    operation = _e(record.get("operation_id") or "")
    actions = "".join(f"<li>{_e(action)}</li>" for action in record.get("next_actions", []))
    common = (
        f"<input type=hidden name=revision value='{revision}'>"
        f"<input type=hidden name=operation_id value='{operation}'>{_who()}"
    )
    forms = (
        (
            f"<form method=post action='{rid}/resolve'>{common}"
            "<input type=hidden name=action value=applied>"
            "<input name=receipt placeholder='receipt JSON the owner holds' required>"
            f"<input name=evidence placeholder='how you know'>{_token()}"
            "<button>it happened</button></form>"
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=not_applied>{_token()}"
            "<button>it did not happen</button></form>"
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=abandon>{_token()}"
            "<button>abandon the run</button></form>"
        )
        if record.get("operation_id")
        else (
            f"<form method=post action='{rid}/resolve'>{common}"
            f"<input type=hidden name=action value=abandon>{_token()}"
            "<button>abandon the run</button></form>"
        )
    )
    return (
        f"<section><h2 class=blocked>blocked: {_e(record.get('phase'))}</h2>"
        f"<p><b>{_e(record.get('reason'))}</b></p>"
        f"<p>operation {operation} ({_e(record.get('effect_status') or '')}), effect key "
        f"<code>{_e(record.get('effect_key') or '')}</code>, revision {revision}</p>"
        f"<ol>{actions}</ol>{forms}<pre>{_e(json.dumps(record, indent=2))}</pre></section>"
    )


def _waiting_section(store: Store, rid: str, waiting: dict[str, Any]) -> str:
    digest = str(waiting.get("payload_digest"))
    try:
        payload = json.dumps(json.loads(store.get_artifact(digest)), indent=2, ensure_ascii=False)
    except SafepointError as exc:
        payload = f"(the payload cannot be read: {exc.message})"
    return (
        f"<section><h2 class=waiting>waiting for approval</h2>"
        f"<p><b>{_e(waiting.get('reason', ''))}</b></p>"
        f"<p>step {_e(waiting.get('step_id'))}, operation {_e(waiting.get('operation_id'))}"
        f" ({_e(waiting.get('effect'))}); payload <code>{_e(digest)}</code>, target state "
        f"<code>{_e(waiting.get('target_digest') or 'none')}</code></p>"
        f"<pre>{_e(payload)}</pre>"
        f"<form method=post action='{rid}/approve'>"
        f"<input type=hidden name=step_id value='{_e(waiting.get('step_id'))}'>"
        f"<input type=hidden name=payload_digest value='{_e(digest)}'>{_who()}"
        "<input name=expires_minutes placeholder='expires in minutes' size=16>"
        f"<input name=evidence placeholder='why'>{_token()}"
        "<button>approve this payload</button></form></section>"
    )


def _approvals_section(rid: str, ledger: Ledger, approvals: list[ApprovalRecord]) -> str:
    """Every approval of the run, revoked ones marked; a revoke form for each effect not yet
    dispatched whose approval is in force."""
    rows = "".join(
        f"<tr><td>{_e(a.step_id)}</td><td>{_e(a.approved_by)}</td><td>{_when(a.approved_at)}"
        f"</td><td>{_when(a.expires_at) or 'never'}</td><td><code>{_e(a.payload_digest[:19])}…"
        f"</code></td><td>{_revoked(a)}</td></tr>"
        for a in approvals
    )
    forms = "".join(
        f"<form method=post action='{rid}/revoke'>"
        f"<input type=hidden name=step_id value='{_e(step)}'>{_who()}"
        f"<input name=reason placeholder='why' required>{_token()}"
        f"<button>revoke the approval of {_e(step)}</button></form>"
        for step in revocable(ledger.run, ledger.operations, approvals)
    )
    return (
        f"<section><h2>approvals</h2><table><tr><th>step</th><th>approved by</th>"
        f"<th>at (UTC)</th><th>expires (UTC)</th><th>payload</th><th>revoked</th></tr>"
        f"{rows}</table>{forms}</section>"
    )


def _revoked(approval: ApprovalRecord) -> str:
    if not approval.revoked:
        return ""
    return (
        f"<span class=revoked>revoked by {_e(approval.revoked_by)} at"
        f" {_when(approval.revoked_at)}: {_e(approval.revoke_reason)}</span>"
    )


def _run_json(run: RunRecord | UnreadableRun, now: int) -> dict[str, Any]:
    """A run as JSON, with how its ownership reads now (an unreadable one: what could be read,
    and why the rest cannot)."""
    if isinstance(run, UnreadableRun):
        return {**_plain(run), "unreadable": True}
    return {**_plain(run), "ownership": asdict(ownership(run, now))}


def _plain(record: Any) -> Any:
    """A record as JSON-ready data (enums by value)."""
    if is_dataclass(record) and not isinstance(record, type):
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(record).items()}
    return record
