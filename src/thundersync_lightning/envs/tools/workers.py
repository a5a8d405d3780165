"""Python tool calls in worker processes, each with a deadline past which its process is killed.

A user's tool function is untrusted for time: it may sleep, loop or wait on a socket. A thread
cannot be stopped, so every call runs in a separate interpreter (:mod:`.worker_main`, started
with ``subprocess`` in its own session) and the caller waits on its pipe for at most
``timeout_s``. Past it the worker's whole process group is killed (SIGKILL: the tool's own
children too) and the call resolves as a timeout; a worker that dies mid-call resolves as an
error. Nothing here raises for what the tool does: every call gives a :class:`ToolOutcome`.

Workers are reused (one call at a time each; by default every worker started is kept when idle,
so the pool holds as many as the most calls that ran at once), so the cost of a call is a pipe
round trip once the worker runs: a fresh interpreter per call costs ~0.1 CPU-second, which at
64 rewards a step was most of a small model's step. Each process that runs tools (the engine's)
has its own :func:`tool_workers`; workers die with it (``PR_SET_PDEATHSIG`` and end of stdin).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolOutcome", "ToolWorkers", "tool_workers", "reward_workers", "worker_path"]

_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_main.py")


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a call gave: its text, or ``error`` (why there is none); ``timed_out`` when killed."""

    text: str
    error: str | None = None
    timed_out: bool = False


class _Gone(Exception):
    """The worker closed its pipe or the deadline passed."""


class ToolWorkers:
    """A pool of tool worker processes (thread-safe; see the module docstring)."""

    def __init__(self, max_idle: int | None = None) -> None:
        # None: keep every idle worker; their number never exceeds the peak of concurrent calls
        # (bounded by the calling threads, the engine's ``env_workers``)
        self.max_idle = max_idle
        self._idle: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def call(self, path: str, arguments: Mapping[str, Any], timeout_s: float, max_chars: int = 65536) -> ToolOutcome:
        """Run ``module:function(**arguments)`` in a worker; wait at most ``timeout_s`` seconds."""
        got = self.exchange(path, (), arguments, timeout_s, max_chars)
        if isinstance(got, ToolOutcome):
            return got
        status, text = got
        if status == "ok" and isinstance(text, str):
            return ToolOutcome(text)
        return ToolOutcome("", f"{path.rpartition(':')[2]} raised {text}")

    def exchange(self, path: str, positional: tuple[Any, ...], arguments: Mapping[str, Any], timeout_s: float,
                 max_chars: int | None) -> tuple[str, Any] | ToolOutcome:
        """``module:function(*positional, **arguments)`` in a worker: its (status, payload) reply
        ("ok" and the text, or with ``max_chars`` None the value as plain JSON data; "error" and
        what it raised; "value" and why its value is not plain data), or the :class:`ToolOutcome`
        of a call that never answered. The reply is parsed as JSON, never unpickled."""
        name = path.rpartition(":")[2]
        try:
            request = _frame((path, dict(arguments), max_chars, tuple(positional),
                              [p for p in sys.path if isinstance(p, str)]))
        except Exception as exc:  # noqa: BLE001 - arguments come from the model's JSON: always picklable
            return ToolOutcome("", f"{name}: arguments cannot be sent to the tool ({exc})")
        proc = self._take()
        deadline = time.monotonic() + timeout_s
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(request)
            proc.stdin.flush()
            status, text = _read_frame(proc.stdout.fileno(), deadline)
        except (_Gone, OSError, EOFError, ValueError):  # ValueError: json's decode error too
            timed_out = time.monotonic() >= deadline
            code = _kill(proc)
            if timed_out:
                return ToolOutcome("", f"{name} did not return within {timeout_s:g} s and was stopped", True)
            return ToolOutcome("", f"{name}: its worker process exited (code {code}) before answering")
        self._give_back(proc)
        return status, text

    def close(self) -> None:
        """Stop every idle worker (running calls end by their deadline)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for proc in idle:
            _kill(proc)

    def _take(self) -> subprocess.Popen[bytes]:
        with self._lock:
            while self._idle:
                proc = self._idle.pop()
                if proc.poll() is None:
                    return proc
        proc = subprocess.Popen([sys.executable, "-u", _MAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                start_new_session=True)
        return proc

    def _give_back(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            if self.max_idle is None or len(self._idle) < self.max_idle:
                self._idle.append(proc)
                return
        _kill(proc)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return struct.pack(">I", len(data)) + data


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise _Gone
        chunk = os.read(fd, size - got)
        if not chunk:
            raise _Gone
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


_MAX_REPLY = 64 << 20  # a reply's length field is the worker's word: bound what the parent reads


def _read_frame(fd: int, deadline: float) -> tuple[str, Any]:
    (size,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if size > _MAX_REPLY:
        raise ValueError(f"a worker's reply of {size} bytes")
    reply = json.loads(_read_exact(fd, size, deadline))
    if not (isinstance(reply, list) and len(reply) == 2 and reply[0] in ("ok", "error", "value")):
        raise ValueError("a malformed worker reply")
    status, payload = reply
    return status, (payload if status == "ok" else str(payload))


def _kill(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGKILL the worker's process group (the tool's children too); its exit code."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        return proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        return None


def worker_path(fn: Any) -> str | None:
    """``module:name`` by which a worker imports exactly ``fn``, or None where none does.

    The name is looked up by identity in ``fn``'s module: a ``functools.wraps`` wrapper carries
    the wrapped function's ``__qualname__``, so importing by that name would run a different
    function; a wrapper bound to another name at module level is found under that name. A
    lambda, a closure, a method or anything defined in ``__main__`` has no such name."""
    module_name = getattr(fn, "__module__", None)
    if not isinstance(module_name, str) or not module_name or module_name == "__main__":
        return None
    module = sys.modules.get(module_name)
    if module is None:
        return None
    qualname = getattr(fn, "__qualname__", "")
    if isinstance(qualname, str) and qualname.isidentifier() and getattr(module, qualname, None) is fn:
        return f"{module_name}:{qualname}"
    for name, value in vars(module).items():
        if value is fn and name.isidentifier():
            return f"{module_name}:{name}"
    return None


_pools: dict[tuple[int, str], ToolWorkers] = {}
_pools_lock = threading.Lock()


def _pool(kind: str) -> ToolWorkers:
    key = (os.getpid(), kind)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ToolWorkers()
            atexit.register(pool.close)
        return pool


def tool_workers() -> ToolWorkers:
    """This process's pool for tool calls (created on first use; closed at exit)."""
    return _pool("tools")


def reward_workers() -> ToolWorkers:
    """This process's pool for reward calls: no tool call ever runs in one of its workers."""
    return _pool("rewards")
