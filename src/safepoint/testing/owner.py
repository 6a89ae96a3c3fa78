"""A local effect-owner service for kill tests and reconciliation tests.

safepoint never repeats a side effect blindly after a crash: it asks the
system that *owns* the effect (a payment provider, a ticket tracker, ...)
whether the effect already happened. Testing that honestly needs an owner
that behaves like a real one, including the parts that make recovery hard,
and that survives the death of the process under test. This module provides
one, stdlib only:

* a small HTTP service, run as its own OS process
  (``python -m safepoint.testing.owner --port 0``), with Stripe-like
  idempotency keys on ``charges``, ``refunds`` and ``tickets``; a
  ``notifications`` resource with no read path at all; an eventually
  consistent search index; optional fencing tokens; and injectable faults
  (lost responses, outages, declines kept under their key, delays, index
  lag);
* :class:`OwnerClient`, which maps every failure onto what it means for
  recovery: rejected (definitely not applied), unavailable (definitely not
  applied) or connection lost (outcome unknown -- reconcile before retrying);
* :class:`OwnerService`, a context manager that starts and stops the process.

``GET /stats`` counts objects created and *duplicates* (the same side effect
applied twice), which is how tests prove that a crash did not double-charge.

Faithfulness matters more than convenience here: idempotency keys are pruned
after a retention window and reusing one afterwards creates a second object,
exactly the documented behaviour of real providers that makes "just retry
with the same key" unsafe after a long outage.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Final
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = [
    "IDEMPOTENT_RESOURCES",
    "NO_READ_PATH_RESOURCES",
    "OwnerClient",
    "OwnerConnectionLost",
    "OwnerError",
    "OwnerRejected",
    "OwnerService",
    "OwnerUnavailable",
    "main",
]

JSONObject = dict[str, Any]

#: Resources with idempotency keys and read paths, mapped to their id prefix.
IDEMPOTENT_RESOURCES: Final[dict[str, str]] = {"charges": "ch", "refunds": "re", "tickets": "tk"}
#: Resources that can be written but never read back (nothing to reconcile against).
NO_READ_PATH_RESOURCES: Final[dict[str, str]] = {"notifications": "nt"}
_ALL_RESOURCES: Final[dict[str, str]] = {**IDEMPOTENT_RESOURCES, **NO_READ_PATH_RESOURCES}
# Fields the service sets itself; accepting them from the caller would let a
# request forge an id or a key, so such bodies are refused.
_RESERVED_FIELDS: Final[frozenset[str]] = frozenset({"id", "object", "created", "idempotency_key"})
_KEY_REUSE_MESSAGE: Final[str] = (
    "Keys for idempotent requests can only be used with the same parameters they were first used with."
)
_LISTENING_PREFIX: Final[str] = "listening on "
_DECLINED: Final[int] = 402  # the "decline" fault's answer: the owner refused, nothing applied


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _error(error_type: str, message: str | None = None) -> JSONObject:
    err: JSONObject = {"type": error_type}
    if message is not None:
        err["message"] = message
    return {"error": err}


# ---- Server side ----


@dataclass
class _Faults:
    drop_after_commit: int = 0
    fail_before_commit: int = 0
    decline: int = 0
    delay: float = 0.0
    index_lag: float = 0.0


@dataclass
class _KeyRecord:
    digest: str
    response: JSONObject
    first_seen: float  # time.monotonic(), immune to wall-clock jumps
    status: int = 201  # what was answered under the key: a refusal is answered again too


@dataclass
class _Stored:
    obj: JSONObject
    visible_at: float  # monotonic instant from which the search index shows it


@dataclass
class _Reply:
    status: int
    body: JSONObject
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False  # close the connection instead of answering


class _OwnerState:
    """All service state; every public method takes the lock."""

    def __init__(self, key_retention: float, index_lag: float) -> None:
        self._lock = threading.Lock()
        self._key_retention = key_retention
        self._configured_index_lag = index_lag
        self._clear()

    def _clear(self) -> None:
        self._objects: dict[str, dict[str, _Stored]] = {r: {} for r in _ALL_RESOURCES}
        # Keys are scoped per resource, so one step may use the same key for
        # a charge and a ticket without a spurious conflict.
        self._keys: dict[tuple[str, str], _KeyRecord] = {}
        self._counters: dict[str, int] = {r: 0 for r in _ALL_RESOURCES}
        self._fingerprints: set[tuple[str, str]] = set()
        self._duplicates = 0
        self._fences: dict[str, int] = {}
        self._stale_refused = 0
        self._faults = _Faults(index_lag=self._configured_index_lag)

    def reset(self) -> None:
        with self._lock:
            self._clear()

    def faults(self) -> JSONObject:
        with self._lock:
            return asdict(self._faults)

    def set_faults(self, changes: Any) -> _Reply:
        if not isinstance(changes, dict):
            return _Reply(400, _error("invalid_request_error", "faults must be a JSON object"))
        counts = {"drop_after_commit", "fail_before_commit", "decline"}
        seconds = {"delay", "index_lag"}
        for name, value in changes.items():
            if name not in counts | seconds:
                return _Reply(400, _error("invalid_request_error", f"unknown fault {name!r}"))
            # bool is an int subclass; "true" as a count is a caller bug.
            valid_type = int if name in counts else (int, float)
            if isinstance(value, bool) or not isinstance(value, valid_type) or value < 0:
                return _Reply(400, _error("invalid_request_error", f"bad value for {name!r}"))
        with self._lock:
            for name, value in changes.items():
                setattr(self._faults, name, value if name in counts else float(value))
            return _Reply(200, asdict(self._faults))

    def current_delay(self) -> float:
        with self._lock:
            return self._faults.delay

    def stats(self) -> JSONObject:
        with self._lock:
            by_resource = {r: len(objs) for r, objs in self._objects.items()}
            return {
                "applied": sum(by_resource.values()),
                "by_resource": by_resource,
                "duplicates": self._duplicates,
                "highest_fence": dict(self._fences),
                "stale_fence_refused": self._stale_refused,
            }

    def get(self, resource: str, object_id: str) -> _Reply:
        with self._lock:
            stored = self._objects[resource].get(object_id)
            if stored is None:
                return _Reply(404, _error("resource_missing", f"No such {resource}: {object_id!r}"))
            return _Reply(200, dict(stored.obj))

    def search(self, resource: str, key: str | None) -> _Reply:
        now = time.monotonic()
        with self._lock:
            data = [
                dict(s.obj)
                for s in self._objects[resource].values()
                if s.visible_at <= now and (key is None or s.obj.get("idempotency_key") == key)
            ]
        return _Reply(200, {"data": data})

    def mutate(
        self,
        resource: str,
        raw_body: bytes,
        key: str | None,
        fence_token: str | None,
        fence_resource: str | None,
    ) -> _Reply:
        with self._lock:
            faults = self._faults
            if faults.fail_before_commit > 0:
                faults.fail_before_commit -= 1
                return _Reply(503, _error("service_unavailable", "injected failure before commit"))
            try:
                params = json.loads(raw_body.decode("utf-8"))
                # Written again for its digest, a little deeper than it was read: a body at
                # the edge of what decodes is refused as one nested deeper.
                digest = _canonical(params)
            except (UnicodeDecodeError, ValueError, RecursionError):
                params = None
            if not isinstance(params, dict):
                return _Reply(400, _error("invalid_request_error", "body must be a JSON object"))
            reserved = sorted(_RESERVED_FIELDS & params.keys())
            if reserved:
                return _Reply(400, _error("invalid_request_error", f"reserved fields: {reserved}"))

            fence: tuple[str, int] | None = None
            if (fence_token is None) != (fence_resource is None):
                return _Reply(
                    400, _error("invalid_request_error", "Fence-Token and Fence-Resource go together")
                )
            if fence_token is not None and fence_resource is not None:
                try:
                    fence = (fence_resource, int(fence_token))
                except ValueError:
                    return _Reply(400, _error("invalid_request_error", "Fence-Token must be an integer"))
                highest = self._fences.get(fence[0])
                if highest is not None and fence[1] < highest:
                    # A newer holder of the lease has written: this writer is a zombie.
                    self._stale_refused += 1
                    return _Reply(409, _error("stale_fence", f"token {fence[1]} < highest {highest}"))

            now = time.monotonic()
            if resource in NO_READ_PATH_RESOURCES:
                key = None  # fire-and-forget: keys are ignored entirely
            else:
                self._prune_keys(now)
            if key is not None:
                record = self._keys.get((resource, key))
                if record is not None:
                    if record.digest != digest:
                        return _Reply(409, _error("idempotency_error", _KEY_REUSE_MESSAGE))
                    replayed = (("Idempotent-Replayed", "true"),)
                    if record.status == _DECLINED:  # as Stripe keeps a declined request's answer
                        return _Reply(_DECLINED, dict(record.response), replayed)
                    self._accept_fence(fence)
                    return _Reply(200, dict(record.response), replayed, drop=self._take_drop())
            if faults.decline > 0:
                # A definite refusal, nothing applied — kept under its key, which answers it
                # again: only a request under another key can be accepted.
                faults.decline -= 1
                refusal = _error("card_error", "injected decline: nothing was applied")
                if key is not None:
                    self._keys[(resource, key)] = _KeyRecord(digest, refusal, now, _DECLINED)
                return _Reply(_DECLINED, refusal)

            obj = self._create(resource, params, key, now)
            if key is not None:
                self._keys[(resource, key)] = _KeyRecord(digest, dict(obj), now)
            self._accept_fence(fence)
            return _Reply(201, dict(obj), drop=self._take_drop())

    # The helpers below run with the lock held.

    def _prune_keys(self, now: float) -> None:
        expired = [k for k, r in self._keys.items() if now - r.first_seen > self._key_retention]
        for k in expired:
            del self._keys[k]

    def _accept_fence(self, fence: tuple[str, int] | None) -> None:
        if fence is not None:
            self._fences[fence[0]] = max(fence[1], self._fences.get(fence[0], fence[1]))

    def _take_drop(self) -> bool:
        if self._faults.drop_after_commit > 0:
            self._faults.drop_after_commit -= 1
            return True
        return False

    def _create(self, resource: str, params: JSONObject, key: str | None, now: float) -> JSONObject:
        self._counters[resource] += 1
        obj: JSONObject = {
            "id": f"{_ALL_RESOURCES[resource]}_{self._counters[resource]}",
            "object": resource,
            "created": int(time.time() * 1000),
        }
        if resource not in NO_READ_PATH_RESOURCES:
            obj["idempotency_key"] = key
        obj.update(params)
        # The idempotency key is bookkeeping, not part of the effect: the
        # same charge made under two keys is still a double charge.
        fingerprint = (resource, _canonical(params))
        if fingerprint in self._fingerprints:
            self._duplicates += 1
        self._fingerprints.add(fingerprint)
        self._objects[resource][obj["id"]] = _Stored(obj, now + self._faults.index_lag)
        return obj


class _OwnerHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a request stuck in an injected delay must not block exit

    def __init__(self, port: int, state: _OwnerState) -> None:
        super().__init__(("127.0.0.1", port), _OwnerHandler)
        self.state = state


class _OwnerHandler(BaseHTTPRequestHandler):
    server: _OwnerHTTPServer
    # Connections may be kept alive, as real owners allow (every reply has a Content-Length);
    # the owner client still opens one per request, a pooled client keeps one.
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a reply's headers and body go out as two writes

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests run many requests; per-request logging is noise

    def _send(self, reply: _Reply) -> None:
        data = json.dumps(reply.body).encode("utf-8")
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _segments(self) -> tuple[list[str], dict[str, list[str]]]:
        parts = urlsplit(self.path)
        segments = [unquote(s) for s in parts.path.strip("/").split("/") if s]
        return segments, parse_qs(parts.query)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        # Read it all even if unused: unread bytes make the kernel answer
        # close() with a reset, which would blur "dropped after commit".
        return self.rfile.read(length) if length > 0 else b""

    def do_GET(self) -> None:
        state = self.server.state
        segments, query = self._segments()
        if segments == ["health"]:
            return self._send(_Reply(200, {"ok": True}))
        if segments == ["stats"]:
            return self._send(_Reply(200, state.stats()))
        if segments == ["_faults"]:
            return self._send(_Reply(200, state.faults()))
        if segments and segments[0] in NO_READ_PATH_RESOURCES:
            return self._send(_Reply(404, _error("no_read_path", f"{segments[0]} cannot be read back")))
        if len(segments) == 1 and segments[0] in IDEMPOTENT_RESOURCES:
            keys = query.get("idempotency_key")
            return self._send(state.search(segments[0], keys[0] if keys else None))
        if len(segments) == 2 and segments[0] in IDEMPOTENT_RESOURCES:
            return self._send(state.get(segments[0], segments[1]))
        return self._send(_Reply(404, _error("not_found", f"no route for GET {self.path}")))

    def do_POST(self) -> None:
        state = self.server.state
        segments, _ = self._segments()
        body = self._read_body()
        if segments == ["_reset"]:
            state.reset()
            return self._send(_Reply(200, {"ok": True}))
        if segments == ["_faults"]:
            try:
                changes = json.loads(body.decode("utf-8")) if body else {}
            except (UnicodeDecodeError, ValueError, RecursionError):
                changes = None
            return self._send(state.set_faults(changes))
        if len(segments) != 1 or segments[0] not in _ALL_RESOURCES:
            return self._send(_Reply(404, _error("not_found", f"no route for POST {self.path}")))
        delay = state.current_delay()
        if delay > 0:
            time.sleep(delay)  # outside the lock: a slow owner is not a stalled one
        reply = state.mutate(
            segments[0],
            body,
            self.headers.get("Idempotency-Key"),
            self.headers.get("Fence-Token"),
            self.headers.get("Fence-Resource"),
        )
        if reply.drop:
            # Committed, but the answer is lost: the caller cannot tell
            # whether the effect happened, which is what it must reconcile.
            self.close_connection = True
            return None
        return self._send(reply)


def main(argv: list[str] | None = None) -> int:
    """Run the service until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m safepoint.testing.owner",
        description="Local effect-owner service for safepoint tests.",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 picks a free one)")
    parser.add_argument(
        "--key-retention", type=float, default=86400.0, help="seconds an idempotency key is remembered"
    )
    parser.add_argument(
        "--index-lag", type=float, default=0.0, help="seconds before a new object is visible to search by key"
    )
    args = parser.parse_args(argv)

    server = _OwnerHTTPServer(args.port, _OwnerState(args.key_retention, args.index_lag))

    def _stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, so it cannot run on
        # the main thread, which is the one serving.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"{_LISTENING_PREFIX}http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


