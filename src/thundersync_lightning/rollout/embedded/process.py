"""One generation process of the embedded engine and its two channels (learner side).

- commands, learner -> process: a ``multiprocessing`` queue (its feeder thread never blocks the
  learner, whatever the process is doing);
- events, process -> learner: a one-way pipe whose write end only the process holds. When the
  process dies, reading returns end-of-file at once (also in the middle of a message cut short by
  the kill), so a dead process is noticed without polling and never leaves the reader blocked.
  Messages the process queued together arrive as one batch (:class:`EventReader` hands them out
  one at a time): fewer wake-ups of the learner's event thread, which holds the GIL while it reads.

:meth:`GenerationProcess.stop` leaves nothing behind: the process is asked to exit, then
terminated, then killed, and reaped; the pipe, the queue (its feeder thread and its named
semaphores in ``/dev/shm``) and the process sentinel are closed and dropped, and so are the
file descriptors of weight snapshots it never took (see :meth:`GenerationProcess.send_publish`).
The process is
started by :func:`~thundersync_lightning.rollout.lifeline.start_process`, so it also dies with
the learner (``PR_SET_PDEATHSIG`` plus a parent watchdog in the child).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import deque
from multiprocessing import resource_sharer
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch.multiprocessing as mp

from ...core.errors import EngineError
from ...core.protocols import TaskSource
from ...core.types import ModelSpec
from ..lifeline import start_process
from .worker import worker_main

__all__ = ["EventReader", "GenerationProcess", "ProcessGone"]

_PICKLE_LOCK = threading.Lock()

_START_HINT = (
    "check that the ModelSpec and the task source can be built and pickled, and that the launching "
    'script runs its training under `if __name__ == "__main__":` (the fork server or the spawned '
    "process that starts it imports the main module)."
)


class ProcessGone(Exception):
    """The generation process has exited (its event pipe reached end-of-file)."""


class EventReader:
    """The learner's end of the event pipe. The process sends messages queued together as one
    ``("batch", [...])`` (:func:`~thundersync_lightning.rollout.embedded.worker.take_batch`); they are
    handed out one at a time, in order, each before anything read later."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._pending: deque[tuple[Any, ...]] = deque()  # the rest of a batch

    def receive(self, timeout_s: float) -> tuple[Any, ...] | None:
        """The next message, or None after ``timeout_s``; :class:`ProcessGone` at end-of-file (once
        the messages already read are handed out)."""
        if self._pending:
            return self._pending.popleft()
        try:
            if not self._conn.poll(timeout_s):
                return None
            msg = self._conn.recv()
        except (EOFError, OSError):  # OSError: closed by stop() meanwhile
            raise ProcessGone from None
        if msg[0] != "batch":
            return msg
        self._pending.extend(msg[1][1:])
        return msg[1][0]

    def close(self) -> None:
        """Close the pipe; never raises."""
        try:
            self._conn.close()
        except OSError:
            pass


