"""The fake model server: a ``ThreadingHTTPServer`` on loopback that answers each request from
the script, in the wire format of the API asked, and injects the faults a test arms."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

from ..._rules.canonical import decode_json
from ...errors import UsageError
from ._anthropic import AnthropicMessages
from ._openai_chat import ChatCompletions
from ._openai_responses import Responses
from ._script import APIS, FakeRequest, Turn
from ._wire import JSON, Ids, Refused, ScriptProblem, WireApi, digest

Script = Sequence[Turn] | Callable[[FakeRequest], Turn]


@dataclass
class _Fault:
    """One armed fault: ``kind`` fires on the next ``remaining`` requests (``None``: every one)
    that match ``api`` and ``turn`` (and, to cut one, that stream)."""

    kind: Literal["fail", "drop", "cut", "slow"]
    remaining: int | None
    api: str | None
    turn: int | None
    status: int = 500
    retry_after: float | None = None
    message: str | None = None
    after_events: int = 0
    seconds: float = 0.0

    def matches(self, request: FakeRequest) -> bool:
        return (
            self.remaining != 0
            and self.api in (None, request.api)
            and self.turn in (None, request.turn)
            and (self.kind != "cut" or request.stream)
        )

    def spend(self) -> _Fault:
        if self.remaining is not None:
            self.remaining -= 1
        return self


class FakeModelServer:
    """A fake of the Anthropic Messages, OpenAI Chat Completions and OpenAI Responses APIs on
    ``127.0.0.1``, for the real SDK clients pointed at it with ``base_url`` (``url`` for
    Anthropic, ``openai_url`` for OpenAI), JSON and streams alike.

    ``script`` answers each request: a list of ``Turn`` indexed by the request's ``turn`` (the
    number of assistant turns already in its history), or a callable ``(FakeRequest) -> Turn``.
    The fake is stateless on purpose — the same request gets the same reply, its ids derived
    from the body's digest — so a run resumed after a crash sees what it would have seen;
    ``ids="fresh"`` mints new ids (and the clock's time) for every reply, as a real API does.

    Every request is logged (``requests``); one whose tool calls and results do not pair up is
    answered 400 as the real API answers it, and logged in ``orphans`` too. A script that
    cannot answer (no such turn, a callable that raised) is answered 500 and noted in
    ``problems``; leaving the ``with`` block then raises ``UsageError`` naming them.
    """

    def __init__(self, script: Script, *, ids: Literal["derived", "fresh"] = "derived") -> None:
        if not callable(script):
            if isinstance(script, str | bytes) or not isinstance(script, Sequence):
                raise UsageError("the script is a list of Turn or a callable (FakeRequest) -> Turn")
            wrong = [t for t in script if not isinstance(t, Turn)]
            if wrong:
                raise UsageError(f"a script holds Turn values (Turn.text(...), ...), not {wrong[0]!r}")
        if ids not in ("derived", "fresh"):
            raise UsageError(f"ids is 'derived' or 'fresh', not {ids!r}")
        self._script = script
        self._fresh = ids == "fresh"
        self._responses = Responses()
        self._apis: dict[str, WireApi] = {
            api.path: api for api in (AnthropicMessages(), ChatCompletions(), self._responses)
        }
        self._lock = threading.Lock()
        self._requests: list[FakeRequest] = []
        self._orphans: list[FakeRequest] = []
        self._problems: list[str] = []
        self._faults: list[_Fault] = []
        self._callbacks: list[Callable[[FakeRequest], object]] = []
        self._connections: set[socket.socket] = set()
        self._closing = threading.Event()
        self._http: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----

    def start(self) -> FakeModelServer:
        """Listen on a free port of 127.0.0.1 and answer in a background thread."""
        if self._http is not None:
            raise UsageError("this FakeModelServer is already started")
        self._closing.clear()
        self._http = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._http.fake = self
        # a short poll: close() waits for the loop to notice, and a test closes a server often
        serve = functools.partial(self._http.serve_forever, poll_interval=0.01)
        self._thread = threading.Thread(target=serve, name="fake-models", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering and close every connection (a request in a ``slow`` wait ends now)."""
        if self._http is None:
            return
        self._closing.set()
        self._http.shutdown()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):  # the client closed it first
                connection.shutdown(socket.SHUT_RDWR)
        self._http.server_close()
        if self._thread is not None:
            self._thread.join()
        self._http = self._thread = None

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        if kind is None and self._problems:
            raise UsageError("the fake model server's script could not answer: " + "; ".join(self._problems))

    @property
    def url(self) -> str:
        """The base URL for ``Anthropic(base_url=...)``: ``http://127.0.0.1:<port>``."""
        if self._http is None:
            raise UsageError("start the FakeModelServer first (`with FakeModelServer(script) as fake:`)")
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """The base URL for ``OpenAI(base_url=...)``: ``url + "/v1"``."""
        return self.url + "/v1"

    # ---- what it saw ----

    @property
    def requests(self) -> list[FakeRequest]:
        """Every request received, in arrival order (faulted, refused and dropped ones too)."""
        with self._lock:
            return list(self._requests)

    @property
    def orphans(self) -> list[FakeRequest]:
        """The requests refused with 400 because a tool call had no result (or a result no call)."""
        with self._lock:
            return list(self._orphans)

    @property
    def problems(self) -> list[str]:
        """What the script could not answer, one line per request answered 500 for it."""
        with self._lock:
            return list(self._problems)

    def requests_per_turn(self, api: str | None = None) -> dict[int, int]:
        """How many requests asked for each turn (of ``api`` only, when given)."""
        return dict(sorted(Counter(r.turn for r in self.requests if api in (None, r.api)).items()))

    def repeated(self) -> list[FakeRequest]:
        """The requests whose body was seen before: a retry, or a question asked again after a crash."""
        seen: set[str] = set()
        again = []
        for request in self.requests:
            if request.digest in seen:
                again.append(request)
            seen.add(request.digest)
        return again

    def reset(self) -> None:
        """Forget everything but the script: the log, the faults, the callbacks, stored responses."""
        with self._lock:
            for log in (self._requests, self._orphans, self._problems, self._faults, self._callbacks):
                log.clear()
        self._responses.forget()

    # ---- faults ----

    def fail(
        self,
        status: int = 429,
        *,
        retry_after: float | None = 1.0,
        times: int | None = 1,
        api: str | None = None,
        turn: int | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status`` (429, 500, 529, …), the
        API's error body (``message``, or the API's own words) and, unless ``None``, a
        ``retry-after`` of ``retry_after`` seconds (also as ``retry-after-ms``)."""
        if not 400 <= status <= 599:
            raise UsageError(f"fail() answers an error status (400-599), not {status}")
        self._arm(_Fault("fail", times, api, turn, status=status, retry_after=retry_after, message=message))

    def drop(self, *, times: int | None = 1, api: str | None = None, turn: int | None = None) -> None:
        """Generate the reply to the next ``times`` matching requests (each is logged, and its
        ids minted), then close the connection without a byte of response: a reply lost in
        flight, after the model did the work."""
        self._arm(_Fault("drop", times, api, turn))

    def cut_stream(
        self, after_events: int = 2, *, times: int | None = 1, api: str | None = None, turn: int | None = None
    ) -> None:
        """Cut the next ``times`` matching streamed replies after ``after_events`` events (pings
        count), half-way through the next one; the body never ends properly, so the SDK raises."""
        if after_events < 0:
            raise UsageError(f"after_events counts events sent before the cut, not {after_events}")
        self._arm(_Fault("cut", times, api, turn, after_events=after_events))

    def slow(
        self, seconds: float, *, times: int | None = None, api: str | None = None, turn: int | None = None
    ) -> None:
        """Wait ``seconds`` before answering each matching request (the next ``times`` of them;
        ``None``: all), e.g. to run into a client's timeout."""
        if seconds < 0:
            raise UsageError(f"slow() waits a number of seconds, not {seconds}")
        self._arm(_Fault("slow", times, api, turn, seconds=seconds))

    def on_request(self, callback: Callable[[FakeRequest], object]) -> Callable[[FakeRequest], object]:
        """Call ``callback(request)`` for each request once it is logged, before it is answered
        (in the server's thread): e.g. to SIGKILL the process under test while its model call
        is in flight. A callback that raises has the request answered 500. Usable as a decorator."""
        with self._lock:
            self._callbacks.append(callback)
        return callback

    def _arm(self, fault: _Fault) -> None:
        if fault.api is not None and fault.api not in APIS:
            raise UsageError(f"api is one of {', '.join(APIS)}, not {fault.api!r}")
        if fault.remaining is not None and fault.remaining < 1:
            raise UsageError(f"times counts requests (1 or more, or None for all), not {fault.remaining}")
        with self._lock:
            self._faults.append(fault)

    def _faults_for(self, request: FakeRequest) -> tuple[float, _Fault | None]:
        """The wait before answering, and the one fault (fail, drop or cut) the answer takes."""
        with self._lock:
            slow = next((f for f in self._faults if f.kind == "slow" and f.matches(request)), None)
            fault = next((f for f in self._faults if f.kind != "slow" and f.matches(request)), None)
            return (slow.spend().seconds if slow else 0.0), (fault.spend() if fault else None)

    # ---- answering ----

    def _turn_for(self, request: FakeRequest) -> Turn:
        if callable(self._script):
            turn = self._script(request)
            if not isinstance(turn, Turn):
                raise ScriptProblem(f"the script returned {turn!r} for turn {request.turn}, not a Turn")
            return turn
        if request.turn >= len(self._script):
            has = len(self._script)
            raise ScriptProblem(
                f"the script has no turn {request.turn} (it has {has}) to answer this {request.api} request"
            )
        return self._script[request.turn]

    def _answer(self, handler: _Handler) -> None:
        path = urlsplit(handler.path).path
        raw = handler.rfile.read(int(handler.headers.get("content-length") or 0))
        api = self._apis.get(path) if handler.command == "POST" else None
        if api is None:
            shape = self._apis["/v1/messages" if "anthropic-version" in handler.headers else "/v1/responses"]
            message = f"Unknown request URL: {handler.command} {path}."
            _send_json(handler, 404, shape.error(404, message, request_id="req_unknown"), ())
            return
        try:
            body = decode_json(raw)
            # Its digest is the body written again, a little deeper than it was read: a body at
            # the edge of what decodes is refused here too, as one that does not decode.
            request = (
                FakeRequest(
                    api.name,
                    handler.path,
                    {name.lower(): value for name, value in handler.headers.items()},
                    body,
                    api.turn_of(body),
                    digest(body),
                )
                if isinstance(body, dict)
                else None
            )
        except (ValueError, RecursionError):
            request = None
        if request is None:
            ids_of_error = Ids(digest(raw.decode(errors="replace")), fresh=self._fresh)
            error = api.error(
                400, "The request body is not a JSON object.", request_id=api.request_id(ids_of_error)
            )
            _send_json(handler, 400, error, ())
            return
        self._respond(handler, api, request)

    def _respond(self, handler: _Handler, api: WireApi, request: FakeRequest) -> None:
        body: JSON = dict(request.body)
        ids = Ids(request.digest, fresh=self._fresh)
        request_id = api.request_id(ids)
        headers = ((api.request_id_header, request_id),)
        with self._lock:
            self._requests.append(request)
            callbacks = list(self._callbacks)
        try:
            for callback in callbacks:
                callback(request)
        except Exception as exc:
            self._fail_script(handler, api, request_id, f"on_request callback raised {exc!r}")
            return
        try:
            api.check(body)
        except Refused as refused:
            if refused.orphan:
                with self._lock:
                    self._orphans.append(request)
            error = api.error(400, refused.message, request_id=request_id, param=refused.param)
            _send_json(handler, 400, error, headers)
            return
        wait, fault = self._faults_for(request)
        if wait and self._closing.wait(wait):
            handler.close_connection = True
            return
        if fault is not None and fault.kind == "fail":
            error = api.error(fault.status, fault.message, request_id=request_id)
            _send_json(handler, fault.status, error, headers + _retry_after(fault.retry_after))
            return
        try:
            reply = api.render(body, self._turn_for(request), ids)
        except ScriptProblem as problem:
            self._fail_script(handler, api, request_id, str(problem))
            return
        except Exception as exc:
            self._fail_script(handler, api, request_id, f"the script raised {exc!r} for turn {request.turn}")
            return
        if fault is not None and fault.kind == "drop":
            handler.close_connection = True
        elif request.stream:
            cut = fault.after_events if fault is not None and fault.kind == "cut" else None
            _send_stream(handler, api.frames(body, reply), headers, cut)
        else:
            _send_json(handler, 200, reply, headers)

    def _fail_script(self, handler: _Handler, api: WireApi, request_id: str, problem: str) -> None:
        with self._lock:
            self._problems.append(problem)
        error = api.error(500, f"fake model server: {problem}", request_id=request_id)
        # no retry: the script will not answer better a second time
        _send_json(handler, 500, error, ((api.request_id_header, request_id), ("x-should-retry", "false")))

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)