# ---- Client side ----


class OwnerError(Exception):
    """Base class; raised as such for an unexpected status (outcome unknown)."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def error_type(self) -> str | None:
        """The service's ``error.type`` (e.g. ``"stale_fence"``), if any."""
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            value = self.body["error"].get("type")
            return value if isinstance(value, str) else None
        return None


class OwnerRejected(OwnerError):
    """A definitive 4xx answer: the request was NOT applied."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"owner rejected the request: HTTP {status} {body!r}", status=status, body=body)


class OwnerUnavailable(OwnerError):
    """503, or no connection at all: the request was provably NOT applied."""


class OwnerConnectionLost(OwnerError):
    """The request was sent but no answer came back: the outcome is UNKNOWN."""


class OwnerClient:
    """Minimal client for the owner service: one connection per request, or with
    ``keep_alive`` one kept per thread, as an application's pooled HTTP client keeps them.

    Kept alive, a request that fails on a connection used before is *connection lost*, never
    *unavailable*: the owner may have read it before the connection broke. Only a connection
    that could not be opened proves that nothing was sent.
    """

    def __init__(self, base_url: str, timeout: float = 10.0, *, keep_alive: bool = False) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.keep_alive = keep_alive
        self._kept = threading.local()
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")

    def _open(self) -> http.client.HTTPConnection:
        """The thread's kept connection, or a new one — connected separately, which is what
        lets us tell "never left" from "left and vanished": only the second needs
        reconciliation."""
        kept: http.client.HTTPConnection | None = getattr(self._kept, "conn", None)
        if kept is not None:
            return kept
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            raise OwnerUnavailable(f"cannot connect to {self.base_url}: {exc!r}") from exc
        return conn

    def _request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode("utf-8")
        all_headers = {"Accept": "application/json", **(headers or {})}
        if payload is not None:
            all_headers["Content-Type"] = "application/json"
        conn = self._open()
        self._kept.conn = None  # given back below only once this exchange went through
        try:
            conn.request(method, self._prefix + path, body=payload, headers=all_headers)
            response = conn.getresponse()
            raw = response.read()
        except (http.client.HTTPException, OSError) as exc:
            conn.close()
            # Includes timeouts: the owner may still be committing.
            raise OwnerConnectionLost(
                f"{method} {path}: connection lost after sending, outcome unknown: {exc!r}"
            ) from exc
        if self.keep_alive and not response.will_close:
            self._kept.conn = conn
        else:
            conn.close()
        try:
            decoded: Any = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            decoded = {"raw": raw.decode("utf-8", "replace")}
        return response.status, decoded

    @staticmethod
    def _check(method: str, path: str, status: int, body: Any) -> None:
        if 200 <= status < 300:
            return
        if status == 503:
            raise OwnerUnavailable(f"{method} {path}: HTTP 503 {body!r}", status=status, body=body)
        if 400 <= status < 500:
            raise OwnerRejected(status, body)
        raise OwnerError(f"{method} {path}: unexpected HTTP {status} {body!r}", status=status, body=body)

    def _call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        status, decoded = self._request(method, path, body, headers)
        self._check(method, path, status, decoded)
        return decoded

    def create(
        self,
        resource: str,
        params: JSONObject,
        *,
        idempotency_key: str | None = None,
        fence: int | None = None,
        fence_resource: str | None = None,
    ) -> JSONObject:
        """Create an object; returns it (fresh, or replayed for a known key).

        ``fence_resource`` defaults to ``resource`` when ``fence`` is given.
        """
        headers: dict[str, str] = {}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if fence is not None:
            headers["Fence-Token"] = str(fence)
            headers["Fence-Resource"] = fence_resource if fence_resource is not None else resource
        elif fence_resource is not None:
            raise ValueError("fence_resource given without fence")
        result: JSONObject = self._call("POST", "/" + quote(resource, safe=""), params, headers)
        return result

    def get(self, resource: str, object_id: str) -> JSONObject | None:
        """Read by id (always consistent); None if there is no such object."""
        path = f"/{quote(resource, safe='')}/{quote(object_id, safe='')}"
        status, body = self._request("GET", path)
        if status == 404 and OwnerRejected(status, body).error_type == "resource_missing":
            return None
        self._check("GET", path, status, body)
        result: JSONObject = body
        return result

    def find_all_by_key(self, resource: str, key: str) -> list[JSONObject]:
        """Search by idempotency key; subject to index lag, oldest first."""
        body = self._call("GET", f"/{quote(resource, safe='')}?idempotency_key={quote(key, safe='')}")
        data: list[JSONObject] = body["data"]
        return data

    def find_by_key(self, resource: str, key: str) -> JSONObject | None:
        """The oldest object created under ``key`` that search can see, or None."""
        found = self.find_all_by_key(resource, key)
        return found[0] if found else None

    def stats(self) -> JSONObject:
        result: JSONObject = self._call("GET", "/stats")
        return result

    def set_faults(self, **faults: int | float) -> JSONObject:
        """Replace the named faults; returns all current faults."""
        result: JSONObject = self._call("POST", "/_faults", dict(faults))
        return result

    def faults(self) -> JSONObject:
        result: JSONObject = self._call("GET", "/_faults")
        return result

    def reset(self) -> None:
        self._call("POST", "/_reset", {})

    def health(self) -> bool:
        try:
            body = self._call("GET", "/health")
        except OwnerError:
            return False
        return isinstance(body, dict) and body.get("ok") is True


# ---- Process manager ----

# owner.py -> testing/ -> safepoint/ -> the directory holding the package.
_PACKAGE_PARENT: Final[str] = str(Path(__file__).resolve().parents[2])


class OwnerService:
    """Run the owner service as a real subprocess, so it outlives kills of the code under test.

    ``url`` and ``client`` stay readable after ``stop()`` (handy for testing
    a dead port); ``start()`` may be called again after ``stop()``.
    """

    def __init__(
        self, key_retention: float = 86400.0, index_lag: float = 0.0, *, startup_timeout: float = 10.0
    ) -> None:
        self.key_retention = key_retention
        self.index_lag = index_lag
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[bytes] | None = None
        self._url: str | None = None
        self._client: OwnerClient | None = None
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("OwnerService has not been started")
        return self._url

    @property
    def client(self) -> OwnerClient:
        if self._client is None:
            raise RuntimeError("OwnerService has not been started")
        return self._client

    def start(self) -> OwnerService:
        if self._process is not None:
            raise RuntimeError("OwnerService is already running")
        env = dict(os.environ)
        existing = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + existing if existing else "")
        command = [
            sys.executable,
            "-m",
            "safepoint.testing.owner",
            "--port",
            "0",
            "--key-retention",
            repr(float(self.key_retention)),
            "--index-lag",
            repr(float(self.index_lag)),
        ]
        # stderr goes to a file, not a pipe: nobody drains it while the
        # service runs, and it is only read to explain a failed start.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.returncode = None
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True
        )
        try:
            line = self._first_line(self._process)
            if not line.startswith(_LISTENING_PREFIX):
                raise RuntimeError(f"owner service did not start (got {line!r}): {self._stderr_text()}")
        except BaseException:
            self.stop()
            raise
        self._url = line[len(_LISTENING_PREFIX) :].strip()
        self._client = OwnerClient(self._url)
        return self

    def _first_line(self, process: subprocess.Popen[str]) -> str:
        # readline() has no timeout, so it runs on a helper thread; killing
        # the process on timeout closes the pipe and ends that thread.
        lines: queue.Queue[str] = queue.Queue()
        stdout = process.stdout
        assert stdout is not None
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            return lines.get(timeout=self.startup_timeout)
        except queue.Empty:
            raise RuntimeError(
                f"owner service gave no listening line within {self.startup_timeout}s: {self._stderr_text()}"
            ) from None

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace").strip()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; always reaps."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            self.returncode = process.returncode
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> OwnerService:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
