"""The dashboard: the runs and their ledgers in a browser, and a person's decisions about them.

``safepoint dashboard`` (or ``Dashboard(store).serve_forever()``) serves, on loopback only:

- ``/`` — the runs, newest first, with what a blocked run needs, what a waiting run waits for
  and who holds a running one (or that its worker is gone);
- ``/runs/RUN`` — one run: its recovery record with the next actions, the payload a waiting run
  asks a person to approve (or the message it waits for), its messages, its steps and its
  events;
- ``/api/runs`` and ``/api/runs/RUN`` — the same as JSON, for holders of the token;
- forms that cancel a run, resolve a blocked one (applied / not applied / abandon, checked
  against the record's revision), approve a waiting effect, revoke an approval while its
  effect's outcome is open, and send a run waiting for a message that message.

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

This module is the server: admission, routing and answering. The pages are drawn by
``dashboard_pages`` and the actions carried out by ``dashboard_actions`` (``ACTIONS``: each
action with the fields its form takes).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import secrets
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

from .._rules.canonical import too_deep
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    DecryptionFailed,
    KeyUnavailable,
    RunNotFound,
    SafepointError,
    UsageError,
)
from ..storage.base import Store
from .admission import (
    DEFAULT_PORT,
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
from .dashboard_actions import ACTIONS
from .dashboard_api import Route, match_route, page_json, run_detail_json, run_json, run_query, workers_json
from .dashboard_inbox import inbox_page, workers_page
from .dashboard_layout import SCRIPT, STYLE, error_page, run_path
from .dashboard_list import runs_page
from .dashboard_openapi import openapi_document
from .dashboard_pages import Typed, run_page, unreadable_page

_DRAIN_BYTES = 4 * MAX_BODY_BYTES  # what is read and dropped of a body refused unread
_FLASHES = 64  # confirmations kept for pages not yet shown; the oldest go first
# What makes a run's ledger unreadable here (a key the keyring lacks, a row or an artifact that
# does not read): its page says so, with what its row gives, instead of failing the request.
_UNREADABLE = (KeyUnavailable, DecryptionFailed, CorruptRecord, ArtifactMissing, ArtifactCorrupt)


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
    return UsageError(message)


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
        self._flashes: dict[str, str] = {}
        self._flash_lock = threading.Lock()
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

    def put_flash(self, message: str) -> str:
        """Keep a confirmation for the page an action redirects to; its key goes in the address
        (a key, not the words: another site cannot make the console say something)."""
        key = secrets.token_urlsafe(9)
        with self._flash_lock:
            self._flashes[key] = message
            while len(self._flashes) > _FLASHES:
                self._flashes.pop(next(iter(self._flashes)))
        return key

    def take_flash(self, key: str | None) -> str | None:
        """The confirmation kept under ``key``, once."""
        if not key:
            return None
        with self._flash_lock:
            return self._flashes.pop(key, None)

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
        except RecursionError:  # a value of the request's nested too deep for some step of it
            self._error(HTTPStatus.BAD_REQUEST, f"the request holds a value that is not JSON: {too_deep()}")
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

    # -- routing: by dashboard_api.ROUTES -------------------------------------------------------

    def _get(self, segments: list[str], query: dict[str, str]) -> None:
        self._route(segments, query, b"")

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
        self._route(segments, query, None)

    def _route(self, segments: list[str], query: dict[str, str], body: bytes | None) -> None:
        found = match_route(self.command, segments)
        if found is None:
            if match_route("POST" if self.command != "POST" else "GET", segments) is not None:
                raise Refusal(
                    HTTPStatus.METHOD_NOT_ALLOWED,
                    f"{'/' + '/'.join(segments)} does not answer {self.command}",
                    {"Allow": "POST" if self.command != "POST" else "GET"},
                )
            what = "no action" if self.command == "POST" else "nothing"
            raise Refusal(HTTPStatus.NOT_FOUND, f"{what} at {'/' + '/'.join(segments)}")
        route, params = found
        if route.token and route.method == "GET":
            self._require_bearer()
        if route.method == "POST":
            self._act(params["run_id"], route.name.removeprefix("action_"))
            return
        try:
            self._read(route, params, query)
        except _UNREADABLE as exc:
            if "run_id" not in params:
                raise
            self._unreadable(route, params["run_id"], exc)
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
        except (SafepointError, ValueError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, getattr(exc, "message", str(exc)))

    def _read(self, route: Route, params: dict[str, str], query: dict[str, str]) -> None:
        store = self.dashboard.store
        flash = self.dashboard.take_flash(query.get("done"))
        match route.name:
            case "runs_page":
                wanted = run_query(query)
                self._html(
                    HTTPStatus.OK, runs_page(store.query_runs(wanted), wanted, query, store.now(), flash)
                )
            case "inbox_page":
                self._html(HTTPStatus.OK, inbox_page(store, store.now(), flash=flash))
            case "workers_page":
                self._html(HTTPStatus.OK, workers_page(store, store.now()))
            case "run_page":
                ledger = store.load_ledger(params["run_id"])
                events = store.events(ledger.run.run_id)
                self._html(HTTPStatus.OK, run_page(store, ledger, events, store.now(), flash=flash))
            case "style":
                self._send(HTTPStatus.OK, STYLE.encode(), "text/css; charset=utf-8")
            case "script":
                self._send(HTTPStatus.OK, SCRIPT.encode(), "text/javascript; charset=utf-8")
            case "openapi":
                self._json(HTTPStatus.OK, openapi_document())
            case "api_runs":
                self._json(HTTPStatus.OK, page_json(store.query_runs(run_query(query)), store.now()))
            case "api_run":
                ledger = store.load_ledger(params["run_id"])
                events = store.events(ledger.run.run_id)
                self._json(HTTPStatus.OK, run_detail_json(store, ledger, events, store.now()))
            case "api_workers":
                self._json(HTTPStatus.OK, workers_json(store, store.now()))
            case _:  # a route listed but not answered here: the routes test catches it first
                raise Refusal(HTTPStatus.NOT_FOUND, f"nothing at {route.path}")

    def _unreadable(self, route: Route, run_id: str, exc: SafepointError) -> None:
        """A run whose ledger cannot be read here: the run as its row reads, and why — a page for
        a person; for a program, 409 with the key (when a key is what is missing) and the run."""
        store = self.dashboard.store
        run = store.find_run(run_id)
        if route.name != "api_run":
            self._html(HTTPStatus.OK, unreadable_page(run, exc.message, store.now()))
            return
        answer = {
            "error": exc.message,
            "status": HTTPStatus.CONFLICT.value,
            "run": run_json(run, store.now()),
        }
        if isinstance(exc, (KeyUnavailable, DecryptionFailed)):
            answer["key_id"] = exc.key_id
        self._json(HTTPStatus.CONFLICT, answer)

    def _act(self, run_id: str, action: str) -> None:
        act, fields = ACTIONS[action]
        form = parse_form(
            self._body(), self.headers.get("Content-Type", ""), action, fields | {"token", "back"}
        )
        bearer = bearer_token(self.headers.get("Authorization"))
        if not self.dashboard.authorized(form.get("token") or bearer):
            self._refused_form(
                HTTPStatus.FORBIDDEN, f"a dashboard action needs {_NEEDS_TOKEN}", run_id, action, form
            )
            return
        try:
            shown = act(self.dashboard.store, run_id, form) or run_id  # a fork: show the fork
        except Refusal as refusal:
            self._refused_form(refusal.status, refusal.message, run_id, action, form)
            return
        except RunNotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, exc.message)
            return
        except SafepointError as exc:
            self._refused_form(HTTPStatus.CONFLICT, exc.message, run_id, action, form)
            return
        except KeyError as exc:
            self._refused_form(
                HTTPStatus.BAD_REQUEST, f"the {action} form needs the field {exc}", run_id, action, form
            )
            return
        except (ValueError, ArithmeticError) as exc:
            self._refused_form(HTTPStatus.BAD_REQUEST, f"the form is malformed: {exc}", run_id, action, form)
            return
        store = self.dashboard.store
        if "application/json" in self.headers.get("Accept", ""):
            self._json(HTTPStatus.OK, run_json(store.get_run(shown), store.now()))
            return
        done = self.dashboard.put_flash(_confirmation(action, run_id, shown, form))
        back = "/inbox" if form.get("back") == "inbox" else run_path(shown)
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", f"{back}?done={done}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _refused_form(
        self, status: HTTPStatus, message: str, run_id: str, action: str, form: dict[str, str]
    ) -> None:
        """A refused action: JSON for a program; for a person, the page the form was on, drawn
        again with the error and what they typed (the token aside: a page never holds it)."""
        if self._wants_json():
            self._error(status, message)
            return
        store = self.dashboard.store
        typed = Typed(run_id, action, {k: v for k, v in form.items() if k != "token"})
        try:
            if form.get("back") == "inbox":
                body = inbox_page(store, store.now(), error=message, typed=typed)
            else:
                ledger = store.load_ledger(run_id)
                events = store.events(run_id)
                body = run_page(store, ledger, events, store.now(), error=message, typed=typed)
        except SafepointError:
            self._error(status, message)
            return
        self._html(status, body)

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
        # The console's own script and style sheet only: no inline script, nothing from
        # another origin, never framed by another site.
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
            " img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
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
            answer = {"error": message, "status": status.value}
            self._send(status, json.dumps(answer, indent=2).encode(), "application/json", headers)
        else:
            self._send(
                status,
                error_page(f"{status.value} {status.phrase}", message).encode(),
                "text/html; charset=utf-8",
                headers,
            )


_DONE = {
    "cancel": "Cancel asked for {run}: its worker settles what is in flight, then it ends.",
    "resolve": "Resolved {run} ({how}): a worker (or a resume) carries it on.",
    "approve": "Approved the payload of {run}: a worker (or a resume) dispatches it.",
    "revoke": "Revoked the approval in {run}.",
    "limits": "Raised the limits of {run}: a worker (or a resume) carries it on.",
    "fork": "Forked {run} as {shown}.",
    "retry": "Retrying {run} from its failed step: a worker (or a resume) carries it on.",
    "send": "Sent the message to {run}.",
    "answer": "Answered the wait of {run}.",
}


def _confirmation(action: str, run_id: str, shown: str, form: dict[str, str]) -> str:
    """What the page an action redirects to confirms."""
    how = form.get("action", "").replace("_", " ")
    return _DONE.get(action, "Done: {action} on {run}.").format(
        run=run_id, shown=shown, how=how, action=action
    )