def _retry_after(seconds: float | None) -> tuple[tuple[str, str], ...]:
    if seconds is None:
        return ()
    # whole seconds in the standard header, as the APIs send it; the exact wait in milliseconds
    return (("retry-after", str(math.ceil(seconds))), ("retry-after-ms", str(round(seconds * 1000))))


def _send_json(
    handler: BaseHTTPRequestHandler, status: int, body: JSON, headers: tuple[tuple[str, str], ...]
) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def _send_stream(
    handler: BaseHTTPRequestHandler,
    frames: list[bytes],
    headers: tuple[tuple[str, str], ...],
    cut: int | None,
) -> None:
    """Send ``frames`` as a chunked ``text/event-stream``; ``cut``: after that many frames, send
    half of the next one's chunk and close — a body that never ends, as a dropped link leaves it."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Transfer-Encoding", "chunked")
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    sent = frames if cut is None else frames[:cut]
    for frame in sent:
        handler.wfile.write(f"{len(frame):X}\r\n".encode() + frame + b"\r\n")
    if cut is None:
        handler.wfile.write(b"0\r\n\r\n")
        return
    if cut < len(frames):
        frame = frames[cut]
        handler.wfile.write(f"{len(frame):X}\r\n".encode() + frame[: len(frame) // 2])
    handler.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (its timeout, a test that is done) is no error of the fake's."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams, as the SDKs' pools expect
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.fake._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._closed(self.connection)

    def do_POST(self) -> None:
        try:
            self.server.fake._answer(self)
        except OSError:
            self.close_connection = True  # the client went away mid-answer

    do_GET = do_POST
    do_DELETE = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the fake's log is ``FakeModelServer.requests``."""
