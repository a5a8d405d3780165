"""Child processes die with the learner, even when it is SIGKILLed (the OOM killer, a scheduler).

A learner killed by SIGKILL runs no ``finally``, no ``atexit`` and no finalizer: without help its
engine process keeps generating (holding its memory and a core) until it notices, if ever. Two
mechanisms, both on the child's side:

- ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux): the kernel kills the child the moment its parent
  goes. The kernel's "parent" is the *thread* that started the child, so :func:`start_process`
  starts children from one long-lived daemon thread (never from a short-lived pump or worker
  thread, whose exit would kill the child).
- a watchdog thread (every ``poll_s``) that exits once the learner is gone: the parent changed
  (reparenting) or the learner's pid no longer exists, for platforms without ``prctl`` and as a
  second line of defence.

The learner is the child's parent under the ``spawn`` start method. Under ``forkserver`` the
parent is multiprocessing's fork server, which exits when the learner does (its end of the
server's "alive" pipe closes, SIGKILL included), so the signal still fires and the learner's pid
is checked directly as well.

:func:`die_with_parent` must be the first thing a child's entry function does; it checks the
learner right after arming the signal, which closes the race of a learner that died while the
child was still starting (the signal only fires for deaths after ``prctl``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import select
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = [
    "arm_parent_death_signal",
    "die_with_parent",
    "parent_death_signal_armed",
    "process_exists",
    "start_process",
    "wait_for_exit",
]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2


def _libc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def arm_parent_death_signal() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` for this process; False where unsupported.

    The setting survives ``execve`` (except of set-user-ID binaries) but not a credential change;
    for a command that drops privileges, arm it on the first process of the chain (or prefix the
    command with util-linux ``setpriv --pdeathsig KILL``).
    """
    libc = _libc()
    if libc is None:
        return False
    return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def parent_death_signal_armed() -> bool:
    """Whether this process is set to receive SIGKILL when its parent dies (Linux only)."""
    libc = _libc()
    if libc is None:
        return False
    value = ctypes.c_int(0)
    if libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0) != 0:
        return False
    return value.value == signal.SIGKILL


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def wait_for_exit(pid: int, poll_s: float = 0.5) -> None:
    """Block until process ``pid`` has exited (a zombie counts as exited); returns at once if it has.

    Waits on a pidfd (Linux >= 5.3), which becomes readable when the process exits, whoever its
    parent is; elsewhere checks every ``poll_s`` that the pid still exists.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd on this platform or kernel
        stop = threading.Event()
        while process_exists(pid):
            stop.wait(poll_s)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def die_with_parent(learner_pid: int, poll_s: float = 0.5) -> Callable[[], bool]:
    """Make this process exit as soon as the learner ``learner_pid`` is gone.

    Call first in a child's entry function with the pid the learner passed in. Exits at once
    (``os._exit``) if the learner is already gone. Returns the check the watchdog makes (True
    while the learner lives), for a child's own loop to poll too.
    """
    arm_parent_death_signal()
    parent = os.getppid()  # the learner (spawn) or the fork server (forkserver)

    def learner_alive() -> bool:
        return os.getppid() == parent and (parent == learner_pid or process_exists(learner_pid))

    if not learner_alive():  # the learner died before the signal was armed
        os._exit(1)

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if not learner_alive():
                os._exit(1)

    threading.Thread(target=watch, name="thundersync-parent-watchdog", daemon=True).start()
    return learner_alive


class _Launcher:
    """One daemon thread that runs every ``Process.start()`` of this process (see the module doc)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="thundersync-launcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def call(self, fn: Callable[[], Any]) -> Any:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future.result()


_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()


def start_process(process: Any) -> None:
    """``process.start()`` from the launcher thread, which lives as long as this interpreter.

    Re-raises whatever ``start`` raises (e.g. a pickling error of the child's arguments).
    """
    global _launcher
    with _launcher_lock:
        if _launcher is None or not _launcher._thread.is_alive():
            _launcher = _Launcher()
        launcher = _launcher
    launcher.call(process.start)
