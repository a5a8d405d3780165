"""Python tool and reward calls in worker processes, each with a deadline past which its process is killed.

A user's tool or reward function is untrusted: it may sleep, loop, wait on a socket, or run
whatever the model's arguments reach (a calculator's ``eval`` opens ``os.popen`` through
``().__class__.__base__.__subclasses__()``). A thread can be neither stopped nor confined, so
every call runs in a separate interpreter (:mod:`.worker_main`), confined as agent code is
(:mod:`.confine`: a uid of its own, no network, read-only host, empty environment, memory /
process / file-size limits; :class:`~.confine.WorkerLimits`), and the caller waits on its pipe
for at most ``timeout_s``. Past it the worker and everything it started are killed and the call
resolves as a timeout; a worker that dies mid-call resolves as an error. Nothing here raises for
what the function does: every call gives a :class:`ToolOutcome` (or, for a reward, its reply).

Scopes: a worker keeps the user's module, and whatever a call changed in it, for its next call,
so a pool is never shared between parties that must not see each other's changes. An episode's
tools get a pool of their own (``ToolWorkers(limits, max_idle=1)``, closed with the episode:
:meth:`ToolWorkers.close` kills its workers, running calls included). Rewards run in
:func:`reward_workers`, a pool per process that no tool call ever reaches; a reward worker is
reused across trajectories (rewards are the user's code run on completions, never on the
model's tool arguments). Workers are reused within their pool (one call at a time each; by
default every worker started is kept when idle, so a pool holds as many as the most calls that
ran at once), so a call costs a pipe round trip once its worker runs: a fresh interpreter per
call costs ~0.1 CPU-second, which at 64 rewards a step was most of a small model's step. Workers
die with the process that started them (``PR_SET_PDEATHSIG``, bwrap's ``--die-with-parent``, the
end of stdin).
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..sandbox.base import wait_readable
from .confine import Worker, WorkerLimits, caller_paths, start_worker

__all__ = ["ToolOutcome", "ToolWorkers", "reward_workers", "worker_path"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a call gave: its text, or ``error`` (why there is none); ``timed_out`` when killed."""

    text: str
    error: str | None = None
    timed_out: bool = False


class _Gone(Exception):
    """The worker closed its pipe or the deadline passed."""


class ToolWorkers:
    """A pool of worker processes confined by ``limits`` (thread-safe; see the module docstring)."""

    def __init__(self, max_idle: int | None = None, limits: WorkerLimits | None = None) -> None:
        # None: keep every idle worker; their number never exceeds the peak of concurrent calls
        # (bounded by the calling threads, the engine's ``env_workers``)
        self.max_idle = max_idle
        self.limits = limits if limits is not None else WorkerLimits()
        self._idle: list[Worker] = []
        self._workers: dict[int, Worker] = {}  # every worker started and not yet stopped
        self._busy: set[int] = set()  # those running a call: only the calling thread uses their pipes
        self._closed = False
        self._lock = threading.Lock()

    def call(
        self, path: str, arguments: Mapping[str, Any], timeout_s: float, max_chars: int = 65536
    ) -> ToolOutcome:
        """Run ``module:function(**arguments)`` in a worker; wait at most ``timeout_s`` seconds."""
        got = self.exchange(path, (), arguments, timeout_s, max_chars)
        if isinstance(got, ToolOutcome):
            return got
        status, text = got
        if status == "ok" and isinstance(text, str):
            return ToolOutcome(text)
        return ToolOutcome("", f"{path.rpartition(':')[2]} raised {text}")

    def exchange(
        self,
        path: str,
        positional: tuple[Any, ...],
        arguments: Mapping[str, Any],
        timeout_s: float,
        max_chars: int | None,
    ) -> tuple[str, Any] | ToolOutcome:
        """``module:function(*positional, **arguments)`` in a worker: its (status, payload) reply
        ("ok" and the text, or with ``max_chars`` None the value as plain JSON data; "error" and
        what it raised; "value" and why its value is not plain data), or the :class:`ToolOutcome`
        of a call that never answered. The reply is parsed as JSON, never unpickled. HostFault
        when no worker can be started (the host, not the call, failed)."""
        name = path.rpartition(":")[2]
        paths = caller_paths()
        try:
            request = _frame((path, dict(arguments), max_chars, tuple(positional), list(paths)))
        except Exception as exc:  # noqa: BLE001 - arguments come from the model's JSON: always picklable
            return ToolOutcome("", f"{name}: arguments cannot be sent to the tool ({exc})")
        worker = self._take(paths)
        if worker is None:
            return ToolOutcome("", f"{name}: not run, its episode's tools were closed")
        proc = worker.proc
        deadline = time.monotonic() + timeout_s
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(request)
            proc.stdin.flush()
            status, text = _read_frame(proc.stdout.fileno(), deadline)
        except (_Gone, OSError, EOFError, ValueError):  # ValueError: json's decode error too
            timed_out = time.monotonic() >= deadline
            code = self._stop(worker)
            if timed_out:
                return ToolOutcome("", f"{name} did not return within {timeout_s:g} s and was stopped", True)
            return ToolOutcome("", f"{name}: its worker process exited (code {code}) before answering")
        self._give_back(worker)
        return status, text

    def close(self) -> None:
        """Stop every worker, idle or running a call (that call resolves as an error), and refuse
        further calls. Idempotent."""
        with self._lock:
            self._closed = True
            self._idle = []
            busy = [w for k, w in self._workers.items() if k in self._busy]
            idle = [w for k, w in self._workers.items() if k not in self._busy]
        for worker in busy:  # its calling thread sees the pipe end and stops it
            worker.kill()
        for worker in idle:
            self._stop(worker)

    def _take(self, paths: tuple[str, ...]) -> Worker | None:
        stale = []
        with self._lock:
            if self._closed:
                return None
            found = None
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None and worker.paths.issuperset(paths):
                    found = worker
                    self._busy.add(id(worker))
                    break
                stale.append(worker)  # dead, or started before a directory the call needs was on sys.path
        for worker in stale:
            self._stop(worker)
        if found is not None:
            return found
        worker = start_worker(self.limits, paths)
        with self._lock:
            closed = self._closed
            if not closed:
                self._workers[id(worker)] = worker
                self._busy.add(id(worker))
        if closed:  # closed while it started
            worker.stop()
            return None
        return worker

    def _give_back(self, worker: Worker) -> None:
        with self._lock:
            self._busy.discard(id(worker))
            if not self._closed and (self.max_idle is None or len(self._idle) < self.max_idle):
                self._idle.append(worker)
                return
        self._stop(worker)

    def _stop(self, worker: Worker) -> int | None:
        with self._lock:
            self._busy.discard(id(worker))
            if self._workers.pop(id(worker), None) is None:
                return worker.proc.returncode  # stopped already
        return worker.stop()


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return struct.pack(">I", len(data)) + data


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not wait_readable([fd], remaining):  # poll(2): any fd number (select: < 1024)
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


_pools: dict[tuple[int, WorkerLimits], ToolWorkers] = {}
_pools_lock = threading.Lock()


def reward_workers(limits: WorkerLimits | None = None) -> ToolWorkers:
    """This process's pool for reward calls under ``limits`` (default: :class:`WorkerLimits`()),
    created on first use and closed at exit: no tool call ever runs in one of its workers."""
    key = (os.getpid(), limits if limits is not None else WorkerLimits())
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ToolWorkers(limits=key[1])
            atexit.register(pool.close)
        return pool
