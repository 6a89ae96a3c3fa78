"""Kill-test children forked from a process that has imported the heavy modules once.

A child of a kill trial is a Python interpreter that imports the agent SDK before it does
anything: seconds of CPU each time, most of what a trial costs. A zygote imports them once
(``preload``) and forks each child from there. The child is still a process of its own — its
own pid, killed with SIGKILL, its crash points armed from its environment — that imports the
workflow's own module itself; only the preloaded modules are shared. Share nothing that reads
the environment at import: a child's environment is set after the fork.

Two children of one zygote share its hash seed and anything else fixed at interpreter start;
``KillHarness`` therefore forks a trial's first process and its resumes from two zygotes (two
interpreters), so that what a run recorded is still proved to mean the same in a process that
shares nothing with the one that was killed.

The zygote reads requests (a JSON line each) on its stdin and reports on a pipe of its own: a
child's pid once forked, its exit code (``-signal`` when killed, as ``subprocess`` says it)
once reaped. It exits when its stdin closes: when the process that started it goes.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["ForkedChild", "Zygote", "shared_zygote"]

_REAP_POLL_S = 0.005  # how soon the zygote notices a child ended
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # on every child's path: this safepoint
_zygotes: dict[str, Zygote] = {}  # by role: one at a time (each holds its modules' memory)
_zygotes_lock = threading.Lock()


def shared_zygote(preload: Sequence[str], pythonpath: Sequence[str] = (), role: str = "first") -> Zygote:
    """This process's zygote for ``role`` with these modules imported: started on first use,
    shared, and replaced (the old one closed) when other modules are asked for. Zygotes of two
    roles are two interpreters: their children share nothing, not even the hash seed."""
    key = (tuple(preload), tuple(pythonpath))
    with _zygotes_lock:
        found = _zygotes.get(role)
        if found is not None and (found.key != key or not found.alive()):
            found.close()
            found = None
        if found is None:
            found = _zygotes[role] = Zygote(preload, pythonpath)
        return found


class Zygote:
    """A process that has imported ``preload`` and forks children on request."""

    def __init__(self, preload: Sequence[str], pythonpath: Sequence[str] = ()) -> None:
        self.key = (tuple(preload), tuple(pythonpath))
        self._folder = tempfile.TemporaryDirectory(prefix="safepoint-zygote-")
        reports, writer = os.pipe()
        env = dict(os.environ)
        env.pop("SAFEPOINT_CRASH_AT", None)
        env["PYTHONPATH"] = os.pathsep.join(
            [PACKAGE_PARENT, *pythonpath, *filter(None, [env.get("PYTHONPATH")])]
        )
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from safepoint.testing.zygote import _serve; _serve()",
                str(writer),
                *preload,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            pass_fds=(writer,),
            text=True,
        )
        os.close(writer)
        self._reports = os.fdopen(reports, "r")
        self._lock = threading.Condition()
        self._forked: list[int] = []
        self._ended: dict[int, int] = {}
        self._count = 0
        ready = self._reports.readline()
        if not ready:
            raise UsageError(
                f"the zygote could not import {list(preload)} (its traceback is on stderr):"
                " name in preload= only modules this Python can import"
            )
        threading.Thread(target=self._read, name="safepoint-zygote-reports", daemon=True).start()
        self._closing = weakref.finalize(self, _close, self._process, self._folder)

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """End the zygote (children it forked run on to their end)."""
        self._closing()

    def spawn(self, argv: Sequence[str], env: dict[str, str]) -> ForkedChild:
        """Fork a child that runs ``python -m safepoint.testing.child *argv`` in ``env``."""
        with self._lock:
            self._count += 1
            folder = Path(self._folder.name)
            out, err = folder / f"{self._count}.out", folder / f"{self._count}.err"
            request = {"argv": list(argv), "env": env, "cwd": os.getcwd(), "out": str(out), "err": str(err)}
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            while not self._forked:
                if not self._lock.wait(timeout=30) and not self._forked:
                    raise RuntimeError("the zygote did not fork a child within 30 s")
            pid = self._forked.pop(0)
        return ForkedChild(self, pid, out, err)

    def ended(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit code once it ended (waiting up to ``timeout``), else None."""
        with self._lock:
            self._lock.wait_for(lambda: pid in self._ended or not self.alive(), timeout=timeout)
            return self._ended.get(pid)

    def _read(self) -> None:
        for line in self._reports:
            report = json.loads(line)
            with self._lock:
                if "forked" in report:
                    self._forked.append(int(report["forked"]))
                else:
                    self._ended[int(report["ended"])] = int(report["returncode"])
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()


class ForkedChild:
    """The part of ``subprocess.Popen`` a kill test uses, for a child a zygote forked."""

    def __init__(self, parent: Zygote, pid: int, out: Path, err: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._parent, self._out, self._err = parent, out, err

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._parent.ended(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._parent.ended(self.pid, timeout=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the zygote has reaped: it may be another's now
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        texts = tuple(path.read_text("utf-8", errors="replace") for path in (self._out, self._err))
        for path in (self._out, self._err):
            path.unlink(missing_ok=True)
        return texts[0], texts[1]


def _close(process: subprocess.Popen[str], folder: tempfile.TemporaryDirectory[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()  # the zygote exits at the end of its input
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    folder.cleanup()


# -- the zygote's side --------------------------------------------------------------------------


def _serve() -> None:
    """The zygote: import the modules named on the command line, then fork on request."""
    reports = os.fdopen(int(sys.argv[1]), "w")
    for name in sys.argv[2:]:
        importlib.import_module(name)
    import safepoint.testing.child  # noqa: F401  (what every child runs)

    reports.write("ready\n")
    reports.flush()
    pending, children = b"", 0
    while True:
        readable, _, _ = select.select([0], [], [], _REAP_POLL_S if children else None)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # the process that started it is gone
            pending += chunk
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    reports.close()  # the zygote's alone: its reader must see it end with the zygote
                    _child(json.loads(line))  # never returns
                children += 1
                reports.write(json.dumps({"forked": pid}) + "\n")
                reports.flush()
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children -= 1
            reports.write(json.dumps({"ended": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n")
            reports.flush()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become ``python -m safepoint.testing.child`` in the request's
    environment, its output in the request's files; exit as that process would."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(request["cwd"])
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        from safepoint._engine import crashpoints
        from safepoint.testing.child import main

        crashpoints.arm(env.get("SAFEPOINT_CRASH_AT"), env.get("SAFEPOINT_CRASH_MODE", "kill"))
        sys.argv = ["safepoint.testing.child", *request["argv"]]
        try:
            code = main(request["argv"])
        except SystemExit as exc:  # argparse, or the workflow's own
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        for thread in threading.enumerate():  # as an interpreter ends: its threads, then atexit
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