class GenerationProcess:
    """A started generation process; see the module docstring.

    Raises :class:`EngineError` if the arguments cannot be sent to the process.
    """

    def __init__(self, model_spec: ModelSpec, tasks: TaskSource, config: Any) -> None:
        ctx = _context(config.start_method, model_spec)
        self._unfetched: dict[int, set[Any]] = {}  # version -> fd-sharer keys not yet fetched
        self.commands: Any = ctx.Queue()
        reader, writer = ctx.Pipe(duplex=False)
        self._reader: EventReader | None = EventReader(reader)
        self.process: Any = ctx.Process(
            target=worker_main,
            args=(model_spec, tasks, config, self.commands, writer, os.getpid(), dict(os.environ)),
            name="thundersync-embedded-engine",
            daemon=True,
        )
        try:
            start_process(self.process)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            writer.close()
            self.stop()
            raise EngineError(
                f"cannot send the task source or ModelSpec to the generation process ({exc}); define "
                "task classes at module level (importable by name) and keep their fields picklable."
            ) from exc
        writer.close()  # the process holds the only write end: its death is end-of-file here
        self.pid: int | None = self.process.pid

    def send(self, command: tuple[Any, ...]) -> None:
        """Queue a command (never blocks; a dead process simply never reads it)."""
        self.commands.put(command)

    def send_publish(self, version: int, packed: Any) -> None:
        """Queue ``("publish", version, packed)``, pickled here rather than by the queue's thread.

        Pickling a shared-memory tensor outside ``Process.start`` parks a duplicate of its file
        descriptor in multiprocessing's fd sharer until the receiver fetches it. A process killed
        before it read the publish would leave that descriptor (and the snapshot's memory) there
        for the learner's lifetime, so the keys registered while pickling are remembered until
        the process reports the version applied, and discarded by :meth:`stop` otherwise.
        """
        with _PICKLE_LOCK:  # keys registered meanwhile are this snapshot's
            before = _sharer_keys()
            data = bytes(ForkingPickler.dumps(("publish", version, packed)))
            self._unfetched[version] = _sharer_keys() - before
        self.commands.put(("pickled", data))

    def applied(self, version: int) -> None:
        """The process loaded ``version``: it fetched every snapshot up to it."""
        for v in [v for v in self._unfetched if v <= version]:
            del self._unfetched[v]

    def receive(self, timeout_s: float) -> tuple[Any, ...] | None:
        """The next message, or None after ``timeout_s``; raises :class:`ProcessGone` at end-of-file."""
        reader = self._reader
        if reader is None:  # stopped (by another thread)
            raise ProcessGone
        return reader.receive(timeout_s)

    @property
    def exitcode(self) -> int | None:
        """Exit code once reaped (waits up to 1 s for a process that has just died)."""
        if self.process is None:
            return None
        try:
            self.process.join(timeout=1.0)
            return self.process.exitcode
        except (ValueError, AssertionError):
            return None

    def await_ready(self, timeout_s: float, poll_s: float) -> None:
        """Wait for the process's ``ready`` message; raise :class:`EngineError` with the cause."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                msg = self.receive(poll_s)
            except ProcessGone:
                raise EngineError(
                    f"the generation process exited during start-up (exit code {self.exitcode}); "
                    + _START_HINT
                ) from None
            if msg is None:
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"the generation process was not ready after startup_timeout_s={timeout_s:g} s; "
                        "raise it if imports are slow on this machine."
                    )
                continue
            if msg[0] == "ready":
                return
            if msg[0] == "fatal":
                raise EngineError(f"the generation process failed during start-up:\n{msg[1]}")

    def stop(self) -> None:
        """Stop and reap the process, close every channel. Idempotent; never raises."""
        process, commands, reader = self.process, self.commands, self._reader
        if process is None:
            return
        self.process = self.commands = self._reader = None
        try:
            if process.is_alive():
                try:
                    commands.put(("shutdown",))
                except (ValueError, OSError):
                    pass
                process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=2.0)
            process.close()  # releases its sentinel fd
        except (ValueError, AssertionError):  # never started, or still running after kill
            pass
        _close_unread(commands)
        reader.close()
        for keys in self._unfetched.values():
            _discard_shared(keys)
        self._unfetched.clear()


def _close_unread(commands: Any) -> None:
    """Close a command queue whose reader process is gone, and wait for its feeder thread.

    The queue's feeder thread holds two of its named semaphores (``/dev/shm/sem.mp-*``) until it
    exits, and it exits only after writing every buffered command into the pipe. With the reader
    dead, a command larger than the pipe buffer (a publish of many tensors) would block that write
    forever, and the semaphores would stay for the learner's lifetime: drain the pipe from this
    side until the thread is done. Uses the queue's private ``_reader``/``_thread`` (CPython's
    ``multiprocessing.queues.Queue``); where they are missing it only closes the queue.
    """
    reader, thread = getattr(commands, "_reader", None), getattr(commands, "_thread", None)
    try:
        commands.close()
    except (ValueError, OSError):
        return
    while reader is not None and thread is not None and thread.is_alive():
        try:
            if reader.poll(0.05):
                reader.recv_bytes()
        except (OSError, EOFError, TypeError):  # the feeder closed its ends (TypeError: the reader's
            break  # handle was closed under this read by the exiting feeder): it is exiting
    if thread is not None:
        thread.join(timeout=5.0)


def _context(method: str, model_spec: ModelSpec) -> Any:
    """The multiprocessing context of ``method``; for ``forkserver``, with the modules its server
    imports once before forking (a server already running keeps the list it started with; a
    module that does not import is skipped by the server)."""
    ctx = mp.get_context(method)
    if method == "forkserver":
        kind = model_spec.model_type
        ctx.set_forkserver_preload(
            [
                "__main__",
                "thundersync_lightning.rollout.embedded.worker",
                f"transformers.models.{kind}.modeling_{kind}",
            ]
        )
    return ctx


def _sharer_keys() -> set[Any]:
    cache = getattr(getattr(resource_sharer, "_resource_sharer", None), "_cache", None)
    return set(cache) if isinstance(cache, dict) else set()


def _discard_shared(keys: set[Any]) -> None:
    """Close the parked descriptors of ``keys`` that no process fetched (fetched ones are gone)."""
    sharer = getattr(resource_sharer, "_resource_sharer", None)
    cache, lock = getattr(sharer, "_cache", None), getattr(sharer, "_lock", None)
    if not isinstance(cache, dict) or lock is None:
        return
    for key in keys:
        with lock:
            entry = cache.pop(key, None)
        if entry is not None:
            try:
                entry[1]()  # close
            except OSError:
                pass
